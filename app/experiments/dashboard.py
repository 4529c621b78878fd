"""The dashboard: server-rendered HTML with inline SVG charts, behind a reader key.

Login posts the key once; it comes back as an HttpOnly, SameSite=Strict cookie, so the page never
holds it in JavaScript. Every query runs as the key's tenant (row-level security)."""

from __future__ import annotations

from datetime import datetime, timedelta
from html import escape
from typing import Annotated, Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.core.auth import ApiKey, lookup
from app.core.db import Pool, tenant_transaction
from app.core.deps import get_pool
from app.core.errors import database_required
from app.experiments import service as experiments
from app.experiments.charts import Series, line_chart
from app.loop import service as loop

router = APIRouter(include_in_schema=False)

COOKIE = "cft_dashboard_key"
READER_ROLES = frozenset({"reader", "trainer", "release", "admin"})
STATUS_COLORS = {
    "training": "#8c959f",
    "candidate": "#9a6700",
    "canary": "#1f6feb",
    "prod": "#1a7f37",
    "retired": "#57606a",
    "failed": "#d1242f",
    # loop cycle states
    "triggered": "#8c959f",
    "snapshot": "#8c959f",
    "evaluating": "#9a6700",
    "deciding": "#1f6feb",
    "watching": "#1f6feb",
    "promoted": "#1a7f37",
    "rejected": "#57606a",
    "rolled_back": "#d1242f",
}
# The policy fields the loop panel shows first (the rest follow in the table's order).
LOOP_FIELDS_FIRST = (
    "enabled", "paused", "method", "min_new_examples", "canary_pct", "decision_metric",
    "decision_alpha", "decision_min_n", "watch_window",
)  # fmt: skip

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
header{background:#24292f;color:#fff;padding:10px 20px;display:flex;gap:16px;align-items:center}
header a{color:#fff}main{padding:16px 20px;max-width:1400px}
section{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:12px 16px;
margin:0 0 16px}
h1{font-size:18px;margin:0}h2{font-size:16px;margin:0 0 8px}
table{border-collapse:collapse;width:100%}td,th{padding:4px 8px;border-bottom:1px solid #eaeef2;
text-align:left;font-variant-numeric:tabular-nums}th{background:#f6f8fa}
.pill{padding:1px 8px;border-radius:10px;color:#fff;font-size:12px}
.charts{display:flex;flex-wrap:wrap;gap:12px}
svg.chart{background:#fff;border:1px solid #eaeef2}svg .grid{stroke:#eaeef2}
svg .tick,svg .legend{font-size:10px;fill:#57606a}svg .title{font-size:12px;font-weight:600}
.loop .grid2{display:grid;grid-template-columns:repeat(auto-fill,minmax(230px,1fr));gap:2px 16px}
.loop .fired{color:#1a7f37;font-weight:600}.loop .blocking{color:#d1242f}
.loop .numbers{font-size:12px;color:#57606a}
.verdict{font-weight:600}.canary_better{color:#1a7f37}.canary_worse{color:#d1242f}
form.login{max-width:420px;margin:80px auto}input{width:100%;padding:6px;margin:6px 0}
"""


def _page(title: str, body: str, *, logged_in: bool = True) -> HTMLResponse:
    nav = (
        '<a href="/dashboard">overview</a>'
        '<form method="post" action="/dashboard/logout" style="margin-left:auto">'
        '<button type="submit">log out</button></form>'
        if logged_in
        else ""
    )
    html = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        '<link rel="icon" href="data:,">'
        f"<style>{CSS}</style></head><body><header><h1>cft · {escape(title)}</h1>{nav}</header>"
        f"<main>{body}</main></body></html>"
    )
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})


def _login_page(message: str = "", status: int = 200) -> HTMLResponse:
    note = f'<p role="alert">{escape(message)}</p>' if message else ""
    body = (
        '<form class="login" method="post" action="/dashboard/login"><h2>Dashboard login</h2>'
        f'{note}<label for="key">API key (role reader, release, trainer or admin)</label>'
        '<input id="key" name="key" type="password" autocomplete="off" required>'
        '<button type="submit">Log in</button></form>'
    )
    page = _page("login", body, logged_in=False)
    page.status_code = status
    return page


def _key_from_cookie(request: Request, pool: Pool) -> ApiKey | None:
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    with database_required(), pool.connection() as conn:
        key = lookup(conn, token)
    return key if key and key.role in READER_ROLES else None


PoolDep = Annotated[Pool, Depends(get_pool)]


@router.post("/dashboard/login")
async def login(request: Request, pool: PoolDep) -> Response:
    """Check the posted key and keep it in an HttpOnly cookie."""
    form = parse_qs((await request.body()).decode(errors="replace"))
    token = (form.get("key") or [""])[0].strip()
    if not token:
        return _login_page("enter a key", 400)
    with pool.connection() as conn:
        key = lookup(conn, token)
    if key is None:
        return _login_page("invalid or revoked key", 401)
    if key.role not in READER_ROLES:
        return _login_page(f"a key with role {key.role} cannot read the dashboard", 403)
    response = RedirectResponse("/dashboard", status_code=303)
    response.set_cookie(
        COOKIE,
        token,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/dashboard",
        max_age=12 * 3600,
    )
    return response


@router.post("/dashboard/logout")
def logout() -> Response:
    """Forget the key."""
    response = RedirectResponse("/dashboard", status_code=303)
    response.delete_cookie(COOKIE, path="/dashboard")
    return response


def _pill(status: str) -> str:
    color = STATUS_COLORS.get(status, "#57606a")
    return f'<span class="pill" style="background:{color}">{escape(status)}</span>'


def _num(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e-3 and v != 0 else f"{v:.{digits}f}"
    return escape(str(v))


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
    return f"{v:.0f}" if isinstance(v, float) and v.is_integer() else _num(v)


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
        f'<p class="current">cycle {cur["id"]}: {_pill(cur["state"])} '
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
            f"<td>{_pill(c['state'])}</td><td>{escape(c['adapter_id'] or '')}</td>"
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
    key = _key_from_cookie(request, pool)
    if key is None:
        return _login_page()
    with tenant_transaction(pool, key.tenant_id) as conn:
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
        f"<tr><td>{escape(a['id'])}</td><td>{escape(a['route'])}</td><td>{_pill(a['status'])}</td>"
        f"<td>{_num(a['traffic_pct'], 1)} %</td><td>{escape(a['method'] or '')}</td></tr>"
        for a in reg["adapters"]
    )
    canaries = "".join(
        f"<li>{escape(a['id'])} on {escape(a['route'])}: {_num(a['traffic_pct'], 1)} %</li>"
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
    return _page("dashboard", body)


def _series_by_arm(
    rows: list[dict[str, Any]], value: str, low: str | None = None, high: str | None = None
) -> list[Series]:
    arms: dict[tuple[str, str], Series] = {}
    for r in rows:
        if r[value] is None:
            continue
        label = f"{r['variant']} {r['adapter_id']}"
        s = arms.setdefault((r["variant"], r["adapter_id"]), Series(label=label, points=[]))
        s.points.append((r["bucket_at"], r[value]))
        if low and high and r[low] is not None and r[high] is not None:
            s.band.append((r["bucket_at"], r[low], r[high]))
    return [arms[k] for k in sorted(arms)]


@router.get("/dashboard/experiments/{name}")
def experiment_page(
    name: str, request: Request, pool: PoolDep, window: str = "7d", bucket: str = "hour"
) -> Response:
    """Charts of one experiment (feedback with CI bands, ttft percentiles, regen rate), verdict."""
    key = _key_from_cookie(request, pool)
    if key is None:
        return _login_page()
    delta = experiments.parse_window(window)
    with tenant_transaction(pool, key.tenant_id) as conn:
        m = experiments.metrics(conn, name=name, window=delta)
        rows = experiments.series(
            conn, name=name, since=m["since"], until=m["until"], bucket=bucket
        )
    thumbs = line_chart(
        _series_by_arm(rows, "thumbs_up_rate", "thumbs_up_ci_low", "thumbs_up_ci_high"),
        title="thumbs-up rate (95 % Wilson band)",
        chart_id="chart-thumbs",
        y_min=0,
        y_max=1,
    )
    feedback = line_chart(
        _series_by_arm(rows, "feedback_mean", "feedback_ci_low", "feedback_ci_high"),
        title="mean explicit feedback (95 % t band)",
        chart_id="chart-feedback",
        y_min=-1,
        y_max=1,
    )
    p50 = _series_by_arm(rows, "ttft_p50")
    p95 = _series_by_arm(rows, "ttft_p95")
    for s in p50:
        s.label += " p50"
    for s in p95:
        s.label += " p95"
        s.dashed = True
    ttft = line_chart(p50 + p95, title="time to first token, ms", chart_id="chart-ttft")
    regen = line_chart(
        _series_by_arm(rows, "regen_rate"), title="regeneration rate", chart_id="chart-regen"
    )
    verdicts = "".join(
        f'<p class="verdict {escape(v["verdict"])}">{escape(v["canary_variant"])} '
        f"{escape(v['canary_adapter'])} vs {escape(v['control_adapter'])}: "
        f"{escape(v['summary'])} (diff {_num(v['diff'])} [{_num(v['diff_ci_low'])}, "
        f"{_num(v['diff_ci_high'])}], p = {_num(v['p_value'])})</p>"
        for v in m["verdicts"]
    )
    arm_rows = "".join(
        f"<tr><td>{escape(a['variant'])}</td><td>{escape(a['adapter_id'])}</td><td>{a['n']}</td>"
        f"<td>{a['n_feedback']}</td><td>{_num(a['feedback_mean'])} [{_num(a['feedback_ci_low'])},"
        f" {_num(a['feedback_ci_high'])}]</td><td>{_num(a['thumbs_up_rate'])}</td>"
        f"<td>{_num(a['regen_rate'])}</td><td>{_num(a['edit_rate'])}</td>"
        f"<td>{_num(a['ttft_p50'], 0)} / {_num(a['ttft_p95'], 0)}</td></tr>"
        for a in m["arms"]
    )
    cmp_rows = "".join(
        f"<tr><td>{escape(c['canary_variant'])} {escape(c['canary_adapter'])}</td>"
        f"<td>{escape(c['metric'])}</td><td>{escape(c['test'])}</td>"
        f"<td>{_num(c['control_value'])}</td><td>{_num(c['canary_value'])}</td>"
        f"<td>{_num(c['diff'])} [{_num(c['diff_ci_low'])}, {_num(c['diff_ci_high'])}]</td>"
        f"<td>{_num(c['p_value'])}</td><td>{'yes' if c['significant'] else 'no'}</td>"
        f"<td>{_num(c['n_more_needed'])}</td></tr>"
        for c in m["comparisons"]
    )
    since = m["since"] if isinstance(m["since"], datetime) else datetime.now() - timedelta(days=7)
    body = (
        f"<section><h2>{escape(name)} — since {since:%Y-%m-%d %H:%M}, α = {m['alpha']}</h2>"
        f"{verdicts or '<p>no canary arm in this window</p>'}</section>"
        f'<section><h2>Over time (per {escape(bucket)})</h2><div class="charts">'
        f"{thumbs}{feedback}{ttft}{regen}</div></section>"
        "<section><h2>Arms</h2><table><tr><th>variant</th><th>adapter</th><th>n</th><th>rated</th>"
        "<th>mean feedback [95 % CI]</th><th>thumbs up</th><th>regen</th><th>edit</th>"
        f"<th>ttft p50 / p95</th></tr>{arm_rows}</table></section>"
        "<section><h2>Canary vs prod</h2><table><tr><th>canary</th><th>metric</th><th>test</th>"
        "<th>prod</th><th>canary</th><th>diff [CI]</th><th>p</th><th>significant</th>"
        f"<th>more n needed</th></tr>{cmp_rows}</table></section>"
    )
    return _page(f"experiment {name}", body)
