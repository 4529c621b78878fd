"""The overview page: routes, adapters and their status timeline, canaries, experiments,
automatic decisions, and each route's loop panel."""

from __future__ import annotations

from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.dashboard.layout import (
    STATUS_COLORS,
    PoolDep,
    link,
    login_page,
    num,
    page,
    pill,
    reader,
    tenant,
)
from app.experiments import service as experiments
from app.loop import service as loop

router = APIRouter(include_in_schema=False)

# The policy fields the loop panel shows first (the rest follow in the table's order).
LOOP_FIELDS_FIRST = (
    "enabled", "paused", "method", "min_new_examples", "canary_pct", "decision_metric",
    "decision_alpha", "decision_min_n", "watch_window",
)  # fmt: skip


def _timeline(adapters: list[dict[str, Any]], events: list[dict[str, Any]]) -> str:
    """One bar per adapter, coloured by status over time (from serve.adapter_event)."""
    if not events:
        return "<p>no events</p>"
    now = datetime.now(tz=events[0]["at"].tzinfo)
    t0 = min(e["at"] for e in events)
    span = max((now - t0).total_seconds(), 1.0)
    width, row_h, left = 900, 18, 220
    by_adapter: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_adapter.setdefault(e["adapter_id"], []).append(e)
    ids = [a["id"] for a in adapters if a["id"] in by_adapter]
    height = row_h * len(ids) + 24
    parts = [
        f'<svg class="chart" id="timeline" viewBox="0 0 {width} {height}" width="{width}"'
        f' height="{height}" data-series="{len(ids)}" data-points="{len(events)}">'
    ]
    for i, aid in enumerate(ids):
        y = i * row_h + 4
        parts.append(f'<text x="4" y="{y + 12}" class="tick">{escape(aid[:34])}</text>')
        evs = by_adapter[aid]
        for j, e in enumerate(evs):
            start = e["at"]
            end = evs[j + 1]["at"] if j + 1 < len(evs) else now
            x = left + (start - t0).total_seconds() / span * (width - left - 8)
            w = max((end - start).total_seconds() / span * (width - left - 8), 2)
            status = e["new_status"] or "?"
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 5}"'
                f' fill="{STATUS_COLORS.get(status, "#57606a")}">'
                f"<title>{escape(aid)}: {escape(status)} from {start:%Y-%m-%d %H:%M}"
                f"{' — ' + escape(e['reason']) if e['reason'] else ''}</title></rect>"
            )
    parts.append(
        f'<text x="{left}" y="{height - 4}" class="tick">{t0:%Y-%m-%d %H:%M}</text>'
        f'<text x="{width - 8}" y="{height - 4}" text-anchor="end" class="tick">now</text></svg>'
    )
    return "".join(parts)


def _numbers(value: Any, prefix: str = "", depth: int = 0) -> list[str]:
    """The scalar numbers of a decision's jsonb, flattened two levels deep ("metric.p_value")."""
    out: list[str] = []
    if isinstance(value, dict) and depth < 2:
        for k, v in value.items():
            out += _numbers(v, f"{prefix}{k}.", depth + 1)
    elif (isinstance(value, int | float) and not isinstance(value, bool)) or (
        isinstance(value, str) and prefix and len(value) < 60
    ):
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        out.append(f"{prefix[:-1]} = {shown}")
    return out


def _count(v: Any) -> str:
    """A trigger's value or threshold: whole numbers without decimals."""
    return f"{v:.0f}" if isinstance(v, float) and v.is_integer() else num(v)


def _loop_panel(conn: Any, route: str) -> str:
    """One route's loop: policy, triggers with their values, the current cycle, the history."""
    st = loop.status(conn, route=route)
    p = st["policy"]
    fields = [f for f in LOOP_FIELDS_FIRST if f in p] + [
        f for f in loop.POLICY_FIELDS if f in p and f not in LOOP_FIELDS_FIRST
    ]
    policy = "".join(f"<div><b>{escape(f)}</b> {_count(p[f])}</div>" for f in fields)
    switch = st["control"]
    stopped = (
        f'<p class="blocking">kill switch on: {escape(str(switch.get("reason")))}</p>'
        if switch.get("paused")
        else ""
    )
    trig = "".join(
        f'<tr class="trigger"><td>{escape(t["trigger"])}</td>'
        f'<td class="{"fired" if t["fired"] else ""}">{"fired" if t["fired"] else "no"}</td>'
        f"<td>{_count(t['value'])}</td><td>{_count(t['threshold'])}</td>"
        f"<td>{escape(t['line'])}</td></tr>"
        for t in st["triggers"]
    )
    blocking = "; ".join(escape(x["line"]) for x in st["limits"] if x["blocking"])
    cur = st["current_cycle"]
    current = (
        f'<p class="current">cycle {cur["id"]}: {pill(cur["state"])} '
        f"{escape(cur['waiting_for'] or '')}</p>"
        if cur
        else '<p class="current">no cycle in flight</p>'
    )
    rows = []
    for c in st["cycles"][:10]:
        full = loop.get_cycle(conn, cycle_id=int(c["id"])) or c
        numbers = _numbers(full.get("experiment")) + _numbers(full.get("watch"), "watch.")
        rows.append(
            f'<tr class="cycle"><td>{c["id"]}</td><td>{escape(str(c["created_at"])[:19])}</td>'
            f"<td>{escape(c['trigger'])}</td><td>{escape(c['method'] or '')}</td>"
            f"<td>{pill(c['state'])}</td><td>{escape(c['adapter_id'] or '')}</td>"
            f"<td>{escape(c['decision'] or '')} {escape(c['decision_code'] or '')}</td>"
            f"<td>{escape(c['decision_reason'] or c['error'] or '')}"
            f'<div class="numbers">{escape("; ".join(numbers))}</div></td></tr>'
        )
    return (
        f'<section class="loop" id="loop-{escape(route)}"><h2>Loop: {escape(route)}</h2>'
        f'{stopped}<div class="grid2 policy">{policy}</div>'
        "<h3>Triggers</h3><table><tr><th>trigger</th><th>fired</th><th>value</th>"
        f"<th>threshold</th><th>now</th></tr>{trig}</table>"
        + (f'<p class="blocking">held back: {blocking}</p>' if blocking else "")
        + f"<h3>Current cycle</h3>{current}"
        "<h3>History</h3><table><tr><th>cycle</th><th>started</th><th>trigger</th>"
        "<th>method</th><th>state</th><th>adapter</th><th>decision</th><th>why, numbers</th></tr>"
        f"{''.join(rows) or '<tr><td colspan=8>no cycles yet</td></tr>'}</table></section>"
    )


@router.get("/dashboard")
def overview(request: Request, pool: PoolDep) -> Response:
    """Routes, adapters and their status timeline, running canaries, experiments, decisions."""
    key = reader(request, pool)
    if key is None:
        return login_page()
    with tenant(key, pool) as conn:
        reg = experiments.registry(conn)
        exps = experiments.list_experiments(conn)
        decisions = experiments.decisions(conn, limit=20)
        loops = "".join(_loop_panel(conn, r["name"]) for r in reg["routes"])
    routes = "".join(
        f"<tr><td>{escape(r['name'])}</td><td>{escape(r['base_model'])}</td>"
        f"<td>{escape(r['experiment'])}</td></tr>"
        for r in reg["routes"]
    )
    adapters = "".join(
        f"<tr><td>{link('/dashboard/lineage', a['id'])}</td><td>{escape(a['route'])}</td>"
        f"<td>{pill(a['status'])}</td>"
        f"<td>{num(a['traffic_pct'], 1)} %</td><td>{escape(a['method'] or '')}</td></tr>"
        for a in reg["adapters"]
    )
    canaries = "".join(
        f"<li>{escape(a['id'])} on {escape(a['route'])}: {num(a['traffic_pct'], 1)} %</li>"
        for a in reg["adapters"]
        if a["status"] == "canary"
    )
    exp_rows = "".join(
        f'<tr><td><a href="/dashboard/experiments/{quote(e["name"], safe="")}">'
        f"{escape(e['name'])}</a></td><td>{escape(e['route'] or '')}</td><td>{e['n']}</td>"
        f"<td>{escape(', '.join(e['variants']))}</td><td>{'yes' if e['running'] else 'no'}</td>"
        f"<td>{e['last_at']:%Y-%m-%d %H:%M}</td></tr>"
        for e in exps
    )
    dec_rows = "".join(
        f"<tr><td>{d['decided_at']:%Y-%m-%d %H:%M}</td><td>{escape(d['route'])}</td>"
        f"<td>{escape(d['canary_id'])}</td><td>{escape(d['action'])}</td>"
        f"<td>{escape(d['reason'])}</td></tr>"
        for d in decisions
    )
    body = (
        "<section><h2>Routes</h2><table><tr><th>route</th><th>base model</th><th>experiment</th>"
        f"</tr>{routes}</table></section>"
        f"<section><h2>Running canaries</h2><ul>{canaries or '<li>none</li>'}</ul></section>"
        "<section><h2>Adapters</h2><table><tr><th>adapter</th><th>route</th><th>status</th>"
        f"<th>traffic</th><th>method</th></tr>{adapters}</table></section>"
        f"<section><h2>Status timeline</h2>{_timeline(reg['adapters'], reg['events'])}</section>"
        "<section><h2>Experiments</h2><table><tr><th>experiment</th><th>route</th><th>rows</th>"
        f"<th>variants</th><th>canary live</th><th>last traffic</th></tr>{exp_rows}</table>"
        "</section><section><h2>Automatic decisions</h2><table><tr><th>when</th><th>route</th>"
        f"<th>canary</th><th>action</th><th>why</th></tr>{dec_rows}</table></section>"
        f"{loops}"
    )
    return page("dashboard", body, active="/dashboard")
