"""The overview page: routes, adapters and their status timeline, canaries, experiments,
automatic decisions, and each route's loop panel."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.dashboard.layout import PoolDep, login_page, page, reader, tenant
from app.dashboard.templating import OTHER_COLOR, STATUS_COLORS, num
from app.experiments import service as experiments
from app.loop import service as loop

router = APIRouter(include_in_schema=False)

# The policy fields the loop panel shows first (the rest follow in the table's order).
LOOP_FIELDS_FIRST = (
    "enabled", "paused", "method", "min_new_examples", "canary_pct", "decision_metric",
    "decision_alpha", "decision_min_n", "watch_window",
)  # fmt: skip


@dataclass(frozen=True)
class Bar:
    """One stretch of an adapter's status on the timeline."""

    x: str
    width: str
    fill: str
    title: str


@dataclass(frozen=True)
class Timeline:
    """One row of bars per adapter, coloured by status over time (serve.adapter_event)."""

    width: int
    height: int
    left: int
    row_h: int
    n_events: int
    start: str
    rows: list[tuple[int, str, list[Bar]]]


def _timeline(adapters: list[dict[str, Any]], events: list[dict[str, Any]]) -> Timeline | None:
    """The timeline's geometry (None: no events)."""
    if not events:
        return None
    now = datetime.now(tz=events[0]["at"].tzinfo)
    t0 = min(e["at"] for e in events)
    span = max((now - t0).total_seconds(), 1.0)
    width, row_h, left = 900, 18, 220
    by_adapter: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_adapter.setdefault(e["adapter_id"], []).append(e)
    ids = [a["id"] for a in adapters if a["id"] in by_adapter]
    rows = []
    for i, aid in enumerate(ids):
        evs = by_adapter[aid]
        bars = []
        for j, e in enumerate(evs):
            start = e["at"]
            end = evs[j + 1]["at"] if j + 1 < len(evs) else now
            x = left + (start - t0).total_seconds() / span * (width - left - 8)
            w = max((end - start).total_seconds() / span * (width - left - 8), 2)
            status = e["new_status"] or "?"
            why = f" — {e['reason']}" if e["reason"] else ""
            bars.append(
                Bar(
                    x=f"{x:.1f}",
                    width=f"{w:.1f}",
                    fill=STATUS_COLORS.get(status, OTHER_COLOR),
                    title=f"{aid}: {status} from {start:%Y-%m-%d %H:%M}{why}",
                )
            )
        rows.append((i * row_h + 4, aid, bars))
    return Timeline(
        width=width,
        height=row_h * len(ids) + 24,
        left=left,
        row_h=row_h,
        n_events=len(events),
        start=f"{t0:%Y-%m-%d %H:%M}",
        rows=rows,
    )


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


def _loop_panel(conn: Any, tenant_id: int, route: str) -> dict[str, Any]:
    """One route's loop: policy, triggers with their values, the current cycle, the history."""
    st = loop.status(conn, tenant_id=tenant_id, route=route)
    p = st.policy
    fields = [f for f in LOOP_FIELDS_FIRST if f in p] + [
        f for f in loop.POLICY_FIELDS if f in p and f not in LOOP_FIELDS_FIRST
    ]
    cycles = []
    for c in st.cycles[:10]:
        full = (loop.get_cycle(conn, cycle_id=c.id) or c).model_extra or {}
        numbers = _numbers(full.get("experiment")) + _numbers(full.get("watch"), "watch.")
        cycles.append({"cycle": c, "numbers": "; ".join(numbers)})
    return {
        "route": route,
        "switch": st.control,
        "policy": [(f, _count(p[f])) for f in fields],
        "triggers": [
            t.model_dump() | {"value_text": _count(t.value), "threshold_text": _count(t.threshold)}
            for t in st.triggers
        ],
        "blocking": "; ".join(x.line for x in st.limits if x.blocking),
        "current": st.current_cycle,
        "cycles": cycles,
    }


def _serving(conn: Any) -> dict[str, Any]:
    """What each adapter and the base served in the last 7 days (obs.adapter_serving_7d), the
    busiest first, and LoRA against the base (obs.lora_vs_base_7d)."""
    rows = conn.execute(
        "SELECT route, adapter_id, is_base, n, n_error, calls_per_min, tokens_out_per_min,"
        " ttft_p50_ms, ttft_p99_ms FROM obs.adapter_serving_7d ORDER BY n DESC, adapter_id"
        " LIMIT 50"
    ).fetchall()
    kinds = conn.execute(
        "SELECT is_base, n, ttft_p50_ms, ttft_p99_ms FROM obs.lora_vs_base_7d ORDER BY is_base"
    ).fetchall()
    return {"adapters": rows, "kinds": kinds}


@router.get("/dashboard")
def overview(request: Request, pool: PoolDep) -> Response:
    """Routes, adapters and their status timeline, running canaries, experiments, decisions."""
    key = reader(request, pool)
    if key is None:
        return login_page(request)
    with tenant(key, pool) as conn:
        reg = experiments.registry(conn)
        exps = experiments.list_experiments(conn)
        decisions = experiments.decisions(conn, limit=20)
        loops = [_loop_panel(conn, key.tenant_id, r["name"]) for r in reg["routes"]]
        serving = _serving(conn)
    return page(
        request,
        "overview.html",
        title="dashboard",
        active="/dashboard",
        routes=reg["routes"],
        adapters=reg["adapters"],
        timeline=_timeline(reg["adapters"], reg["events"]),
        experiments=exps,
        decisions=decisions,
        loops=loops,
        serving=serving,
    )
