"""One experiment: feedback with confidence bands, ttft percentiles, regeneration rate over time,
the arms and canary-vs-prod comparisons with the verdict."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.dashboard.charts import Series, line_chart
from app.dashboard.layout import PoolDep, login_page, page, reader, tenant
from app.experiments import service as experiments

router = APIRouter(include_in_schema=False)


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
    key = reader(request, pool)
    if key is None:
        return login_page(request)
    delta = experiments.parse_window(window)
    with tenant(key, pool) as conn:
        m = experiments.metrics(conn, name=name, window=delta)
        rows = experiments.series(conn, name=name, since=m.since, until=m.until, bucket=bucket)
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
    since = m.since
    return page(
        request,
        "experiment.html",
        title=f"experiment {name}",
        active="/dashboard",
        name=name,
        since=since,
        bucket=bucket,
        m=m,
        charts=[thumbs, feedback, ttft, regen],
    )
