"""Evals: per adapter, candidate vs prod vs base side by side for every suite and metric
(train.eval_result; the bare base's numbers are in the candidate's eval_summary, written by the
evaluator), with the gate's blockers (serve.promotion_blockers, the reasons behind
serve.can_promote)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.adapters import service as adapters
from app.adapters.schemas import AdapterOut
from app.dashboard.layout import PoolDep, login_page, not_found, page, reader, tenant

router = APIRouter(include_in_schema=False)

ACTIVE = "/dashboard/evals"
DEFAULT_RULE = "default rule: higher is better, 2 %"


def _against(
    conn: Any, *, status: str, previous_prod_id: str | None, tenant_id: int, route: str
) -> tuple[str | None, str]:
    """The adapter the gate compares with: the route's prod, or for the prod the one it replaced."""
    if status == "prod":
        return previous_prod_id, "previous prod"
    prod = adapters.current_prod(conn, tenant_id=tenant_id, route=route)
    return prod, "prod"


def _base_scores(adapter: AdapterOut) -> dict[tuple[str, str], Any]:
    """(suite, metric) -> the bare base's score, from the evaluator's summary."""
    summary = adapter.eval_summary or {}
    base = (summary.get("results") or {}).get("base") or {}
    out: dict[tuple[str, str], Any] = {}
    for suite, metrics in base.items():
        for metric, value in (metrics or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[(suite, metric)] = value
    return out


def _rules(conn: Any, adapter: AdapterOut) -> dict[tuple[str, str], str]:
    """(suite, metric) -> the gate's rule for it, as text (the route's rule over the global)."""
    snap = adapter.dataset_snapshot_id
    out: dict[tuple[str, str], str] = {}
    # Global rules first, so the route's own replace them.
    for r in adapters.get_policy(conn, tenant_id=adapter.tenant_id, route=adapter.route):
        if r.route not in (None, adapter.route):
            continue
        suite = f"heldout:{snap}" if r.suite_id == "heldout:snapshot" and snap else r.suite_id
        out[(suite, r.metric)] = (
            "ignored"
            if r.direction == "ignore"
            else f"{r.direction} is better, {100 * (r.tolerance or 0):g} %"
            + (", required" if r.required else "")
        )
    return out


@router.get("/dashboard/evals")
def evals_page(request: Request, pool: PoolDep) -> Response:
    """Adapters with eval results, newest first, and whether the gate lets each replace its prod."""
    key = reader(request, pool)
    if key is None:
        return login_page(request)
    with tenant(key, pool) as conn:
        rows = conn.execute(
            "SELECT a.id, a.tenant_id, a.route, a.status, a.created_at, a.previous_prod_id,"
            " count(r.*) AS n"
            "  FROM serve.adapter a JOIN train.eval_result_counted r ON r.adapter_id = a.id"
            " GROUP BY a.id ORDER BY a.created_at DESC, a.id LIMIT 100"
        ).fetchall()
        items = []
        for a in rows:
            current, _ = _against(
                conn,
                status=a["status"],
                previous_prod_id=a["previous_prod_id"],
                tenant_id=a["tenant_id"],
                route=a["route"],
            )
            found = adapters.blockers(conn, candidate=a["id"], current=current)
            items.append((a, current, found))
    return page(request, "evals.html", title="evals", active=ACTIVE, items=items)


@router.get("/dashboard/evals/{adapter_id}")
def adapter_evals_page(adapter_id: str, request: Request, pool: PoolDep) -> Response:
    """Candidate, prod and base per suite and metric, and the gate's blockers."""
    key = reader(request, pool)
    if key is None:
        return login_page(request)
    with tenant(key, pool) as conn:
        adapter = adapters.get_adapter(conn, adapter_id=adapter_id)
        if adapter is None:
            return not_found(request, f"adapter {adapter_id}", ACTIVE)
        current, role = _against(
            conn,
            status=adapter.status,
            previous_prod_id=adapter.previous_prod_id,
            tenant_id=adapter.tenant_id,
            route=adapter.route,
        )
        found = adapters.blockers(conn, candidate=adapter_id, current=current)
        rules = _rules(conn, adapter)
        results = conn.execute(
            "SELECT adapter_id, suite_id, metric, score, judge_model, author_role, judged_at"
            "  FROM train.eval_result_counted WHERE adapter_id = ANY (%s)"
            " ORDER BY suite_id, metric",
            ([adapter_id] + ([current] if current else []),),
        ).fetchall()
    cand = {(r["suite_id"], r["metric"]): r for r in results if r["adapter_id"] == adapter_id}
    prod = {(r["suite_id"], r["metric"]): r for r in results if r["adapter_id"] == current}
    base = _base_scores(adapter)
    why: dict[tuple[str, str], list[str]] = {}
    general = []
    for b in found:
        if b.suite_id is None or b.metric is None:
            general.append(b.reason)
        else:
            why.setdefault((b.suite_id, b.metric), []).append(b.reason)
    keys = sorted(set(cand) | set(prod) | {k for k in why if k[0]})

    rows = []
    for k in keys:
        c, p = cand.get(k), prod.get(k)
        diff = (
            c["score"] - p["score"]
            if c and p and c["score"] is not None and p["score"] is not None
            else None
        )
        rows.append(
            {
                "suite": k[0],
                "metric": k[1],
                "rule": rules.get(k, DEFAULT_RULE),
                "base": base.get(k),
                "prod": p,
                "candidate": c,
                "diff": diff,
                "why": why.get(k, []),
            }
        )
    return page(
        request,
        "adapter_evals.html",
        title=f"evals {adapter_id}",
        active=ACTIVE,
        adapter=adapter,
        current=current,
        role=role,
        found=found,
        general=general,
        rows=rows,
    )
