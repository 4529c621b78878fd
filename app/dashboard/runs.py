"""Training runs: the list (status, method, route, snapshot, timings) and one run's page with its
live progress and loss curve (from train.training_run.progress, written by the trainer's
heartbeat: step, total, loss, eta_s, tokens_per_s, loss_history). Both refresh while a run is
queued or running."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.dashboard.charts import Series, line_chart
from app.dashboard.layout import PoolDep, login_page, not_found, page, reader, tenant
from app.training import service as training

router = APIRouter(include_in_schema=False)

ACTIVE = "/dashboard/runs"
LIVE = ("queued", "running")
REFRESH_S = 5
STATUSES = ["queued", "running", "succeeded", "failed", "cancelled"]


def loss_points(progress: dict[str, Any]) -> list[tuple[float, float]]:
    """The run's (step, loss) points: its kept history, then the latest loss if newer."""
    points = [(float(s), float(v)) for s, v in progress.get("loss_history") or []]
    step, loss = progress.get("step"), progress.get("loss")
    if loss is not None and step and (not points or points[-1][0] < step):
        points.append((float(step), float(loss)))
    return points


@router.get("/dashboard/runs")
def runs_page(
    request: Request, pool: PoolDep, status: str | None = None, route: str | None = None
) -> Response:
    """The tenant's training runs, newest first."""
    key = reader(request, pool)
    if key is None:
        return login_page(request)
    status = status if status in STATUSES else None
    with tenant(key, pool) as conn:
        runs = training.list_runs(conn, status=status, route=route or None, limit=200)
        routes = [r["name"] for r in conn.execute("SELECT name FROM serve.route ORDER BY name")]
    live = any(r.status in LIVE for r in runs)
    return page(
        request,
        "runs.html",
        title="training runs",
        active=ACTIVE,
        refresh_s=REFRESH_S if live else None,
        runs=runs,
        routes=routes,
        statuses=STATUSES,
        status_filter=status,
        route_filter=route,
    )


@router.get("/dashboard/runs/{run_id}")
def run_page(run_id: str, request: Request, pool: PoolDep) -> Response:
    """One run: its facts, live progress, loss curve, hyperparameters and final metrics."""
    key = reader(request, pool)
    if key is None:
        return login_page(request)
    try:
        uid = UUID(run_id)
    except ValueError:
        return not_found(request, f"training run {run_id}", ACTIVE)
    with tenant(key, pool) as conn:
        run = training.get(conn, run_id=uid)
    if run is None:
        return not_found(request, f"training run {run_id}", ACTIVE)
    p = run.progress
    total = int(p.get("total") or 0)
    step = int(p.get("step") or 0)
    points = loss_points(p)
    chart = line_chart(
        [Series(label="training loss", points=list(points))] if points else [],
        title="training loss per optimizer step",
        chart_id="chart-loss",
        width=800,
        height=280,
        x_label="step",
    )
    return page(
        request,
        "run.html",
        title=f"run {str(run.id)[:8]}",
        active=ACTIVE,
        refresh_s=REFRESH_S if run.status in LIVE else None,
        run=run,
        p=p,
        step=step,
        total=total,
        pct=100 * step / total if total else 0,
        chart=chart,
    )
