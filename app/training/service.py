"""Training runs: enqueue, read, list, cancel (the connection is scoped to one tenant)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from app.core.db import Connection
from app.core.errors import BadRequest, Conflict, NotFound
from app.training.schemas import TrainingRunCreate, TrainingRunOut

# Examples of these snapshot methods have the same shape, so a snapshot serves either.
_COMPATIBLE = {"sft": {"sft"}, "kto": {"kto"}, "dpo": {"dpo", "orpo", "simpo"}}
_COMPATIBLE |= {"orpo": _COMPATIBLE["dpo"], "simpo": _COMPATIBLE["dpo"]}


def _out(row: dict[str, Any]) -> TrainingRunOut:
    return TrainingRunOut(**(row | {"hyperparameters": row["params"]}))


def enqueue(
    conn: Connection, *, tenant_id: int, body: TrainingRunCreate, base_model: str, actor: str
) -> TrainingRunOut:
    """Queue a training run after checking its route and snapshot belong to the tenant."""
    route = conn.execute(
        "SELECT name FROM serve.route WHERE name = %s AND tenant_id = %s", (body.route, tenant_id)
    ).fetchone()
    if route is None:
        raise NotFound(f"route {body.route!r} does not exist", code="route_not_found")
    snap = conn.execute(
        "SELECT id, route, method, n_train, tainted_at FROM train.dataset_snapshot"
        " WHERE id = %s AND tenant_id = %s",
        (body.snapshot_id, tenant_id),
    ).fetchone()
    if snap is None:
        raise NotFound(
            f"dataset snapshot {body.snapshot_id} does not exist", code="snapshot_not_found"
        )
    if snap["tainted_at"] is not None:
        raise Conflict(f"dataset snapshot {body.snapshot_id} is tainted", code="snapshot_tainted")
    if body.method not in _COMPATIBLE.get(snap["method"], set()):
        raise BadRequest(
            f"snapshot {body.snapshot_id} holds {snap['method']} examples; method {body.method}"
            f" needs one of {', '.join(sorted(_COMPATIBLE[body.method]))}",
            code="snapshot_method_mismatch",
        )
    row = conn.execute(
        "INSERT INTO train.training_run (tenant_id, route, method, base_model, params,"
        " snapshot_id, priority, max_attempts, created_by)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING *",
        (
            tenant_id,
            body.route,
            body.method,
            body.base_model or base_model,
            Jsonb(body.hyperparameters.model_dump()),
            body.snapshot_id,
            body.priority,
            body.max_attempts,
            actor,
        ),
    ).fetchone()
    assert row is not None
    return _out(row)


def get(conn: Connection, *, run_id: UUID) -> TrainingRunOut | None:
    """One run of the tenant, or None."""
    row = conn.execute("SELECT * FROM train.training_run WHERE id = %s", (run_id,)).fetchone()
    return _out(row) if row else None


def get_or_raise(conn: Connection, *, run_id: UUID) -> TrainingRunOut:
    """One run of the tenant (404 if absent)."""
    run = get(conn, run_id=run_id)
    if run is None:
        raise NotFound(f"training run {run_id} does not exist", code="training_run_not_found")
    return run


def list_runs(
    conn: Connection, *, status: str | None, route: str | None, limit: int
) -> list[TrainingRunOut]:
    """The tenant's runs, newest first, optionally filtered."""
    rows = conn.execute(
        "SELECT * FROM train.training_run"
        " WHERE (%(status)s::text IS NULL OR status = %(status)s)"
        "   AND (%(route)s::text IS NULL OR route = %(route)s)"
        " ORDER BY created_at DESC, id LIMIT %(limit)s",
        {"status": status, "route": route, "limit": limit},
    ).fetchall()
    return [_out(r) for r in rows]


def cancel(conn: Connection, *, run_id: UUID) -> TrainingRunOut:
    """Request cancellation: a queued run stops now, a running one at its next heartbeat."""
    run = get_or_raise(conn, run_id=run_id)
    if run.status in ("succeeded", "failed", "cancelled"):
        raise Conflict(f"training run {run_id} already {run.status}", code="training_run_finished")
    conn.execute("SELECT train.cancel_training_run_v1(%s)", (run_id,))
    return get_or_raise(conn, run_id=run_id)
