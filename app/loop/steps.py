"""One step of a cycle per state, through the services REST uses.

Each step runs in the transaction that records its outcome, so what it makes (a snapshot, a
training run, a canary, a promotion) and the cycle's new state commit together: a worker that
dies mid-step leaves nothing half done, and the next worker resumes from the stored state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg

from app.adapters import service as adapters
from app.core.db import Connection
from app.core.errors import CftError
from app.core.metrics import LOOP_CYCLES_FINISHED, LOOP_STATE_SECONDS
from app.datasets import service as datasets
from app.loop import cycles, decision, offline
from app.loop.cycles import Cycle, Outcome
from app.loop.method import (
    SETTINGS_LADDER,
    NothingToTeach,
    SignalCounts,
    choose_method,
    hyperparameters,
)
from app.loop.service import TERMINAL, jsonable
from app.training import service as training
from app.training.methods import Hyperparameters
from app.training.schemas import TrainingRunCreate

log = logging.getLogger("cft.loop")

POLL_S = 5.0  # how soon a waiting step is checked again
DECIDE_POLL_S = 15.0
# Evaluations of one candidate before a cycle whose evaluation cannot compute fails.
EVAL_TRIES = 3


def _actor(c: Cycle) -> str:
    return f"loop cycle {c.id}"


def _counts(conn: Connection, c: Cycle, since: datetime | None) -> SignalCounts:
    row = conn.execute(
        "SELECT edits, thumbs_up, thumbs_down, regen_pairs, pairs"
        " FROM loop.signal_counts(%s, %s, %s)",
        (c.tenant_id, c.route, since),
    ).fetchone()
    assert row is not None
    return SignalCounts(**{k: int(v) for k, v in row.items()})


def _retire(conn: Connection, *, adapter_id: str, reason: str) -> None:
    """Take a candidate or canary out (the plain UPDATE; the audit records the reason)."""
    conn.execute("SELECT set_config('cft.reason', %s, true)", (reason,))
    conn.execute(
        "UPDATE serve.adapter SET status = 'retired', traffic_pct = 0"
        " WHERE id = %s AND status IN ('candidate', 'canary')",
        (adapter_id,),
    )
    conn.execute("SELECT set_config('cft.reason', '', true)")


def step_triggered(conn: Connection, c: Cycle) -> Outcome:
    """Choose the method from the whole signal of the snapshot window (app.loop.method)."""
    p = c.policy
    datasets.refresh_candidates(conn)
    prev = conn.execute(
        "SELECT max(created_at) AS at FROM loop.cycle"
        " WHERE tenant_id = %s AND route = %s AND id < %s",
        (c.tenant_id, c.route, c.id),
    ).fetchone()
    new = _counts(conn, c, prev["at"] if prev else None)
    total = _counts(conn, c, None)
    counts = {"new": new.as_dict(), "total": total.as_dict()}
    prod_id = adapters.current_prod(conn, tenant_id=c.tenant_id, route=c.route)
    prod = adapters.get_adapter(conn, adapter_id=prod_id) if prod_id else None
    try:
        method, why = choose_method(
            total,
            pinned=p.get("method"),
            memory_tight=bool(p.get("memory_tight")),
            trigger=c.trigger,
            prod_method=prod.method if prod else None,
        )
    except NothingToTeach as exc:
        return Outcome(
            "failed",
            {"signal_counts": counts, "error": str(exc), "current_prod_id": prod_id},
            {"signal_counts": counts},
            "nothing to learn from",
        )
    return Outcome(
        "snapshot",
        {
            "method": method,
            "method_reason": why,
            "signal_counts": counts,
            "current_prod_id": prod_id,
        },
        {"signal_counts": counts, "method": method},
        why,
    )


def step_snapshot(conn: Connection, c: Cycle) -> Outcome:
    """Freeze a fresh snapshot (datasets service) and scale the hyperparameters to it."""
    snap = datasets.create_snapshot(
        conn, tenant_id=c.tenant_id, route=c.route, method=c.chosen_method, created_by=_actor(c)
    )
    got = {"snapshot_id": str(snap.id), "snapshot_counts": snap.counts,
           "n_train": snap.n_train, "n_eval": snap.n_eval}  # fmt: skip
    if not snap.n_train:
        return Outcome(
            "failed",
            got | {"error": f"snapshot {snap.id} has no {c.method} training examples"},
            got,
            "nothing to train on",
        )
    hp = _settings(c, snap.n_train, attempt=0)
    return Outcome(
        "training",
        got | {"hyperparameters": hp, "settings_tried": []},
        got | {"hyperparameters": hp},
        f"snapshot {snap.id}: {snap.n_train} train / {snap.n_eval} eval",
    )


def _settings(c: Cycle, n_train: int, *, attempt: int) -> dict[str, Any]:
    """The settings of the cycle's attempt-th training run (the policy's overrides last)."""
    overrides = (c.policy or {}).get("hyperparameters") or {}
    return hyperparameters(c.chosen_method, n_train, overrides, attempt=attempt)


def _training_slots(conn: Connection, c: Cycle) -> str | None:
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE tenant_id = %s) AS tenant, count(*) AS total"
        " FROM train.training_run WHERE status IN ('queued', 'running')",
        (c.tenant_id,),
    ).fetchone()
    cap = conn.execute("SELECT max_concurrent_training AS n FROM loop.control").fetchone()
    assert row is not None and cap is not None
    mine = int(c.policy["max_concurrent_training"])
    if row["tenant"] >= mine:
        return f"waiting for a training slot: {row['tenant']} of {mine} runs of the tenant"
    if row["total"] >= cap["n"]:
        return f"waiting for a training slot: {row['total']} of {cap['n']} runs on the platform"
    return None


def step_training(conn: Connection, c: Cycle) -> Outcome:
    """Enqueue the run once (training service), then wait for the trainer."""
    if c.training_run_id is None:
        busy = _training_slots(conn, c)
        if busy:
            return Outcome(None, note=busy, delay_s=POLL_S)
        body = TrainingRunCreate(
            route=c.route,
            method=c.method,
            snapshot_id=c.snapshot_id,
            hyperparameters=Hyperparameters(**(c.hyperparameters or {})),
        )
        run = training.enqueue(conn, tenant_id=c.tenant_id, body=body, actor=_actor(c))
        return Outcome(
            None, {"training_run_id": str(run.id)}, note=f"training run {run.id} queued",
            delay_s=POLL_S,
        )  # fmt: skip
    run = training.get_or_raise(conn, run_id=UUID(str(c.training_run_id)))
    if run.status == "succeeded":
        return Outcome(
            "evaluating", {"adapter_id": run.adapter_id},
            {"training_run_id": str(run.id), "progress": run.progress},
            f"adapter {run.adapter_id} trained",
        )  # fmt: skip
    if run.status in ("failed", "cancelled"):
        return Outcome(
            "failed", {"error": f"training run {run.id} {run.status}: {run.error}"},
            {"training_run_id": str(run.id)}, f"training run {run.status}",
        )  # fmt: skip
    prog = run.progress or {}
    step = f", step {prog.get('step')}/{prog.get('total_steps', '?')}" if prog.get("step") else ""
    return Outcome(None, note=f"training run {run.id} {run.status}{step}", delay_s=POLL_S)


def _eval_retry(conn: Connection, c: Cycle, why: str) -> Outcome:
    """An evaluation that could not compute is the platform's failure, not the candidate's:
    evaluate again, and after EVAL_TRIES end the cycle `failed` (no cool-down follows)."""
    tries = conn.execute(
        "SELECT count(*) AS n FROM train.eval_request WHERE adapter_id = %s", (c.candidate,)
    ).fetchone()
    n = int(tries["n"]) if tries else 0
    if n >= EVAL_TRIES:
        _retire(conn, adapter_id=c.candidate, reason=f"{_actor(c)}: evaluation failed")
        return Outcome(
            "failed",
            {"error": f"evaluation of {c.candidate} could not compute after {n} tries: {why}"},
            {"eval_error": why},
            "evaluation failed (the platform's, not the candidate's)",
        )
    conn.execute(
        "INSERT INTO train.eval_request (tenant_id, adapter_id, requested_by)"
        " VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
        (c.tenant_id, c.candidate, f"{_actor(c)}: retry ({why})"[:500]),
    )
    note = f"evaluating again ({n} of {EVAL_TRIES} tries): {why}"
    return Outcome(None, note=note, delay_s=POLL_S)


def _tried(c: Cycle, gain: offline.OfflineGain) -> list[dict[str, Any]]:
    """The cycle's settings tried so far, with this run's (its held-out numbers and verdict)."""
    this = {
        "hyperparameters": c.hyperparameters,
        "adapter_id": c.candidate,
        "training_run_id": str(c.training_run_id),
        "offline": gain.numbers,
        "gain": gain.ok,
        "reason": gain.reason,
        "kept": False,
    }
    return [*(c.settings_tried or []), this]


def _sweep(conn: Connection, c: Cycle, got: dict[str, Any], gain: offline.OfflineGain) -> Outcome:
    """The settings sweep: keep the best setting with a held-out gain so far (retire the
    others), train the next setting of the ladder while the best is unfinished, then open the
    canary with the best, or reject when no setting gained."""
    tried = _tried(c, gain)
    gained = [x for x in tried if x.get("gain", x["kept"])]
    best = max(gained, key=lambda x: offline.mean_gain(x["offline"])) if gained else None
    for x in tried:
        if x["kept"] and x is not best:  # an earlier best, now beaten
            _retire(
                conn, adapter_id=x["adapter_id"], reason=f"{_actor(c)}: a later setting beat it"
            )
        x["kept"] = x is best
    if best is not tried[-1]:
        _retire(conn, adapter_id=c.candidate, reason=f"{_actor(c)}: {gain.reason}")
    attempt = len(tried)
    more = attempt < len(SETTINGS_LADDER)
    if more and (best is None or offline.unfinished(best["offline"])):
        hp = _settings(c, int(c.n_train or 1), attempt=attempt)
        again = {
            "settings_tried": tried,
            "hyperparameters": hp,
            "training_run_id": None,
            "adapter_id": None,
        }
        why = (
            gain.reason
            if best is None
            else f"best so far {best['adapter_id']} passes under"
            f" {offline.SWEEP_UNTIL_PASS_RATE:g} of a suite"
        )
        note = f"{why}: training setting {attempt + 1} of {len(SETTINGS_LADDER)}"
        return Outcome("training", got | again, got | {"hyperparameters": hp}, note)
    if best is None:
        why = f"{gain.reason} (after {attempt} settings)"
        verdict = {
            "settings_tried": tried,
            "decision": "reject",
            "decision_code": "no_offline_gain",
            "decision_reason": why,
        }
        return Outcome("rejected", got | verdict, got, why)
    if best is not tried[-1]:  # an earlier setting stays the best: the canary is that one
        got = got | {
            "eval_scores": adapters.counted_scores(conn, adapter_id=best["adapter_id"]),
            "offline": best["offline"],
        }
    keep = {
        "settings_tried": tried,
        "adapter_id": best["adapter_id"],
        "training_run_id": best["training_run_id"],
        "hyperparameters": best["hyperparameters"],
    }
    n = len(gained)
    why = f"setting {tried.index(best) + 1} of {attempt} kept ({n} gained)"
    return Outcome("canary", got | keep, got, f"{why}: {best['reason']}")


def step_evaluating(conn: Connection, c: Cycle) -> Outcome:
    """Wait for the evaluator's scores, ask the gate (adapters.blockers), then require an
    offline gain over what the route serves now before any user sees the candidate."""
    req = conn.execute(
        "SELECT status, error FROM train.eval_request WHERE adapter_id = %s"
        " ORDER BY id DESC LIMIT 1",
        (c.candidate,),
    ).fetchone()
    if req is not None and req["status"] == "failed":
        return _eval_retry(conn, c, f"the evaluator failed: {req['error']}")
    if req is None or req["status"] != "done":
        age = datetime.now(UTC) - c.state_entered_at
        timeout = timedelta(seconds=float(c.policy["eval_timeout"]))
        if age > timeout:
            return Outcome(
                "failed",
                {"error": f"no eval results for {c.candidate} after {timeout}"
                          " (is the evaluator running?)"},
            )  # fmt: skip
        state = req["status"] if req else "not claimed yet"
        return Outcome(None, note=f"waiting for the evaluator ({state})", delay_s=POLL_S)
    current = adapters.current_prod(conn, tenant_id=c.tenant_id, route=c.route)
    scores = adapters.counted_scores(conn, adapter_id=c.candidate)
    found = adapters.blockers(conn, candidate=c.candidate, current=current)
    unscored = offline.unscored(conn, c.candidate, found)
    if unscored:
        return _eval_retry(conn, c, f"no score for {'; '.join(unscored)}")
    got = {
        "eval_scores": scores,
        "blockers": [b.model_dump() for b in found],
        "current_prod_id": current,
    }
    if found:
        why = "; ".join(
            (f"{b.suite_id}/{b.metric}: " if b.metric else "") + b.reason for b in found
        )
        _retire(conn, adapter_id=c.candidate, reason=f"{_actor(c)}: the gate refused: {why}")
        return Outcome(
            "rejected",
            got | {"decision": "reject", "decision_code": "gate", "decision_reason": why},
            got, f"the gate refused: {why}",
        )  # fmt: skip
    if c.trigger == "forget":  # like for like without the forgotten rows: no gain required
        return Outcome("canary", got, got, f"the gate holds over {current or 'no prod'}")
    margin = float(c.policy["min_offline_gain"])
    gain = offline.offline_gain(conn, adapter_id=c.candidate, current=current, margin=margin)
    got |= {"offline": gain.numbers}
    return _sweep(conn, c, got, gain)


def _promote(conn: Connection, c: Cycle, got: dict[str, Any], why: str) -> Outcome:
    """Promote through the gate (the plain UPDATE, the cycle in cft.reason), then watch."""
    try:
        row = adapters.promote(
            conn, adapter_id=c.candidate, reason=f"{_actor(c)}: {why}", actor=_actor(c)
        )
    except CftError as exc:
        _retire(conn, adapter_id=c.candidate, reason=f"{_actor(c)}: the gate refused")
        got |= {"decision": "reject", "decision_code": "gate_refused",
                "decision_reason": f"{why}; the gate refused: {exc.message}"}  # fmt: skip
        return Outcome("rejected", got, got, exc.message)
    window = timedelta(seconds=float(c.policy["watch_window"]))
    promoted_at = row.promoted_at
    assert promoted_at is not None, "the database stamps every promotion"
    got |= {
        "decision": "promote",
        "previous_prod_id": row.previous_prod_id,
        "promoted_at": promoted_at,
        "watch_until": promoted_at + window,
    }
    inputs = dict(got)
    if c.forget_request_id:
        fr = conn.execute(
            "SELECT created_at FROM auth.forget_request WHERE id = %s", (c.forget_request_id,)
        ).fetchone()
        if fr:  # forget request -> a clean adapter serving
            inputs["forget_to_live_s"] = (promoted_at - fr["created_at"]).total_seconds()
    return Outcome(
        "watching" if window.total_seconds() > 0 else "promoted",
        got, inputs, f"promoted over {row.previous_prod_id or 'no prod'}: {why}",
    )  # fmt: skip


def step_canary(conn: Connection, c: Cycle) -> Outcome:
    """Open the canary at the policy's share, within the route's ceiling (adapters.start_canary).

    A forget cycle skips the experiment: the tainted prod is replaced as soon as the gate holds
    (the watch still guards the replacement)."""
    if c.trigger == "forget":
        why = "forget: the tainted prod is replaced as soon as the gate holds"
        return _promote(conn, c, {"decision_code": "forget", "decision_reason": why}, why)
    row = conn.execute(
        "SELECT r.max_canary_pct - coalesce((SELECT sum(a.traffic_pct) FROM serve.adapter a"
        " WHERE a.tenant_id = r.tenant_id AND a.route = r.name AND a.status = 'canary'"
        " AND a.id <> %s), 0) AS room"
        " FROM serve.route r WHERE r.tenant_id = %s AND r.name = %s",
        (c.candidate, c.tenant_id, c.route),
    ).fetchone()
    assert row is not None
    pct = min(float(c.policy["canary_pct"]), float(row["room"]))
    if pct <= 0:
        return Outcome(
            None, note="waiting: other canaries fill the route's ceiling", delay_s=POLL_S
        )
    try:
        adapters.start_canary(
            conn, adapter_id=c.candidate, traffic_pct=pct,
            reason=f"{_actor(c)}: canary at {pct:g} %", actor=_actor(c),
        )  # fmt: skip
    except CftError as exc:
        _retire(conn, adapter_id=c.candidate, reason=f"{_actor(c)}: canary refused")
        return Outcome(
            "rejected",
            {
                "decision": "reject",
                "decision_code": "canary_refused",
                "decision_reason": exc.message,
            },
            note=exc.message,
        )
    now = conn.execute("SELECT now() AS now").fetchone()
    assert now is not None
    return Outcome(
        "deciding", {"canary_pct": pct, "canary_started_at": now["now"]}, {"canary_pct": pct},
        f"canary {c.candidate} at {pct:g} %",
    )  # fmt: skip


def step_deciding(conn: Connection, c: Cycle) -> Outcome:
    """Decide on the canary (app.loop.decision): promote through the gate, retire, or wait."""
    d = decision.decide_canary(conn, cycle_id=c.id)
    got = {"experiment": d.numbers, "decision_code": d.code, "decision_reason": d.reason}
    if d.decision == "continue":
        return Outcome(None, {"experiment": d.numbers}, note=d.reason, delay_s=DECIDE_POLL_S)
    if d.decision == "retire":
        _retire(conn, adapter_id=c.candidate, reason=f"{_actor(c)}: {d.reason}")
        return Outcome("rejected", got | {"decision": "retire"}, got, d.reason)
    return _promote(conn, c, got, d.reason)


def step_watching(conn: Connection, c: Cycle) -> Outcome:
    """Watch the new prod's guards; roll back on a significant regression."""
    if adapters.current_prod(conn, tenant_id=c.tenant_id, route=c.route) != c.candidate:
        return Outcome("promoted", note="no longer prod (changed outside the loop): watch ended")
    w = decision.watch(conn, cycle_id=c.id)
    if w.regressed:
        reason = f"{_actor(c)}: guard {w.metric} regressed: {w.reason}"
        prev = conn.execute("SELECT serve.previous_prod(%s) AS id", (c.candidate,)).fetchone()
        if prev and prev["id"]:
            adapters.rollback(conn, adapter_id=c.candidate, reason=reason, actor=_actor(c))
            note = f"rolled back to {prev['id']}: {w.reason}"
        else:  # nothing fit to restore (first prod, or a tainted predecessor): back to the base
            conn.execute("SELECT set_config('cft.reason', %s, true)", (reason,))
            conn.execute(
                "UPDATE serve.adapter SET status = 'retired' WHERE id = %s", (c.candidate,)
            )
            note = f"retired (no previous prod fit to serve; the base serves): {w.reason}"
        got = {"watch": w.numbers, "decision": "rollback", "decision_code": f"guard_{w.metric}",
               "decision_reason": w.reason}  # fmt: skip
        return Outcome("rolled_back", got, got, note)
    if w.done:
        return Outcome("promoted", {"watch": w.numbers}, {"watch": w.numbers}, w.reason)
    return Outcome(None, {"watch": w.numbers}, note=w.reason, delay_s=POLL_S)


STEPS: dict[str, Callable[[Connection, Cycle], Outcome]] = {
    "triggered": step_triggered,
    "snapshot": step_snapshot,
    "training": step_training,
    "evaluating": step_evaluating,
    "canary": step_canary,
    "deciding": step_deciding,
    "watching": step_watching,
}


def run_step(conn: Connection, c: Cycle) -> Outcome:
    """The step of a claimed cycle's state, under the route's policy now (intervals in seconds;
    the row keeps the policy it started under)."""
    policy = conn.execute(
        "SELECT * FROM loop.effective_policy(%s, %s)", (c.tenant_id, c.route)
    ).fetchone()
    return STEPS[c.state](conn, replace(c, policy=jsonable(dict(policy or {}))))


def drive_one(conn: Connection, *, worker_id: str, lease_s: float) -> Cycle | None:
    """Claim one due cycle and run its step; returns the cycle after it (None: none was due).

    conn must not be in autocommit mode: the claim, then the step with its outcome, then a
    failure's bookkeeping are each one transaction."""
    with conn.transaction():
        c = cycles.claim(conn, worker_id=worker_id, lease_s=lease_s)
    if c is None:
        return None
    started = time.monotonic()
    try:
        with conn.transaction():
            outcome = run_step(conn, c)
            after = cycles.apply(conn, cycle_id=c.id, worker_id=worker_id, outcome=outcome)
    except (CftError, psycopg.Error, ValueError) as exc:
        message = exc.message if isinstance(exc, CftError) else f"{type(exc).__name__}: {exc}"
        log.warning("cycle %s (%s): step failed: %s", c.id, c.state, message)
        with conn.transaction():
            cycles.fail_step(conn, cycle_id=c.id, worker_id=worker_id, error=message)
            after = cycles.get(conn, cycle_id=c.id)
    if after.state != c.state:
        LOOP_STATE_SECONDS.labels(c.state).observe(
            (after.updated_at - c.state_entered_at).total_seconds()
        )
        log.info("cycle %s %s: %s -> %s", c.id, c.route, c.state, after.state)
        if after.state in TERMINAL:
            LOOP_CYCLES_FINISHED.labels(after.state).inc()
    log.debug("cycle %s step took %.2f s", c.id, time.monotonic() - started)
    return after
