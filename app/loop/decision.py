"""The loop's decisions on live traffic, in one place.

A canary is decided by the always-valid rule of serve.canary_decision (the normal-mixture
mSPRT, valid however often the loop looks) under loop.decision_policy (the route's experiment
policy with the loop policy's metric, alpha and sample floor); while it says `continue`, the
loop's own canary budget (distinct users, duration: loop.canary_verdict) is checked, and a
budget that runs out without a significant win retires the canary: nothing is promoted for
being "not worse", and the route keeps what it serves. A promotion is watched by
serve.watch_decision on the policy's guards against the prod it replaced; a route whose first
adapter replaced the bare base has no previous prod to compare with, and there
loop.watch_verdict's before/after test against the base's traffic stands in.
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


def _cycle(conn: Connection, cycle_id: int) -> dict[str, Any]:
    row = conn.execute(
        "SELECT tenant_id, route, adapter_id, coalesce(watch_until <= now(), false) AS watch_over"
        " FROM loop.cycle WHERE id = %s",
        (cycle_id,),
    ).fetchone()
    assert row is not None, f"no cycle {cycle_id}"
    return dict(row)


def decide_canary(conn: Connection, *, cycle_id: int) -> CanaryDecision:
    """The decision on a cycle's canary now."""
    c = _cycle(conn, cycle_id)
    valid = conn.execute(
        "SELECT * FROM serve.canary_decision(%(t)s, %(r)s, loop.decision_policy(%(t)s, %(r)s))"
        " WHERE canary_id = %(a)s",
        {"t": c["tenant_id"], "r": c["route"], "a": c["adapter_id"]},
    ).fetchone()
    budget = conn.execute("SELECT * FROM loop.canary_verdict(%s)", (cycle_id,)).fetchone()
    assert budget is not None
    budget_numbers = jsonable(budget["numbers"])
    numbers = {
        "rule": "msprt (serve.canary_decision under loop.decision_policy)",
        "always_valid": jsonable(valid["numbers"]) if valid else None,
        "budget": budget_numbers.get("budget"),
        "canary_users": budget_numbers.get("canary_users"),
        "fixed_horizon": budget_numbers.get("metric"),
    }
    if valid is not None and valid["decision"] in ("promote", "retire"):
        return CanaryDecision(valid["decision"], valid["code"], valid["reason"], numbers)
    if (budget_numbers.get("budget") or {}).get("exhausted"):
        why = valid["reason"] if valid is not None else budget["reason"]
        return CanaryDecision(
            "retire",
            "budget_exhausted",
            f"the canary's budget ran out without a significant win ({why})",
            numbers | {"rule": "budget", "fixed_horizon_verdict": budget["decision"]},
        )
    reason = valid["reason"] if valid is not None else budget["reason"]
    code = valid["code"] if valid is not None else budget["code"]
    return CanaryDecision("continue", code, reason, numbers)


def watch(conn: Connection, *, cycle_id: int) -> WatchVerdict:
    """The guards of a newly promoted adapter now."""
    c = _cycle(conn, cycle_id)
    w = conn.execute(
        "SELECT * FROM serve.watch_decision(%(t)s, %(r)s, NULL,"
        " loop.decision_policy(%(t)s, %(r)s))",
        {"t": c["tenant_id"], "r": c["route"]},
    ).fetchone()
    if w is not None and w["code"] != "no_previous_prod" and w["adapter_id"] == c["adapter_id"]:
        code = str(w["code"])
        return WatchVerdict(
            regressed=w["decision"] == "rollback",
            # the loop's own window (loop.cycle.watch_until) ends the watch too
            done=w["decision"] == "keep" or (w["decision"] != "rollback" and c["watch_over"]),
            metric=code.removeprefix("guard_") if w["decision"] == "rollback" else None,
            reason=w["reason"],
            numbers={"rule": "msprt (serve.watch_decision)"} | jsonable(w["numbers"]),
        )
    row = conn.execute("SELECT * FROM loop.watch_verdict(%s)", (cycle_id,)).fetchone()
    assert row is not None
    return WatchVerdict(
        bool(row["regressed"]), bool(row["done"]), row["metric"], row["reason"],
        {"rule": "before/after two-proportion test (loop.watch_verdict)"}
        | jsonable(row["numbers"]),
    )  # fmt: skip
