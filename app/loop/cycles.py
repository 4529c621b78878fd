"""Cycle bookkeeping in SQL (sql/loop/claim_cycle.sql, start_cycles.sql): start, claim, move on."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from app.core.db import Connection
from app.loop.service import jsonable


@dataclass
class Outcome:
    """What a step decided: a new state (to), or wait (to None) and check again after delay_s."""

    to: str | None
    set: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    delay_s: float = 0.0


@dataclass(frozen=True)
class Cycle:
    """A loop.cycle row (sql/state/loop/cycle.sql says what each column holds). When a worker
    steps it, policy is the route's effective policy now, intervals in seconds."""

    id: int
    tenant_id: int
    route: str
    state: str
    trigger: str
    trigger_values: dict[str, Any]
    policy: dict[str, Any]
    signal_counts: dict[str, Any] | None
    method: str | None
    method_reason: str | None
    hyperparameters: dict[str, Any] | None
    snapshot_id: UUID | None
    snapshot_counts: dict[str, Any] | None
    n_train: int | None
    n_eval: int | None
    training_run_id: UUID | None
    adapter_id: str | None
    current_prod_id: str | None
    eval_scores: dict[str, Any] | None
    blockers: list[dict[str, Any]] | None
    canary_pct: Decimal | None
    canary_started_at: datetime | None
    experiment: dict[str, Any] | None
    decision: str | None
    decision_code: str | None
    decision_reason: str | None
    previous_prod_id: str | None
    promoted_at: datetime | None
    watch_until: datetime | None
    watch: dict[str, Any] | None
    forget_request_id: int | None
    error: str | None
    waiting_for: str | None
    worker_id: str | None
    lease_until: datetime | None
    attempts: int
    max_attempts: int
    next_step_at: datetime
    state_entered_at: datetime
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    settings_tried: list[dict[str, Any]] | None

    @classmethod
    def from_row(cls, row: Any) -> Cycle:
        """A cycle from a row of loop.cycle (or a function returning SETOF loop.cycle)."""
        return cls(**{f.name: row[f.name] for f in fields(cls)})

    @property
    def candidate(self) -> str:
        """The cycle's adapter; a step that needs one before training made it is a bug."""
        if self.adapter_id is None:
            raise ValueError(f"loop cycle {self.id} in state {self.state} has no adapter")
        return self.adapter_id

    @property
    def chosen_method(self) -> str:
        """The cycle's training method; a step that needs one before it was chosen is a bug."""
        if self.method is None:
            raise ValueError(f"loop cycle {self.id} in state {self.state} has no method")
        return self.method


def _json(value: Any) -> Jsonb:
    """jsonb of a step's values (timestamps and ids as text, as PostgreSQL reads them back)."""
    return Jsonb(jsonable(value), dumps=lambda v: json.dumps(v, default=str))


def _seconds(s: float) -> str:
    return f"{s} seconds"


def start_due(conn: Connection) -> list[Cycle]:
    """Start every cycle that is due now (triggers fired, no limit holds)."""
    return [Cycle.from_row(r) for r in conn.execute("SELECT * FROM loop.start_due_cycles()")]


def claim(conn: Connection, *, worker_id: str, lease_s: float) -> Cycle | None:
    """Claim one cycle whose next step is due, or None."""
    row = conn.execute(
        "SELECT * FROM loop.claim_cycle(%s, %s::interval)", (worker_id, _seconds(lease_s))
    ).fetchone()
    return Cycle.from_row(row) if row else None


def get(conn: Connection, *, cycle_id: int) -> Cycle:
    """The cycle row now."""
    row = conn.execute("SELECT * FROM loop.cycle WHERE id = %s", (cycle_id,)).fetchone()
    if row is None:
        raise LookupError(f"no loop cycle {cycle_id}")
    return Cycle.from_row(row)


def apply(conn: Connection, *, cycle_id: int, worker_id: str, outcome: Outcome) -> Cycle:
    """Record a step's outcome (advance or wait); returns the cycle row after it."""
    payload = _json(outcome.set)
    if outcome.to is None:
        conn.execute(
            "SELECT loop.wait_cycle(%s, %s, %s::interval, %s, %s)",
            (cycle_id, worker_id, _seconds(outcome.delay_s), outcome.note, payload),
        )
    else:
        conn.execute(
            "SELECT loop.advance_cycle(%s, %s, %s, %s, %s, %s)",
            (cycle_id, worker_id, outcome.to, payload, _json(outcome.inputs),
             outcome.note or None),
        )  # fmt: skip
    return get(conn, cycle_id=cycle_id)


def fail_step(
    conn: Connection, *, cycle_id: int, worker_id: str, error: str, final: bool = False
) -> str | None:
    """Count a failed step (retry later, or fail the cycle at max_attempts); the state after."""
    row = conn.execute(
        "SELECT loop.fail_step(%s, %s, %s, %s) AS state", (cycle_id, worker_id, error[:4000], final)
    ).fetchone()
    return row["state"] if row else None
