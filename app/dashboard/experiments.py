"""One experiment: feedback with confidence bands, ttft percentiles, regeneration rate over time,
the arms and canary-vs-prod comparisons with the verdict."""

from __future__ import annotations

from datetime import datetime, timedelta
from html import escape
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.dashboard.charts import Series, line_chart
from app.dashboard.layout import PoolDep, login_page, num, page, reader, tenant
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
        return login_page()
    delta = experiments.parse_window(window)
    with tenant(key, pool) as conn:
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
        f"{escape(v['summary'])} (diff {num(v['diff'])} [{num(v['diff_ci_low'])}, "
        f"{num(v['diff_ci_high'])}], p = {num(v['p_value'])})</p>"
        for v in m["verdicts"]
    )
    arm_rows = "".join(
        f"<tr><td>{escape(a['variant'])}</td><td>{escape(a['adapter_id'])}</td><td>{a['n']}</td>"
        f"<td>{a['n_feedback']}</td><td>{num(a['feedback_mean'])} [{num(a['feedback_ci_low'])},"
        f" {num(a['feedback_ci_high'])}]</td><td>{num(a['thumbs_up_rate'])}</td>"
        f"<td>{num(a['regen_rate'])}</td><td>{num(a['edit_rate'])}</td>"
        f"<td>{num(a['ttft_p50'], 0)} / {num(a['ttft_p95'], 0)}</td></tr>"
        for a in m["arms"]
    )
    cmp_rows = "".join(
        f"<tr><td>{escape(c['canary_variant'])} {escape(c['canary_adapter'])}</td>"
        f"<td>{escape(c['metric'])}</td><td>{escape(c['test'])}</td>"
        f"<td>{num(c['control_value'])}</td><td>{num(c['canary_value'])}</td>"
        f"<td>{num(c['diff'])} [{num(c['diff_ci_low'])}, {num(c['diff_ci_high'])}]</td>"
        f"<td>{num(c['p_value'])}</td><td>{'yes' if c['significant'] else 'no'}</td>"
        f"<td>{num(c['n_more_needed'])}</td></tr>"
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
    return page(f"experiment {name}", body, active="/dashboard")
