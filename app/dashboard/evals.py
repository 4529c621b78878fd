"""Evals: per adapter, candidate vs prod vs base side by side for every suite and metric
(train.eval_result; the bare base's numbers are in the candidate's eval_summary, written by the
evaluator), with the gate's blockers (serve.promotion_blockers, the reasons behind
serve.can_promote)."""

from __future__ import annotations

from html import escape
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.adapters import service as adapters
from app.dashboard.layout import (
    PoolDep,
    link,
    login_page,
    not_found,
    num,
    page,
    pill,
    reader,
    tenant,
    when,
)

router = APIRouter(include_in_schema=False)

ACTIVE = "/dashboard/evals"
DEFAULT_RULE = "default rule: higher is better, 2 %"


def _against(conn: Any, adapter: dict[str, Any]) -> tuple[str | None, str]:
    """The adapter the gate compares with: the route's prod, or for the prod the one it replaced."""
    if adapter["status"] == "prod":
        return adapter["previous_prod_id"], "previous prod"
    return adapters.current_prod(conn, route=adapter["route"]), "prod"


def _base_scores(adapter: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """(suite, metric) -> the bare base's score, from the evaluator's summary."""
    summary = adapter.get("eval_summary") or {}
    base = (summary.get("results") or {}).get("base") or {}
    out: dict[tuple[str, str], Any] = {}
    for suite, metrics in base.items():
        for metric, value in (metrics or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[(suite, metric)] = value
    return out


def _rules(conn: Any, adapter: dict[str, Any]) -> dict[tuple[str, str], str]:
    """(suite, metric) -> the gate's rule for it, as text (the route's rule over the global)."""
    snap = adapter.get("dataset_snapshot_id")
    out: dict[tuple[str, str], str] = {}
    # Global rules first, so the route's own replace them.
    for r in adapters.get_policy(conn, route=adapter["route"]):
        if r["route"] not in (None, adapter["route"]):
            continue
        suite = f"heldout:{snap}" if r["suite_id"] == "heldout:snapshot" and snap else r["suite_id"]
        tol = r["tolerance"]
        out[(suite, r["metric"])] = (
            "ignored"
            if r["direction"] == "ignore"
            else f"{r['direction']} is better, {100 * (tol or 0):g} %"
            + (", required" if r["required"] else "")
        )
    return out


@router.get("/dashboard/evals")
def evals_page(request: Request, pool: PoolDep) -> Response:
    """Adapters with eval results, newest first, and whether the gate lets each replace its prod."""
    key = reader(request, pool)
    if key is None:
        return login_page()
    with tenant(key, pool) as conn:
        rows = conn.execute(
            "SELECT a.id, a.route, a.status, a.created_at, a.previous_prod_id, count(r.*) AS n"
            "  FROM serve.adapter a JOIN train.eval_result r ON r.adapter_id = a.id"
            " GROUP BY a.id ORDER BY a.created_at DESC, a.id LIMIT 100"
        ).fetchall()
        items = []
        for a in rows:
            current, _ = _against(conn, a)
            found = adapters.blockers(conn, candidate=a["id"], current=current)
            items.append((a, current, found))
    trs = "".join(
        f'<tr class="adapter"><td>{link("/dashboard/evals", a["id"])}</td>'
        f"<td>{escape(a['route'])}</td><td>{pill(a['status'])}</td><td class=n>{a['n']}</td>"
        f"<td>{escape(current or '–')}</td><td>"
        + (
            f'<span class="blocker">blocked: {len(found)}</span>'
            if found
            else '<span class="ok">allowed</span>'
        )
        + f"</td><td>{when(a['created_at'])}</td></tr>"
        for a, current, found in items
    )
    body = (
        "<section><h2>Eval results by adapter</h2><table><tr><th>adapter</th><th>route</th>"
        "<th>status</th><th class=n>results</th><th>compared with</th><th>gate</th>"
        f"<th>created</th></tr>{trs or '<tr><td colspan=7>no eval results</td></tr>'}</table>"
        "</section>"
    )
    return page("evals", body, active=ACTIVE)


@router.get("/dashboard/evals/{adapter_id}")
def adapter_evals_page(adapter_id: str, request: Request, pool: PoolDep) -> Response:
    """Candidate, prod and base per suite and metric, and the gate's blockers."""
    key = reader(request, pool)
    if key is None:
        return login_page()
    with tenant(key, pool) as conn:
        adapter = adapters.get_adapter(conn, adapter_id=adapter_id)
        if adapter is None:
            return not_found(f"adapter {adapter_id}", ACTIVE)
        current, role = _against(conn, adapter)
        found = adapters.blockers(conn, candidate=adapter_id, current=current)
        rules = _rules(conn, adapter)
        results = conn.execute(
            "SELECT adapter_id, suite_id, metric, score, judge_model, author_role, judged_at"
            "  FROM train.eval_result WHERE adapter_id = ANY (%s) ORDER BY suite_id, metric",
            ([adapter_id] + ([current] if current else []),),
        ).fetchall()
    cand = {(r["suite_id"], r["metric"]): r for r in results if r["adapter_id"] == adapter_id}
    prod = {(r["suite_id"], r["metric"]): r for r in results if r["adapter_id"] == current}
    base = _base_scores(adapter)
    why: dict[tuple[str, str], list[str]] = {}
    general = []
    for b in found:
        if b["suite_id"] is None:
            general.append(b["reason"])
        else:
            why.setdefault((b["suite_id"], b["metric"]), []).append(b["reason"])
    keys = sorted(set(cand) | set(prod) | {k for k in why if k[0]})

    def score(r: dict[str, Any] | None) -> str:
        if r is None:
            return "–"
        return f"{num(r['score'], 4)} <span class=muted>{escape(r['author_role'])}</span>"

    rows = []
    for k in keys:
        c, p = cand.get(k), prod.get(k)
        diff = (
            num(c["score"] - p["score"], 4)
            if c and p and c["score"] is not None and p["score"] is not None
            else "–"
        )
        verdict = (
            "".join(f'<div class="blocker">{escape(w)}</div>' for w in why[k])
            if k in why
            else '<span class="ok">ok</span>'
        )
        rows.append(
            f'<tr class="metric"><td>{escape(k[0])}</td><td>{escape(k[1])}</td>'
            f"<td class=muted>{escape(rules.get(k, DEFAULT_RULE))}</td>"
            f"<td class=n>{num(base.get(k), 4)}</td><td class=n>{score(p)}</td>"
            f"<td class=n>{score(c)}</td><td class=n>{diff}</td><td>{verdict}</td></tr>"
        )
    gate = (
        '<p class="gate ok">the gate allows this adapter to replace '
        f"{escape(current or 'nothing (the route has no prod)')}</p>"
        if not found
        else f'<p class="gate blocker">the gate refuses: {len(found)} blocker(s)</p>'
    )
    general_html = "".join(f'<li class="blocker">{escape(g)}</li>' for g in general)
    body = (
        f"<section><h2>{escape(adapter_id)} {pill(adapter['status'])} on "
        f"{escape(adapter['route'])}</h2><p>compared with the {role}: "
        + (link("/dashboard/evals", current) if current else "none")
        + f" · {link('/dashboard/lineage', adapter_id, text='lineage')}</p>{gate}"
        + (f'<ul class="general">{general_html}</ul>' if general_html else "")
        + "</section><section><h2>Side by side</h2><table id=evals><tr><th>suite</th>"
        "<th>metric</th><th>rule</th><th class=n>base</th>"
        f"<th class=n>{role}</th><th class=n>candidate</th>"
        "<th class=n>candidate − "
        + role
        + "</th><th>gate</th></tr>"
        + ("".join(rows) or "<tr><td colspan=8>no eval results</td></tr>")
        + "</table></section>"
    )
    return page(f"evals {adapter_id}", body, active=ACTIVE)
