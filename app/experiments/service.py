"""Experiment rules: read the SQL metrics (sql/obs/experiment_*.sql) and apply the policy
(sql/serve/canary_decision.sql, sql/serve/experiment_autopolicy.sql).

Every number comes from the database, so a dashboard can reproduce it with psql."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from app.core.db import Connection
from app.core.errors import BadRequest, NotFound
from app.experiments.schemas import ArmOut, ComparisonOut, ExperimentOut, MetricsOut, VerdictOut

WINDOW_RE = re.compile(r"^(\d{1,4})([mhdw])$")
WINDOW_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
MAX_WINDOW = timedelta(days=366)


def parse_window(window: str) -> timedelta:
    """'30m', '24h', '7d', '2w' as a timedelta (BadRequest otherwise)."""
    match = WINDOW_RE.match(window.strip())
    if not match:
        raise BadRequest(
            f"window {window!r} is not like 30m, 24h, 7d or 2w",
            code="invalid_value",
            param="window",
        )
    delta = timedelta(**{WINDOW_UNITS[match.group(2)]: int(match.group(1))})
    if not timedelta(0) < delta <= MAX_WINDOW:
        raise BadRequest("window must be positive and at most 366 days", param="window")
    return delta


@dataclass(frozen=True)
class Decision:
    """A decision of the experiment policy (a serve.experiment_decision row; id None: not
    recorded, the same hold or block as the canary's last)."""

    id: int | None
    route: str
    tenant_id: int
    experiment: str
    canary_id: str
    control_id: str | None
    action: str
    code: str
    metric: str
    reason: str
    numbers: dict[str, Any]
    decided_by: str
    decided_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> Decision:
        """A decision from a row of serve.experiment_decision."""
        return cls(**{f.name: row[f.name] for f in fields(cls)})


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    """NaN and infinities become None, so the row is valid JSON."""
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()
    }


def list_experiments(conn: Connection) -> list[ExperimentOut]:
    """Experiments visible to the connection, most recently active first."""
    rows = conn.execute(
        "SELECT experiment AS name, tenant_id, route, n, variants, adapters, first_at, last_at,"
        " running FROM obs.experiment ORDER BY last_at DESC, experiment"
    ).fetchall()
    return [ExperimentOut.model_validate(_finite(r)) for r in rows]


def get_experiment(conn: Connection, *, name: str) -> ExperimentOut | None:
    """One experiment, or None."""
    for row in list_experiments(conn):
        if row.name == name:
            return row
    return None


def get_experiment_or_raise(conn: Connection, *, name: str) -> ExperimentOut:
    """One experiment, or NotFound."""
    row = get_experiment(conn, name=name)
    if row is None:
        raise NotFound(f"experiment {name!r} not found", code="experiment_not_found")
    return row


def arms(
    conn: Connection, *, name: str, since: datetime, until: datetime, alpha: float = 0.05
) -> list[ArmOut]:
    """Per-arm metrics (obs.experiment_arms)."""
    rows = conn.execute(
        "SELECT * FROM obs.experiment_arms(%s, %s, %s, %s)", (name, since, until, alpha)
    ).fetchall()
    return [ArmOut.model_validate(_finite(r)) for r in rows]


def compare(
    conn: Connection, *, name: str, since: datetime, until: datetime, alpha: float = 0.05
) -> list[ComparisonOut]:
    """Canary versus prod per metric (obs.experiment_compare)."""
    rows = conn.execute(
        "SELECT * FROM obs.experiment_compare(%s, %s, %s, %s)", (name, since, until, alpha)
    ).fetchall()
    return [ComparisonOut.model_validate(_finite(r)) for r in rows]


def series(
    conn: Connection, *, name: str, since: datetime, until: datetime, bucket: str = "hour"
) -> list[dict[str, Any]]:
    """Metrics per hour or day (obs.experiment_series)."""
    if bucket not in ("hour", "day"):
        raise BadRequest("bucket must be hour or day", param="bucket")
    rows = conn.execute(
        "SELECT * FROM obs.experiment_series(%s, %s, %s, %s)", (name, since, until, bucket)
    ).fetchall()
    return [_finite(r) for r in rows]


def verdicts(
    comparisons: list[ComparisonOut], *, metric: str = "feedback_mean"
) -> list[VerdictOut]:
    """One plain-words verdict per canary arm, on metric (fixed-horizon: for reading only)."""
    out = []
    for c in comparisons:
        if c.metric != metric:
            continue
        if c.p_value is None:
            verdict, words = "no_data", "not enough data to test"
        elif c.significant and c.canary_better:
            verdict, words = "canary_better", "canary significantly better"
        elif c.significant:
            verdict, words = "canary_worse", "canary significantly worse"
        elif (c.n_more_needed or 0) > 0:
            verdict = "collecting"
            words = f"no significant difference yet; about {c.n_more_needed} more per arm needed"
        else:
            verdict, words = "no_difference", "no significant difference at this sample size"
        out.append(
            VerdictOut(
                canary_variant=c.canary_variant,
                canary_adapter=c.canary_adapter,
                control_adapter=c.control_adapter,
                metric=metric,
                verdict=verdict,
                summary=words,
                diff=c.diff,
                diff_ci_low=c.diff_ci_low,
                diff_ci_high=c.diff_ci_high,
                p_value=c.p_value,
            )
        )
    return out


def metrics(conn: Connection, *, name: str, window: timedelta, alpha: float = 0.05) -> MetricsOut:
    """Arms, comparisons and verdicts of an experiment over the last window."""
    get_experiment_or_raise(conn, name=name)
    now = conn.execute("SELECT now() AS now").fetchone()
    assert now is not None
    until: datetime = now["now"] + timedelta(seconds=1)
    since = until - window
    cmp = compare(conn, name=name, since=since, until=until, alpha=alpha)
    return MetricsOut(
        experiment=name,
        since=since,
        until=until,
        alpha=alpha,
        arms=arms(conn, name=name, since=since, until=until, alpha=alpha),
        comparisons=cmp,
        verdicts=verdicts(cmp),
    )


def run_policy(conn: Connection, *, tenant_id: int, route: str) -> list[Decision]:
    """Apply the tenant's route's experiment policy now (serve.experiment_autopolicy); its
    decisions."""
    rows = conn.execute(
        "SELECT * FROM serve.experiment_autopolicy(%s, %s)", (tenant_id, route)
    ).fetchall()
    return [Decision.from_row(r) for r in rows]


def policy_routes(conn: Connection) -> list[tuple[int, str]]:
    """Routes (tenant id, name) whose experiment policy is enabled."""
    rows = conn.execute("SELECT tenant_id, route FROM serve.experiment_policy_routes()").fetchall()
    return [(int(r["tenant_id"]), str(r["route"])) for r in rows]


def decisions(conn: Connection, *, limit: int = 50) -> list[Decision]:
    """The policy's most recent recorded decisions."""
    rows = conn.execute(
        "SELECT * FROM serve.experiment_decision ORDER BY id DESC LIMIT %s", (limit,)
    ).fetchall()
    return [Decision.from_row(r) for r in rows]


def registry(conn: Connection) -> dict[str, list[dict[str, Any]]]:
    """Routes, adapters and the adapters' audit events, for the dashboard."""
    routes = conn.execute(
        "SELECT name, base_model, coalesce(experiment, name) AS experiment, created_at"
        " FROM serve.route ORDER BY name"
    ).fetchall()
    adapters = conn.execute(
        "SELECT id, route, status, traffic_pct::float8 AS traffic_pct, method, promoted_at,"
        " created_at FROM serve.adapter ORDER BY route, created_at, id"
    ).fetchall()
    events = conn.execute(
        "SELECT adapter_id, route, old_status, new_status, new_traffic_pct::float8 AS traffic_pct,"
        " actor, reason, at FROM serve.adapter_event ORDER BY at, id"
    ).fetchall()
    return {"routes": list(routes), "adapters": list(adapters), "events": list(events)}
