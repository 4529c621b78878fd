"""Loop rules for people: read and write a route's policy, the kill switch, cycles.

The loop's logic lives in SQL (sql/loop/): triggers, limits, verdicts; this module calls it in
the caller's transaction (scoped to a tenant for the API, the owner for the CLI)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from app.core.db import Connection
from app.core.errors import BadRequest, Forbidden, NotFound, Unprocessable
from app.loop.schemas import CycleOut, LimitOut, LoopStatusOut, TriggerOut

# The columns a policy write may name (loop.policy; route and tenant_id come from the path).
POLICY_FIELDS = (
    "enabled", "paused", "paused_reason", "method", "min_new_examples", "min_interval",
    "max_interval", "decline_enabled", "decline_alpha", "decline_window", "decline_min_n",
    "drift_enabled", "drift_distance", "drift_share", "drift_sample", "drift_min_n",
    "max_cycles_per_day", "max_concurrent_training", "cooldown_after_reject", "canary_pct",
    "canary_max_users", "canary_max_duration", "decision_metric", "decision_alpha",
    "decision_min_n", "watch_window", "watch_alpha", "watch_min_n", "eval_timeout",
    "memory_tight", "hyperparameters", "min_offline_gain",
)  # fmt: skip
# Fields that set how a promotion is decided, and which way is stricter. Only a release (or
# admin) key loosens them; a trainer key may leave them as they are or make them stricter, and
# its PUT keeps them (never resets them to a looser default). decision_metric changes only
# with a release key.
DECISION_FIELDS: dict[str, str] = {
    "decision_alpha": "lower", "decision_min_n": "higher", "watch_window": "higher",
    "watch_alpha": "lower", "watch_min_n": "higher", "min_offline_gain": "higher",
    "cooldown_after_reject": "higher", "decision_metric": "same",
}  # fmt: skip
DECIDERS = ("release", "admin")
TERMINAL = ("promoted", "rejected", "rolled_back", "failed")
CYCLE_LIST_COLUMNS = (
    "id, route, state, trigger, method, decision, decision_code, decision_reason, waiting_for,"
    " error, adapter_id, snapshot_id, training_run_id, attempts, created_at, finished_at"
)


@dataclass(frozen=True)
class Control:
    """The kill switch (paused: no loop cycle starts anywhere) and the platform caps."""

    paused: bool
    reason: str | None
    changed_by: str | None
    changed_at: datetime
    max_concurrent_training: int

    def as_json(self) -> dict[str, Any]:
        """The switch as the API shows it."""
        return jsonable(asdict(self))  # type: ignore[no-any-return]


def jsonable(value: Any) -> Any:
    """Rows as JSON: intervals in seconds, numerics as floats, NaN as None."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _check_route(conn: Connection, tenant_id: int, route: str) -> None:
    """NotFound unless the tenant has the route (and the connection may ask about it)."""
    try:
        with conn.transaction():
            conn.execute("SELECT loop.check_route(%s, %s)", (tenant_id, route))
    except psycopg.errors.NoDataFound as exc:
        raise NotFound(f"route {route!r} not found", code="route_not_found") from exc


def get_policy(conn: Connection, *, tenant_id: int, route: str) -> dict[str, Any]:
    """The tenant's route's effective policy (its row, or the defaults)."""
    _check_route(conn, tenant_id, route)
    row = conn.execute("SELECT * FROM loop.effective_policy(%s, %s)", (tenant_id, route)).fetchone()
    assert row is not None
    return jsonable(dict(row))  # type: ignore[no-any-return]


def _check_decider(
    conn: Connection, tenant_id: int, route: str, fields: dict[str, Any], role: str
) -> None:
    """403 when a key that does not decide promotions loosens how they are decided."""
    if role in DECIDERS:
        return
    now = conn.execute("SELECT * FROM loop.effective_policy(%s, %s)", (tenant_id, route)).fetchone()
    assert now is not None
    for name, stricter in DECISION_FIELDS.items():
        if name not in fields or fields[name] is None:
            continue
        new, old = fields[name], now[name]
        if stricter == "same":
            looser = new != old
        elif isinstance(old, timedelta | Decimal | int | float):
            cur = float(old.total_seconds() if isinstance(old, timedelta) else old)
            val = float(new.total_seconds() if isinstance(new, timedelta) else new)
            looser = val < cur if stricter == "higher" else val > cur
        else:
            looser = True
        if looser:
            raise Forbidden(
                f"{name} sets how promotions are decided: a key with role {role} may keep it"
                f" ({jsonable(old)}) or make it stricter; loosening it needs a release key",
                code="decision_field_needs_release",
            )


def write_policy(
    conn: Connection,
    *,
    tenant_id: int,
    route: str,
    fields: dict[str, Any],
    replace: bool,
    actor: str,
    role: str = "admin",
) -> dict[str, Any]:
    """Write a route's policy: the named fields; with replace, every other field to its default
    (a key that does not decide promotions keeps DECISION_FIELDS as they are)."""
    unknown = set(fields) - set(POLICY_FIELDS)
    if unknown:
        raise Unprocessable(f"unknown loop policy field(s): {', '.join(sorted(unknown))}")
    _check_route(conn, tenant_id, route)
    _check_decider(conn, tenant_id, route, fields, role)
    values = {k: Jsonb(v) if k == "hyperparameters" else v for k, v in fields.items()}
    cols = list(values)
    keep = () if role in DECIDERS else tuple(DECISION_FIELDS)
    reset = [f for f in POLICY_FIELDS if f not in values and f not in keep] if replace else []
    insert_cols = [sql.Identifier(c) for c in ("route", "tenant_id", "updated_by", *cols)]
    updates: list[sql.Composable] = [
        sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in cols
    ]
    updates += [sql.SQL("{0} = DEFAULT").format(sql.Identifier(c)) for c in reset]
    updates.append(sql.SQL("updated_by = EXCLUDED.updated_by"))
    query = sql.SQL(
        "INSERT INTO loop.policy ({cols}) VALUES ({vals}) ON CONFLICT (tenant_id, route)"
        " DO UPDATE SET {upd}"
    ).format(
        cols=sql.SQL(", ").join(insert_cols),
        vals=sql.SQL(", ").join(sql.Placeholder() for _ in insert_cols),
        upd=sql.SQL(", ").join(updates),
    )
    try:
        with conn.transaction():
            conn.execute(query, (route, tenant_id, actor, *values.values()))
    except (psycopg.errors.CheckViolation, psycopg.errors.NotNullViolation) as exc:
        message = exc.diag.message_primary or str(exc)
        raise Unprocessable(f"loop policy refused: {message}", code="invalid_policy") from exc
    except psycopg.errors.DataError as exc:
        raise Unprocessable(f"loop policy refused: {exc.diag.message_primary}") from exc
    return get_policy(conn, tenant_id=tenant_id, route=route)


def triggers(conn: Connection, *, tenant_id: int, route: str) -> list[TriggerOut]:
    """The live value of every trigger of the tenant's route."""
    rows = conn.execute("SELECT * FROM loop.triggers(%s, %s)", (tenant_id, route)).fetchall()
    return [TriggerOut(**jsonable(dict(r))) for r in rows]


def limits(conn: Connection, *, tenant_id: int, route: str) -> list[LimitOut]:
    """Every limit of the tenant's route now (blocking = it holds a new cycle back)."""
    rows = conn.execute("SELECT * FROM loop.limits(%s, %s)", (tenant_id, route)).fetchall()
    return [LimitOut(**jsonable(dict(r))) for r in rows]


def get_control(conn: Connection) -> Control:
    """The kill switch and the platform caps."""
    row = conn.execute(
        "SELECT paused, reason, changed_by, changed_at, max_concurrent_training FROM loop.control"
    ).fetchone()
    assert row is not None
    return Control(**row)


def set_control(conn: Connection, *, paused: bool, reason: str | None, actor: str) -> Control:
    """Stop (paused) or resume every loop cycle from starting."""
    try:
        with conn.transaction():
            conn.execute("SELECT loop.set_control(%s, %s, %s)", (paused, reason, actor))
    except psycopg.errors.InvalidParameterValue as exc:
        raise BadRequest(str(exc.diag.message_primary), code="reason_required") from exc
    return get_control(conn)


def list_cycles(conn: Connection, *, tenant_id: int, route: str, limit: int = 20) -> list[CycleOut]:
    """The tenant's route's cycles, newest first."""
    rows = conn.execute(
        f"SELECT {CYCLE_LIST_COLUMNS} FROM loop.cycle WHERE tenant_id = %s AND route = %s"
        " ORDER BY id DESC LIMIT %s",
        (tenant_id, route, limit),
    ).fetchall()
    return [CycleOut(**jsonable(dict(r))) for r in rows]


def get_cycle(conn: Connection, *, cycle_id: int) -> CycleOut | None:
    """One cycle with its transitions, or None."""
    row = conn.execute("SELECT * FROM loop.cycle WHERE id = %s", (cycle_id,)).fetchone()
    if row is None:
        return None
    events = conn.execute(
        "SELECT id, from_state, to_state, worker_id, inputs, note, at FROM loop.cycle_event"
        " WHERE cycle_id = %s ORDER BY id",
        (cycle_id,),
    ).fetchall()
    return CycleOut(**jsonable(dict(row) | {"events": [dict(e) for e in events]}))


def get_cycle_or_raise(conn: Connection, *, cycle_id: int) -> CycleOut:
    """One cycle, or NotFound."""
    row = get_cycle(conn, cycle_id=cycle_id)
    if row is None:
        raise NotFound(f"loop cycle {cycle_id} not found", code="cycle_not_found")
    return row


def status(conn: Connection, *, tenant_id: int, route: str) -> LoopStatusOut:
    """Everything about a tenant's route's loop: policy, triggers, limits, current cycle,
    history."""
    policy = get_policy(conn, tenant_id=tenant_id, route=route)
    cycles = list_cycles(conn, tenant_id=tenant_id, route=route)
    current = next((c for c in cycles if c.state not in TERMINAL), None)
    return LoopStatusOut(
        route=route,
        policy=policy,
        control=get_control(conn).as_json(),
        triggers=triggers(conn, tenant_id=tenant_id, route=route),
        limits=limits(conn, tenant_id=tenant_id, route=route),
        current_cycle=current,
        cycles=cycles,
    )
