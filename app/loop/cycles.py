"""Cycle bookkeeping in SQL (sql/loop/claim_cycle.sql, start_cycles.sql): start, claim, move on."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

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


def _json(value: Any) -> Jsonb:
    """jsonb of a step's values (timestamps and ids as text, as PostgreSQL reads them back)."""
    return Jsonb(jsonable(value), dumps=lambda v: json.dumps(v, default=str))


def _seconds(s: float) -> str:
    return f"{s} seconds"


def start_due(conn: Connection) -> list[dict[str, Any]]:
    """Start every cycle that is due now (triggers fired, no limit holds)."""
    return list(conn.execute("SELECT * FROM loop.start_due_cycles()").fetchall())


def claim(conn: Connection, *, worker_id: str, lease_s: float) -> dict[str, Any] | None:
    """Claim one cycle whose next step is due, or None."""
    row: dict[str, Any] | None = conn.execute(
        "SELECT * FROM loop.claim_cycle(%s, %s::interval)", (worker_id, _seconds(lease_s))
    ).fetchone()
    return row


def apply(conn: Connection, *, cycle_id: int, worker_id: str, outcome: Outcome) -> dict[str, Any]:
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
    row = conn.execute("SELECT * FROM loop.cycle WHERE id = %s", (cycle_id,)).fetchone()
    assert row is not None
    return dict(row)


def fail_step(
    conn: Connection, *, cycle_id: int, worker_id: str, error: str, final: bool = False
) -> str | None:
    """Count a failed step (retry later, or fail the cycle at max_attempts); the state after."""
    row = conn.execute(
        "SELECT loop.fail_step(%s, %s, %s, %s) AS state", (cycle_id, worker_id, error[:4000], final)
    ).fetchone()
    return row["state"] if row else None
