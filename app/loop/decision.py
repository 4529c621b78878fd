"""The loop's decisions on live traffic, in one place: swap the rule here.

Today both read SQL verdicts built on the fixed-horizon numbers of obs.experiment_compare
(loop.canary_verdict) and a before/after two-proportion test of the guards
(loop.watch_verdict). When the always-valid rule of issue 21 lands (its SQL decision functions
and serve.watch_decision(route)), these two functions call it instead; nothing else changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.db import Connection
from app.loop.service import jsonable


@dataclass(frozen=True)
class CanaryDecision:
    """promote, retire or continue, with the numbers behind it."""

    decision: str
    code: str
    reason: str
    numbers: dict[str, Any]


@dataclass(frozen=True)
class WatchVerdict:
    """After a promotion: has a guard metric regressed, is the window over."""

    regressed: bool
    done: bool
    metric: str | None
    reason: str
    numbers: dict[str, Any]


def decide_canary(conn: Connection, *, cycle_id: int) -> CanaryDecision:
    """The decision on a cycle's canary now."""
    row = conn.execute("SELECT * FROM loop.canary_verdict(%s)", (cycle_id,)).fetchone()
    assert row is not None
    return CanaryDecision(row["decision"], row["code"], row["reason"], jsonable(row["numbers"]))


def watch(conn: Connection, *, cycle_id: int) -> WatchVerdict:
    """The guards of a newly promoted adapter now."""
    row = conn.execute("SELECT * FROM loop.watch_verdict(%s)", (cycle_id,)).fetchone()
    assert row is not None
    return WatchVerdict(
        bool(row["regressed"]), bool(row["done"]), row["metric"], row["reason"],
        jsonable(row["numbers"]),
    )  # fmt: skip
