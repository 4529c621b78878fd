"""Training runs: enqueue, read, list, cancel (the connection is scoped to one tenant)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb
from pydantic import ValidationError

from app.core.db import Connection
from app.core.errors import BadRequest, Conflict, NotFound, Unprocessable
from app.datasets import service as datasets
from app.training.methods import Hyperparameters
from app.training.schemas import TrainingRunCreate, TrainingRunOut

# Examples of these snapshot methods have the same shape, so a snapshot serves either.
_COMPATIBLE = {"sft": {"sft"}, "kto": {"kto"}, "dpo": {"dpo", "orpo", "simpo"}}
_COMPATIBLE |= {"orpo": _COMPATIBLE["dpo"], "simpo": _COMPATIBLE["dpo"]}


def _hyperparameters_view(params: dict[str, Any] | None) -> dict[str, Any]:
    # params holds only what the caller set (so the worker can tell unset from default).
    try:
        return Hyperparameters(**(params or {})).model_dump()
    except ValidationError:
        return dict(params or {})


def _out(row: dict[str, Any]) -> TrainingRunOut:
    return TrainingRunOut(**(row | {"hyperparameters": _hyperparameters_view(row["params"])}))


# The most optimiser steps one run may ask for: runs share the platform's trainers.
MAX_STEPS = 100_000


def enqueue(
    conn: Connection, *, tenant_id: int, body: TrainingRunCreate, actor: str
) -> TrainingRunOut:
    """Queue a training run on the tenant's snapshot, or on one frozen now (body.snapshot).

    The run trains on its route's base model (the one the platform serves it on): a run
    cannot name another model, a path or a hub id for the shared trainers to load."""
    route = conn.execute(
        "SELECT name, base_model FROM serve.route WHERE name = %s AND tenant_id = %s",
        (body.route, tenant_id),
    ).fetchone()
    if route is None:
        raise NotFound(f"route {body.route!r} does not exist", code="route_not_found")
    if body.base_model is not None and body.base_model != route["base_model"]:
        raise Unprocessable(
            f"base_model {body.base_model!r} is not route {body.route!r}'s base"
            f" ({route['base_model']!r}): a run trains on its route's base; leave it out",
            code="base_model_mismatch",
            param="base_model",
        )
    if body.hyperparameters.max_steps > MAX_STEPS:
        raise Unprocessable(
            f"max_steps {body.hyperparameters.max_steps} is above the most a run may take"
            f" ({MAX_STEPS})",
            param="hyperparameters.max_steps",
        )
    if body.snapshot is not None:
        snapshot_id = _fresh_snapshot(conn, tenant_id=tenant_id, body=body, actor=actor)
    else:
        assert body.snapshot_id is not None  # the schema requires one of the two
        snapshot_id = body.snapshot_id
        _check_snapshot(conn, tenant_id=tenant_id, snapshot_id=snapshot_id, method=body.method)
    row = conn.execute(
        "INSERT INTO train.training_run (tenant_id, route, method, base_model, params,"
        " snapshot_id, priority, max_attempts, created_by, gpus, min_gpu_memory_gb, device_kind)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING *",
        (
            tenant_id,
            body.route,
            body.method,
            route["base_model"],
            Jsonb(body.hyperparameters.model_dump(exclude_unset=True)),
            snapshot_id,
            body.priority,
            body.max_attempts,
            actor,
            body.gpus,
            body.min_gpu_memory_gb,
            body.device_kind,
        ),
    ).fetchone()
    assert row is not None
    return _out(row)


def _check_snapshot(conn: Connection, *, tenant_id: int, snapshot_id: UUID, method: str) -> None:
    snap = conn.execute(
        "SELECT id, route, method, n_train, tainted_at FROM train.dataset_snapshot"
        " WHERE id = %s AND tenant_id = %s",
        (snapshot_id, tenant_id),
    ).fetchone()
    if snap is None:
        raise NotFound(f"dataset snapshot {snapshot_id} does not exist", code="snapshot_not_found")
    if snap["tainted_at"] is not None:
        raise Conflict(f"dataset snapshot {snapshot_id} is tainted", code="snapshot_tainted")
    if method not in _COMPATIBLE.get(snap["method"], set()):
        raise BadRequest(
            f"snapshot {snapshot_id} holds {snap['method']} examples; method {method}"
            f" needs one of {', '.join(sorted(_COMPATIBLE[method]))}",
            code="snapshot_method_mismatch",
        )


def _fresh_snapshot(
    conn: Connection, *, tenant_id: int, body: TrainingRunCreate, actor: str
) -> UUID:
    """Freeze the route's candidates for the run's method (in the request's transaction)."""
    assert body.snapshot is not None
    spec = body.snapshot
    snap = datasets.create_snapshot(
        conn,
        tenant_id=tenant_id,
        route=body.route,
        method=body.method,
        since=spec.since,
        until=spec.until,
        dedup_threshold=spec.dedup_threshold,
        eval_pct=spec.eval_pct,
        neighbours=spec.neighbours,
        created_by=actor,
        refresh=spec.refresh,
    )
    if not snap.n_train:
        # Raising rolls the request's transaction back: the empty snapshot is not kept.
        raise Conflict(
            f"a fresh {body.method} snapshot of route {body.route!r} has no training examples"
            " in its window: nothing to train on",
            code="snapshot_empty",
        )
    return snap.id


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
    conn.execute("SELECT train.cancel_training_run(%s)", (run_id,))
    return get_or_raise(conn, run_id=run_id)
