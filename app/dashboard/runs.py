"""Training runs: the list (status, method, route, snapshot, timings) and one run's page with its
live progress and loss curve (from train.training_run.progress, written by the trainer's
heartbeat: step, total, loss, eta_s, tokens_per_s, loss_history). Both refresh while a run is
queued or running."""

from __future__ import annotations

from html import escape
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.dashboard.charts import Series, line_chart
from app.dashboard.layout import (
    PoolDep,
    link,
    login_page,
    not_found,
    num,
    options,
    page,
    pill,
    reader,
    seconds,
    tenant,
    when,
)
from app.training import service as training
from app.training.schemas import TrainingRunOut

router = APIRouter(include_in_schema=False)

ACTIVE = "/dashboard/runs"
LIVE = ("queued", "running")
REFRESH_S = 5
STATUSES = ["queued", "running", "succeeded", "failed", "cancelled"]


def _step(run: TrainingRunOut) -> str:
    p = run.progress
    if not p.get("total"):
        return "–"
    return f"{p.get('step', 0)} / {p['total']}"


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
        return login_page()
    status = status if status in STATUSES else None
    with tenant(key, pool) as conn:
        runs = training.list_runs(conn, status=status, route=route or None, limit=200)
        routes = [r["name"] for r in conn.execute("SELECT name FROM serve.route ORDER BY name")]
    rows = "".join(
        f'<tr class="run"><td>{link("/dashboard/runs", str(r.id), text=str(r.id)[:8])}</td>'
        f"<td>{pill(r.status)}</td><td>{escape(r.method)}</td><td>{escape(r.route)}</td>"
        f"<td>{_snapshot_link(r)}</td><td class=n>{_step(r)}</td>"
        f"<td class=n>{num(r.progress.get('loss'), 4)}</td>"
        f"<td>{when(r.created_at)}</td><td>{seconds(r.created_at, r.started_at)}</td>"
        f"<td>{seconds(r.started_at, r.finished_at)}</td>"
        f"<td>{link('/dashboard/lineage', r.adapter_id) if r.adapter_id else ''}</td></tr>"
        for r in runs
    )
    filters = (
        '<form class="filters" method="get"><label>status<select name="status">'
        f"{options(STATUSES, status)}</select></label><label>route<select name=route>"
        f"{options(routes, route)}</select></label><button>show</button></form>"
    )
    body = (
        f"<section><h2>Training runs</h2>{filters}<table><tr><th>run</th><th>status</th>"
        "<th>method</th><th>route</th><th>snapshot</th><th class=n>step</th>"
        "<th class=n>loss</th><th>queued at</th><th>waited</th><th>trained</th><th>adapter</th>"
        f"</tr>{rows or '<tr><td colspan=11>no training runs</td></tr>'}</table></section>"
    )
    live = any(r.status in LIVE for r in runs)
    return page("training runs", body, active=ACTIVE, refresh_s=REFRESH_S if live else None)


def _snapshot_link(run: TrainingRunOut) -> str:
    if run.snapshot_id is None:
        return ""
    return link("/dashboard/snapshots", str(run.snapshot_id), text=str(run.snapshot_id)[:8])


@router.get("/dashboard/runs/{run_id}")
def run_page(run_id: str, request: Request, pool: PoolDep) -> Response:
    """One run: its facts, live progress, loss curve, hyperparameters and final metrics."""
    key = reader(request, pool)
    if key is None:
        return login_page()
    try:
        uid = UUID(run_id)
    except ValueError:
        return not_found(f"training run {run_id}", ACTIVE)
    with tenant(key, pool) as conn:
        run = training.get(conn, run_id=uid)
    if run is None:
        return not_found(f"training run {run_id}", ACTIVE)
    p = run.progress
    facts = [
        ("status", pill(run.status)),
        ("method", escape(run.method)),
        ("route", escape(run.route)),
        ("base model", escape(run.base_model)),
        ("snapshot", _snapshot_link(run) or "–"),
        ("adapter", link("/dashboard/lineage", run.adapter_id) if run.adapter_id else "–"),
        ("attempts", f"{run.attempts} of {run.max_attempts}"),
        ("worker", escape(run.worker_id or "–")),
        ("queued at", when(run.created_at)),
        ("started at", when(run.started_at)),
        ("finished at", when(run.finished_at)),
        ("trained for", seconds(run.started_at, run.finished_at)),
    ]
    if run.cancel_requested:
        facts.append(("cancel", "requested"))
    total = int(p.get("total") or 0)
    step = int(p.get("step") or 0)
    pct = 100 * step / total if total else 0
    progress = (
        f'<p class="progress">step <b id="step">{step}</b> of <b>{total or "?"}</b> '
        f'<span class="bar" style="width:{2 * pct:.0f}px"></span> {pct:.0f} %'
        f" · loss {num(p.get('loss'), 4)} · eta {num(p.get('eta_s'), 0)} s"
        f" · {num(p.get('tokens_per_s'), 0)} tokens/s"
        f' <span class="muted">updated {escape(str(p.get("updated_at") or "–"))[:19]}</span></p>'
        if p
        else "<p>no progress reported yet</p>"
    )
    points = loss_points(p)
    chart = line_chart(
        [Series(label="training loss", points=list(points))] if points else [],
        title="training loss per optimizer step",
        chart_id="chart-loss",
        width=800,
        height=280,
        x_label="step",
    )
    hp = "".join(
        f"<div><b>{escape(k)}</b> {escape(str(v))}</div>" for k, v in run.hyperparameters.items()
    )
    metrics = "".join(
        f"<div><b>{escape(k)}</b> {num(v, 4)}</div>" for k, v in (p.get("metrics") or {}).items()
    )
    error = f'<p class="blocker">{escape(run.error)}</p>' if run.error else ""
    body = (
        f'<section><h2>Run {escape(str(run.id))}</h2>{error}<div class="facts">'
        + "".join(f"<div><b>{k}</b> {v}</div>" for k, v in facts)
        + f"</div></section><section><h2>Progress</h2>{progress}{chart}</section>"
        f'<section><h2>Hyperparameters</h2><div class="facts">{hp}</div></section>'
        + (
            f'<section><h2>Final metrics</h2><div class="facts" id="metrics">{metrics}</div>'
            "</section>"
            if metrics
            else ""
        )
    )
    live = run.status in LIVE
    return page(
        f"run {str(run.id)[:8]}", body, active=ACTIVE, refresh_s=REFRESH_S if live else None
    )
