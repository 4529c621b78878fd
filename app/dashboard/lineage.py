"""Adapter lineage: from a serving adapter back to what made it, in the order it happened: source
log rows -> snapshot -> training run -> evals -> experiment -> decisions. Read from
loop.provenance(adapter) (one row per thing), serve.adapter_event, the training run and
serve.experiment_decision; the examples and source rows are counted, not listed (a snapshot
links to its example browser)."""

from __future__ import annotations

import json
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
    seconds,
    tenant,
    when,
)
from app.dashboard.runs import loss_points
from app.training import service as training

router = APIRouter(include_in_schema=False)

ACTIVE = "/dashboard/lineage"

# What the source rows of the adapter's examples said (loop.provenance's log_row details).
SOURCES_SQL = """
SELECT count(*) FILTER (WHERE step = 'example') AS examples,
       count(*) FILTER (WHERE step = 'log_row') AS log_rows,
       count(*) FILTER (WHERE step = 'log_row' AND (detail->>'fb_explicit')::int > 0) AS up,
       count(*) FILTER (WHERE step = 'log_row' AND (detail->>'fb_explicit')::int < 0) AS down,
       count(*) FILTER (WHERE step = 'log_row' AND (detail->>'fb_regen')::boolean) AS regen,
       count(*) FILTER (WHERE step = 'log_row' AND (detail->>'fb_edited')::boolean) AS edited,
       min(detail->>'created_at') FILTER (WHERE step = 'log_row') AS first_at,
       max(detail->>'created_at') FILTER (WHERE step = 'log_row') AS last_at
  FROM loop.provenance(%s) WHERE step IN ('example', 'log_row')
"""


@router.get("/dashboard/lineage")
def lineage_index(request: Request, pool: PoolDep) -> Response:
    """Every adapter of the tenant, newest first, each linking to its lineage."""
    key = reader(request, pool)
    if key is None:
        return login_page()
    with tenant(key, pool) as conn:
        rows = adapters.list_adapters(conn)
    trs = "".join(
        f'<tr class="adapter"><td>{link(ACTIVE, a["id"])}</td><td>{escape(a["route"])}</td>'
        f"<td>{pill(a['status'])}</td><td>{escape(a['method'] or '')}</td>"
        f"<td>{when(a['created_at'])}</td></tr>"
        for a in rows
    )
    body = (
        "<section><h2>Adapters</h2><table><tr><th>adapter</th><th>route</th><th>status</th>"
        f"<th>method</th><th>created</th></tr>{trs or '<tr><td colspan=5>none</td></tr>'}"
        "</table></section>"
    )
    return page("lineage", body, active=ACTIVE)


def _jsonish(value: Any) -> str:
    return escape(json.dumps(value, default=str, ensure_ascii=False)[:600])


def _step(n: int, title: str, body: str, step: str) -> str:
    return (
        f'<section class="lineage-step" data-step="{step}"><h2>{n}. {escape(title)}</h2>'
        f"{body}</section>"
    )


@router.get("/dashboard/lineage/{adapter_id}")
def lineage_page(adapter_id: str, request: Request, pool: PoolDep) -> Response:
    """One adapter's chain: sources, snapshot, run, evals, experiment, decisions."""
    key = reader(request, pool)
    if key is None:
        return login_page()
    with tenant(key, pool) as conn:
        adapter = adapters.get_adapter(conn, adapter_id=adapter_id)
        if adapter is None:
            return not_found(f"adapter {adapter_id}", ACTIVE)
        prov = conn.execute(
            "SELECT ord, step, ref, detail FROM loop.provenance(%s)"
            " WHERE step NOT IN ('example', 'log_row') ORDER BY ord, ref",
            (adapter_id,),
        ).fetchall()
        sources = conn.execute(SOURCES_SQL, (adapter_id,)).fetchone() or {}
        run = (
            training.get(conn, run_id=adapter["training_run_id"])
            if adapter["training_run_id"]
            else None
        )
        decisions = conn.execute(
            "SELECT decided_at, experiment, control_id, action, code, metric, reason, numbers"
            "  FROM serve.experiment_decision WHERE canary_id = %s ORDER BY decided_at, id",
            (adapter_id,),
        ).fetchall()
    by: dict[str, list[dict[str, Any]]] = {}
    for r in prov:
        by.setdefault(r["step"], []).append(r)
    one = {k: v[0] for k, v in by.items()}

    cycle = one.get("cycle")
    trigger = one.get("trigger")
    origin = (
        f"<p>loop cycle {escape(cycle['ref'])} ({escape(str(cycle['detail'].get('state')))}), "
        f"trigger <b>{escape(trigger['ref'])}</b> <span class=numbers>"
        f"{_jsonish(trigger['detail'])}</span>; method {escape(str(cycle['detail'].get('method')))}"
        f": {escape(str(cycle['detail'].get('method_reason') or ''))}</p>"
        if cycle and trigger
        else "<p>not made by the loop (trained by hand)</p>"
    )
    src = (
        f'<p class="sources">{sources.get("examples", 0)} examples from '
        f"{sources.get('log_rows', 0)} logged calls still present "
        f"(thumbs up {sources.get('up', 0)}, down {sources.get('down', 0)}, "
        f"regenerated {sources.get('regen', 0)}, edited {sources.get('edited', 0)}), "
        f"logged {escape(str(sources.get('first_at') or '–'))[:19]} → "
        f"{escape(str(sources.get('last_at') or '–'))[:19]}</p>"
    )
    snap = one.get("snapshot")
    snapshot = (
        f"<p>{link('/dashboard/snapshots', snap['ref'])} · {escape(snap['detail']['method'])} · "
        f"train {snap['detail']['n_train']} / eval {snap['detail']['n_eval']} · counts "
        f"<span class=numbers>{_jsonish(snap['detail']['counts'])}</span> · set hash "
        f"<code>{escape(str(snap['detail']['set_hash'])[:16])}</code></p>"
        if snap
        else "<p>no dataset snapshot recorded</p>"
    )
    if run is not None:
        points = loss_points(run.progress)
        training_html = (
            f"<p>{link('/dashboard/runs', str(run.id), text=str(run.id)[:8])} {pill(run.status)}"
            f" · {escape(run.method)} on {escape(run.base_model)} · trained "
            f"{seconds(run.started_at, run.finished_at)} · loss "
            f"{num(points[0][1] if points else None, 4)} → "
            f"{num(points[-1][1] if points else None, 4)} over {len(points)} logged steps</p>"
        )
    else:
        training_html = "<p>no training run recorded</p>"
    evals = "".join(
        f'<tr class="eval"><td>{escape(r["ref"])}</td><td class=n>{num(r["detail"]["score"], 4)}'
        f"</td><td>{escape(str(r['detail'].get('judge_model') or ''))}</td>"
        f"<td>{escape(str(r['detail'].get('judged_at'))[:19])}</td></tr>"
        for r in by.get("eval", [])
    )
    gate = one.get("gate")
    gate_html = (
        f"<p>gate at the loop's check against {escape(str(gate['detail'].get('current_prod')))}"
        f": {len(gate['detail'].get('blockers') or [])} blocker(s)</p>"
        if gate
        else ""
    )
    exp = one.get("experiment")
    exp_html = (
        f"<p>canary at {num(exp['detail'].get('canary_pct'))} % from "
        f"{escape(str(exp['detail'].get('canary_started_at') or '–'))[:19]} · numbers "
        f"<span class=numbers>{_jsonish(exp['detail'].get('numbers'))}</span></p>"
        if exp
        else ""
    )
    dec_rows = "".join(
        f'<tr class="decision"><td>{when(d["decided_at"])}</td><td>{escape(d["experiment"])}</td>'
        f"<td>{escape(d['action'])} {escape(d['code'])}</td><td>{escape(d['metric'])}</td>"
        f"<td>{escape(d['reason'])}</td></tr>"
        for d in decisions
    )
    loop_dec = one.get("decision")
    loop_dec_html = (
        f'<p class="decision">loop decision: <b>{escape(loop_dec["ref"])}</b> '
        f"{escape(str(loop_dec['detail'].get('code')))}: "
        f"{escape(str(loop_dec['detail'].get('reason')))}</p>"
        if loop_dec
        else ""
    )
    events = "".join(
        f'<tr class="event"><td>{escape(str(e["detail"].get("at"))[:19])}</td>'
        f"<td>{escape(str(e['detail'].get('old_status') or ''))} → "
        f"{escape(str(e['detail'].get('new_status') or ''))}</td>"
        f"<td class=n>{num(e['detail'].get('traffic_pct'))}</td>"
        f"<td>{escape(str(e['detail'].get('actor')))}</td>"
        f"<td>{escape(str(e['detail'].get('reason') or ''))}</td></tr>"
        for e in by.get("adapter_event", [])
    )
    body = (
        f"<section><h2>{escape(adapter_id)} {pill(adapter['status'])}</h2><p>route "
        f"{escape(adapter['route'])} · {escape(adapter['method'] or '')} · created "
        f"{when(adapter['created_at'])} · sha256 <code>{escape((adapter['sha256'] or '')[:16])}"
        f"</code></p>{origin}</section>"
        + _step(1, "Source rows", src, "sources")
        + _step(2, "Snapshot", snapshot, "snapshot")
        + _step(3, "Training run", training_html, "run")
        + _step(
            4,
            "Evals",
            f"<p>{link('/dashboard/evals', adapter_id, text='candidate vs prod vs base')}</p>"
            f"{gate_html}<table><tr><th>suite/metric</th><th class=n>score</th><th>judge</th>"
            f"<th>at</th></tr>{evals or '<tr><td colspan=4>no eval results</td></tr>'}</table>",
            "evals",
        )
        + _step(5, "Experiment", exp_html or "<p>no canary experiment recorded</p>", "experiment")
        + _step(
            6,
            "Decisions",
            f"{loop_dec_html}<table><tr><th>when</th><th>experiment</th><th>action</th>"
            f"<th>metric</th><th>why</th></tr>"
            f"{dec_rows or '<tr><td colspan=5>no automatic decisions</td></tr>'}</table>"
            "<h3>Registry events</h3><table><tr><th>at</th><th>status</th><th class=n>traffic</th>"
            f"<th>actor</th><th>reason</th></tr>{events}</table>",
            "decisions",
        )
    )
    return page(f"lineage {adapter_id}", body, active=ACTIVE)
