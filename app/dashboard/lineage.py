"""Adapter lineage: from a serving adapter back to what made it, in the order it happened: source
log rows -> snapshot -> training run -> evals -> experiment -> decisions. Read from
loop.provenance(adapter) (one row per thing), serve.adapter_event, the training run and
serve.experiment_decision; the examples and source rows are counted, not listed (a snapshot
links to its example browser)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.adapters import service as adapters
from app.dashboard.layout import PoolDep, login_page, not_found, page, reader, tenant
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
        return login_page(request)
    with tenant(key, pool) as conn:
        rows = adapters.list_adapters(conn)
    return page(request, "lineage_index.html", title="lineage", active=ACTIVE, adapters=rows)


def _jsonish(value: Any) -> str:
    """A detail's JSON, cut to 600 characters."""
    return json.dumps(value, default=str, ensure_ascii=False)[:600]


@router.get("/dashboard/lineage/{adapter_id}")
def lineage_page(adapter_id: str, request: Request, pool: PoolDep) -> Response:
    """One adapter's chain: sources, snapshot, run, evals, experiment, decisions."""
    key = reader(request, pool)
    if key is None:
        return login_page(request)
    with tenant(key, pool) as conn:
        adapter = adapters.get_adapter(conn, adapter_id=adapter_id)
        if adapter is None:
            return not_found(request, f"adapter {adapter_id}", ACTIVE)
        prov = conn.execute(
            "SELECT ord, step, ref, detail FROM loop.provenance(%s)"
            " WHERE step NOT IN ('example', 'log_row') ORDER BY ord, ref",
            (adapter_id,),
        ).fetchall()
        sources = conn.execute(SOURCES_SQL, (adapter_id,)).fetchone() or {}
        run = (
            training.get(conn, run_id=adapter.training_run_id) if adapter.training_run_id else None
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
    points = loss_points(run.progress) if run is not None else []
    return page(
        request,
        "lineage.html",
        title=f"lineage {adapter_id}",
        active=ACTIVE,
        adapter=adapter,
        cycle=one.get("cycle"),
        trigger=one.get("trigger"),
        sources=sources,
        snap=one.get("snapshot"),
        run=run,
        first_loss=points[0][1] if points else None,
        last_loss=points[-1][1] if points else None,
        n_points=len(points),
        evals=by.get("eval", []),
        gate=one.get("gate"),
        exp=one.get("experiment"),
        decisions=decisions,
        loop_decision=one.get("decision"),
        events=by.get("adapter_event", []),
        jsonish=_jsonish,
    )
