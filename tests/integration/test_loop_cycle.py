"""A loop cycle step by step on real rows, through the services REST uses: snapshot, training
run (the trainer and evaluator simulated by what they write), gate, canary, decision, promotion,
watch and rollback; resume after a lost lease, failure after max attempts; forgetting heals."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from app.loop import cycles, steps
from app.loop.cycles import Cycle
from tests.support.factories import make_adapter, make_log, make_route, make_tenant
from tests.support.loop import finish_eval, finish_training, make_due, refresh, set_policy, user

SUITE = "house-style/pass_rate"


@pytest.fixture
def work(db_url: str) -> Any:
    """A transaction-mode connection, as the loop worker uses."""
    with psycopg.connect(db_url, row_factory=dict_row) as c:
        yield c


def drive(work: Any, conn: Any, cycle_id: int) -> Cycle:
    make_due(conn, cycle_id)
    got = steps.drive_one(work, worker_id="w1", lease_s=60)
    assert got is not None and got.id == cycle_id
    return got


def world(conn: Any, **policy: Any) -> tuple[Any, Any, Any]:
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    prod = make_adapter(conn, route=r, status="prod", traffic_pct=100)
    finish_eval(conn, prod["id"], {SUITE: 0.5})
    set_policy(conn, r, **({"min_new_examples": 3, "decision_min_n": 20, "canary_pct": 20,
                            "watch_min_n": 20} | policy))  # fmt: skip
    for i in range(4):
        make_log(conn, tenant_id=t["id"], route=r["name"], fb_edited=True, user_hash=user(f"u{i}"),
                 messages=[{"role": "user", "content": f"how do I {i}?"}],
                 edited_completion=f"Like this: {i}.")  # fmt: skip
    refresh(conn)
    return t, r, prod


def evaluate(conn: Any, c: Cycle, pass_rate: float, loss: float = 1.0) -> None:
    """The evaluator's rows: the task suite and the held-out loss of the candidate's split (for
    the prod too, like for like)."""
    heldout = f"heldout:{c.snapshot_id}/loss"
    finish_eval(conn, c.candidate, {SUITE: pass_rate, heldout: loss})
    prod = conn.execute(
        "SELECT id FROM serve.adapter WHERE route = %s AND status = 'prod'", (c.route,)
    ).fetchone()
    if prod:
        conn.execute(
            "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score, judge_model)"
            " VALUES (%s, %s, 'loss', 1.0, NULL) ON CONFLICT DO NOTHING",
            (prod["id"], heldout.split("/")[0]),
        )


def to_deciding(conn: Any, work: Any, r: Any) -> Cycle:
    (c,) = cycles.start_due(conn)
    assert drive(work, conn, c.id).state == "snapshot"
    c = drive(work, conn, c.id)
    assert c.state == "training" and c.method == "sft" and c.n_train >= 1, c
    assert c.hyperparameters["learning_rate"] == 2e-3 and c.hyperparameters["max_steps"] >= 8
    c = drive(work, conn, c.id)  # enqueues the run, waits
    assert c.state == "training" and c.training_run_id is not None
    run = conn.execute(
        "SELECT * FROM train.training_run WHERE id = %s", (c.training_run_id,)
    ).fetchone()
    assert run["snapshot_id"] == c.snapshot_id and run["created_by"] == f"loop cycle {c.id}"
    c = drive(work, conn, c.id)  # still training: the same run, no second one
    assert conn.execute("SELECT count(*) AS n FROM train.training_run").fetchone()["n"] == 1
    adapter = finish_training(conn, c.training_run_id)
    c = drive(work, conn, c.id)
    assert (c.state, c.adapter_id) == ("evaluating", adapter)
    c = drive(work, conn, c.id)
    assert c.state == "evaluating" and "evaluator" in c.waiting_for
    evaluate(conn, c, 0.9)
    c = drive(work, conn, c.id)
    assert c.state == "canary" and c.blockers == [], (c.decision_reason, c.error)
    c = drive(work, conn, c.id)
    assert c.state == "deciding" and float(c.canary_pct) == 20
    a = conn.execute(
        "SELECT status, traffic_pct FROM serve.adapter WHERE id = %s", (adapter,)
    ).fetchone()
    assert a["status"] == "canary" and float(a["traffic_pct"]) == 20
    return c


def arm(
    conn: Any, t: Any, r: Any, adapter: str, variant: str, up: int, down: int, **over: Any
) -> None:
    for i in range(up + down):
        make_log(conn, tenant_id=t["id"], route=r["name"], adapter_id=adapter, experiment=r["name"],
                 variant=variant, fb_explicit=1 if i < up else -1,
                 user_hash=user(f"{adapter}-{i}"), **over)  # fmt: skip


def experiment(
    conn: Any, t: Any, r: Any, prod: str, canary: str, prod_up: int, canary_up: int, n: int = 30
) -> None:
    """Both arms' traffic interleaved, as a live split gives it: n rated rows each, A = prod."""
    for i in range(n):
        for adapter, variant, up in ((prod, "A", prod_up), (canary, "B", canary_up)):
            make_log(conn, tenant_id=t["id"], route=r["name"], adapter_id=adapter,
                     experiment=r["name"], variant=variant, fb_explicit=1 if i < up else -1,
                     user_hash=user(f"{adapter}-{i}"))  # fmt: skip


def test_a_cycle_goes_from_traffic_to_a_watched_promotion(conn, work):
    t, r, prod = world(conn)
    c = to_deciding(conn, work, r)
    c = drive(work, conn, c.id)
    assert c.state == "deciding" and c.waiting_for.startswith("no traffic of canary")
    experiment(conn, t, r, prod["id"], c.adapter_id, prod_up=8, canary_up=27)
    c = drive(work, conn, c.id)
    assert c.state == "watching", c
    # The always-valid rule (serve.canary_decision) decided, not the fixed-horizon reading.
    assert (c.decision, c.decision_code) == ("promote", "significantly_better")
    primary = c.experiment["always_valid"]["primary"]
    assert c.previous_prod_id == prod["id"] and primary["significant"] and primary["p_value"] < 0.05
    ev = conn.execute(
        "SELECT reason FROM serve.adapter_event WHERE adapter_id = %s AND new_status = 'prod'",
        (c.adapter_id,),
    ).fetchone()
    assert ev["reason"].startswith(f"loop cycle {c.id}: canary significantly better")
    c = drive(work, conn, c.id)
    assert c.state == "watching" and c.waiting_for.startswith(
        ("no guard broken yet", "n ")  # watching, or too few rows since the promotion
    ), c.waiting_for
    conn.execute("UPDATE loop.cycle SET watch_until = now() - interval '1 second'")
    c = drive(work, conn, c.id)
    assert c.state == "promoted" and c.finished_at is not None
    steps_seen = {row["step"] for row in conn.execute(
        "SELECT step FROM loop.provenance(%s)", (c.adapter_id,))}  # fmt: skip
    assert {
        "adapter",
        "cycle",
        "trigger",
        "snapshot",
        "example",
        "log_row",
        "eval",
        "gate",
        "experiment",
        "decision",
        "watch",
        "cycle_event",
        "adapter_event",
    } <= steps_seen
    states = [e["to_state"] for e in conn.execute(
        "SELECT to_state FROM loop.cycle_event WHERE cycle_id = %s ORDER BY id", (c.id,))]  # fmt: skip
    assert states == ["triggered", "snapshot", "training", "evaluating", "canary", "deciding",
                      "watching", "promoted"]  # fmt: skip


def test_a_guard_regression_after_promotion_rolls_back(conn, work):
    t, r, prod = world(conn)
    c = to_deciding(conn, work, r)
    experiment(conn, t, r, prod["id"], c.adapter_id, prod_up=8, canary_up=27)
    c = drive(work, conn, c.id)
    assert c.state == "watching"
    # After the promotion, users regenerate three answers in four of the new prod (none of the
    # previous prod's before it): beyond the guard's margin even for the always-valid interval.
    for i in range(40):
        make_log(conn, tenant_id=t["id"], route=r["name"], adapter_id=c.adapter_id,
                 fb_regen=i % 4 != 0)  # fmt: skip
    c = drive(work, conn, c.id)
    assert c.state == "rolled_back" and c.decision == "rollback", c.waiting_for
    assert c.decision_code == "guard_regen" and c.watch["guards"]["tripped"] == ["regen"]
    now = conn.execute("SELECT id FROM serve.adapter WHERE route = %s AND status = 'prod'",
                       (r["name"],)).fetchone()  # fmt: skip
    assert now["id"] == prod["id"]
    reasons = [e["reason"] for e in conn.execute(
        "SELECT reason FROM serve.adapter_event WHERE adapter_id = %s ORDER BY id", (c.adapter_id,))]  # fmt: skip
    assert any(f"loop cycle {c.id}: guard regen regressed" in (x or "") for x in reasons)


def test_a_canary_that_loses_is_retired(conn, work):
    t, r, prod = world(conn)
    c = to_deciding(conn, work, r)
    experiment(conn, t, r, prod["id"], c.adapter_id, prod_up=27, canary_up=8)
    c = drive(work, conn, c.id)
    assert (c.state, c.decision, c.decision_code) == (
        "rejected",
        "retire",
        "significantly_worse",
    )
    a = conn.execute("SELECT status FROM serve.adapter WHERE id = %s", (c.adapter_id,)).fetchone()
    assert a["status"] == "retired"


def test_the_gate_rejects_a_worse_candidate_before_any_canary(conn, work):
    _, _r, _ = world(conn)
    (c,) = cycles.start_due(conn)
    for _ in range(3):
        c = drive(work, conn, c.id)
    finish_training(conn, c.training_run_id)
    c = drive(work, conn, c.id)
    evaluate(conn, c, 0.2)
    c = drive(work, conn, c.id)
    assert (c.state, c.decision, c.decision_code) == ("rejected", "reject", "gate")
    assert "regression" in c.decision_reason


def test_a_lost_lease_resumes_in_the_stored_state_then_fails_readably(conn, work):
    _, _r, _ = world(conn)
    (c,) = cycles.start_due(conn)
    drive(work, conn, c.id)  # -> snapshot
    conn.execute("UPDATE loop.cycle SET max_attempts = 2")
    # Worker "dead" claims it and stops (as if SIGKILLed mid-step): nothing of its step commits.
    dead = conn.execute("SELECT * FROM loop.claim_cycle('dead', '0.2 seconds')").fetchone()
    assert dead["state"] == "snapshot"
    assert conn.execute("SELECT * FROM loop.claim_cycle('w1', '1 minute')").fetchone() is None
    time.sleep(0.3)
    c = steps.drive_one(work, worker_id="w1", lease_s=0.2)
    assert c is not None and c.state == "training" and c.attempts == 1
    assert "worker dead stopped in state snapshot" in c.error
    assert conn.execute("SELECT count(*) AS n FROM train.dataset_snapshot").fetchone()["n"] == 1
    # The next holder dies too: max_attempts (2) reached, the cycle fails and says why.
    make_due(conn, c.id)
    conn.execute("SELECT * FROM loop.claim_cycle('dead2', '0.1 seconds')")
    time.sleep(0.2)
    assert conn.execute("SELECT * FROM loop.claim_cycle('w1', '1 minute')").fetchone() is None
    c = conn.execute("SELECT * FROM loop.cycle WHERE id = %s", (c.id,)).fetchone()
    assert c["state"] == "failed"
    assert c["error"].startswith("worker dead2 stopped in state training")
    assert "gave up after 2 attempts" in c["error"]


def test_a_sigkilled_worker_process_leaves_the_cycle_to_the_next(conn, db_url, work):
    import signal
    import subprocess
    import sys

    _, _r, _ = world(conn)
    (_c,) = cycles.start_due(conn)
    code = (
        "import psycopg, time; from psycopg.rows import dict_row\n"
        f"c = psycopg.connect({db_url!r}, autocommit=True, row_factory=dict_row)\n"
        "c.execute(\"SELECT * FROM loop.claim_cycle('victim', '1 second')\")\n"
        "print('claimed', flush=True); time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "claimed"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    time.sleep(1.1)
    got = steps.drive_one(work, worker_id="w1", lease_s=60)
    assert got is not None and got.state == "snapshot" and got.attempts == 1
    assert "worker victim stopped in state triggered" in got.error


def test_forgetting_heals_the_prod(conn, work):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    set_policy(conn, r, min_new_examples=1000, watch_window=timedelta(hours=1))
    logs = [make_log(conn, tenant_id=t["id"], route=r["name"], fb_edited=True,
                     user_hash=user("gone" if i < 2 else f"keep{i}"),
                     messages=[{"role": "user", "content": f"question {i}?"}],
                     edited_completion=f"answer {i}.") for i in range(6)]  # fmt: skip
    gone = {x["id"] for x in logs[:2]}
    refresh(conn)
    with conn.transaction():
        snap = conn.execute(
            "SELECT * FROM train.create_snapshot(%s, %s, 'sft')", (t["id"], r["name"])
        ).fetchone()
    prod = make_adapter(
        conn, route=r, status="prod", traffic_pct=100, dataset_snapshot_id=snap["id"]
    )
    finish_eval(conn, prod["id"], {SUITE: 0.6})
    with conn.transaction():
        conn.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(t["id"]),))
        conn.execute("SELECT * FROM auth.forget_user(%s)", (user("gone"),))
    assert conn.execute("SELECT tainted_at FROM serve.adapter WHERE id = %s",
                        (prod["id"],)).fetchone()["tainted_at"] is not None  # fmt: skip
    (c,) = cycles.start_due(conn)
    assert c.trigger == "forget" and c.forget_request_id is not None
    c = drive(work, conn, c.id)
    assert c.method == "sft" and c.method_reason.startswith("forget")
    c = drive(work, conn, c.id)
    ids = {i for row in conn.execute(
        "SELECT log_ids FROM train.dataset_example WHERE snapshot_id = %s", (c.snapshot_id,))
        for i in row["log_ids"]}  # fmt: skip
    assert ids and not ids & gone
    c = drive(work, conn, c.id)
    adapter = finish_training(conn, c.training_run_id)
    c = drive(work, conn, c.id)
    evaluate(conn, c, 0.6)
    c = drive(work, conn, c.id)
    assert c.state == "canary"
    c = drive(work, conn, c.id)  # a forget cycle replaces the tainted prod at once
    assert c.state == "watching" and c.decision_code == "forget", c
    rows = {a["id"]: a["status"] for a in conn.execute(
        "SELECT id, status FROM serve.adapter WHERE route = %s", (r["name"],))}  # fmt: skip
    assert rows == {prod["id"]: "retired", adapter: "prod"}
    ev = conn.execute(
        "SELECT inputs FROM loop.cycle_event WHERE cycle_id = %s AND to_state = 'watching'",
        (c.id,),
    ).fetchone()
    assert ev["inputs"]["forget_to_live_s"] >= 0
    prov = conn.execute(
        "SELECT detail FROM loop.provenance(%s) WHERE step = 'log_row'", (adapter,)
    ).fetchall()
    assert prov and all(int(p["detail"]["user_hash"] != user("gone").hex()) for p in prov)


def _to_evaluating(conn: Any, work: Any) -> Cycle:
    (c,) = cycles.start_due(conn)
    for _ in range(3):
        c = drive(work, conn, c.id)
    finish_training(conn, c.training_run_id)
    c = drive(work, conn, c.id)
    assert c.state == "evaluating"
    return c


def test_mixed_signal_trains_on_the_edits_not_the_thumbs_down(conn, work):
    """A third of unhappy users edit, the rest rate down: the volume trigger counts the edits
    (what can teach) and the cycle trains SFT on them, never KTO on a set with no desirable
    example."""
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    set_policy(conn, r, min_new_examples=10)
    for i in range(30):
        make_log(conn, tenant_id=t["id"], route=r["name"], fb_explicit=-1, user_hash=user(f"d{i}"),
                 messages=[{"role": "user", "content": f"down {i}?"}])  # fmt: skip
    for i in range(12):
        make_log(conn, tenant_id=t["id"], route=r["name"], fb_edited=True, user_hash=user(f"e{i}"),
                 messages=[{"role": "user", "content": f"edit {i}?"}],
                 edited_completion=f"Dear customer, {i}.")  # fmt: skip
    refresh(conn)
    (c,) = cycles.start_due(conn)
    assert c.trigger == "volume"
    c = drive(work, conn, c.id)
    assert c.method == "sft", c.method_reason
    assert "12 edits" in c.method_reason and "30 thumbs down" in c.method_reason
    c = drive(work, conn, c.id)
    assert c.state == "training" and c.n_train + c.n_eval == 12


def test_a_window_with_nothing_users_wanted_never_trains(conn, work):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    set_policy(conn, r, max_interval=timedelta(seconds=1), min_interval=timedelta(0))
    for i in range(20):
        make_log(conn, tenant_id=t["id"], route=r["name"], fb_explicit=-1,
                 messages=[{"role": "user", "content": f"down {i}?"}])  # fmt: skip
    refresh(conn)
    time.sleep(1.1)
    (c,) = cycles.start_due(conn)
    assert c.trigger == "schedule"
    c = drive(work, conn, c.id)
    assert c.state == "failed" and "nothing to learn from" in c.error
    assert conn.execute("SELECT count(*) AS n FROM train.dataset_snapshot").fetchone()["n"] == 0


def test_an_evaluation_that_cannot_compute_fails_the_cycle_not_the_candidate(conn, work):
    """NaN (no held-out examples, a crash) is the platform's failure: evaluated again, then
    `failed`; never `rejected`, and no cool-down holds the route afterwards."""
    world(conn)
    c = _to_evaluating(conn, work)
    heldout = f"heldout:{c.snapshot_id}/loss"
    finish_eval(conn, c.candidate, {SUITE: 0.9, heldout: float("nan")})
    c = drive(work, conn, c.id)
    assert c.state == "evaluating" and "evaluating again" in c.waiting_for
    assert "not a finite number" in c.waiting_for
    for _ in range(2):  # the evaluator answers again, with NaN again
        conn.execute(
            "UPDATE train.eval_request SET status = 'done', finished_at = now()"
            " WHERE adapter_id = %s AND status = 'queued'",
            (c.adapter_id,),
        )
        c = drive(work, conn, c.id)
    assert c.state == "failed" and c.decision is None, c
    assert "could not compute after 3 tries" in c.error
    limits = {x["limit_name"]: x for x in conn.execute("SELECT * FROM loop.limits(%s, %s)",
                                                        (c.tenant_id, c.route))}  # fmt: skip
    assert not limits["cooldown_after_reject"]["blocking"]


def test_no_canary_without_an_offline_gain_and_every_setting_is_on_the_cycle(conn, work):
    """A candidate no better than the prod on held-out behaviour opens no canary: the next
    setting trains, and after the last the cycle ends rejected with the route unchanged."""
    _, r, prod = world(conn)
    c = _to_evaluating(conn, work)
    first = c.adapter_id
    evaluate(conn, c, 0.52)  # the prod scores 0.5: a gain below min_offline_gain (0.05)
    c = drive(work, conn, c.id)
    assert c.state == "training" and c.training_run_id is None, c
    assert len(c.settings_tried) == 1 and not c.settings_tried[0]["kept"]
    assert c.hyperparameters["learning_rate"] == pytest.approx(5e-3)  # the ladder's next
    c = drive(work, conn, c.id)  # enqueues the second run
    finish_training(conn, c.training_run_id)
    c = drive(work, conn, c.id)
    evaluate(conn, c, 0.5)
    c = drive(work, conn, c.id)
    assert (c.state, c.decision_code) == ("rejected", "no_offline_gain"), c
    tried = c.settings_tried
    assert [x["adapter_id"] for x in tried] == [first, c.adapter_id]
    assert tried[0]["offline"]["against"] == f"prod {prod['id']}"
    statuses = conn.execute(
        "SELECT DISTINCT new_status FROM serve.adapter_event WHERE adapter_id = ANY(%s)",
        ([first, c.adapter_id],),
    ).fetchall()
    assert "canary" not in {s["new_status"] for s in statuses}
    assert (
        conn.execute(
            "SELECT serve.current_prod(%s, %s) AS p", (r["tenant_id"], r["name"])
        ).fetchone()["p"]
        == (prod["id"])
    )


def _second_setting(conn: Any, work: Any, c: Cycle) -> Cycle:
    c = drive(work, conn, c.id)  # enqueues the next setting's run
    finish_training(conn, c.training_run_id)
    c = drive(work, conn, c.id)
    assert c.state == "evaluating", c
    return c


@pytest.mark.parametrize(("second", "kept"), [(0.8, 1), (0.55, 0)])
def test_a_partial_gain_sweeps_the_next_setting_and_keeps_the_best(conn, work, second, kept):
    """A candidate that gains but passes its suite under 90 % is kept aside while the next
    setting trains; the better of the two (by held-out gain) opens the canary, the other is
    retired, and both are on the cycle."""
    world(conn)
    c = _to_evaluating(conn, work)
    first = c.adapter_id
    evaluate(conn, c, 0.6)  # the prod scores 0.5: a gain, but the suite passes 60 %
    c = drive(work, conn, c.id)
    assert (c.state, c.adapter_id, c.training_run_id) == ("training", None, None), c
    assert [x["kept"] for x in c.settings_tried or []] == [True]
    c = _second_setting(conn, work, c)
    ids = [first, c.adapter_id]
    evaluate(conn, c, second)
    c = drive(work, conn, c.id)
    assert c.state == "canary", (c.decision_reason, c.error)
    assert c.adapter_id == ids[kept]
    assert [x["kept"] for x in c.settings_tried or []] == [i == kept for i in range(2)]
    assert c.hyperparameters == (c.settings_tried or [])[kept]["hyperparameters"]
    rows = conn.execute("SELECT id, status FROM serve.adapter WHERE id = ANY(%s)", (ids,))
    assert {r["id"]: r["status"] for r in rows} == {
        ids[kept]: "candidate",
        ids[1 - kept]: "retired",
    }
    c = drive(work, conn, c.id)
    assert c.state == "deciding"
    assert (
        conn.execute("SELECT status FROM serve.adapter WHERE id = %s", (ids[kept],)).fetchone()[
            "status"
        ]
        == "canary"
    )


def test_a_canary_whose_budget_runs_out_without_a_win_is_retired(conn, work):
    t, r, prod = world(conn, canary_max_duration=timedelta(seconds=1))
    c = to_deciding(conn, work, r)
    experiment(conn, t, r, prod["id"], c.adapter_id, prod_up=15, canary_up=16)
    time.sleep(1.1)
    c = drive(work, conn, c.id)
    assert (c.state, c.decision, c.decision_code) == (
        "rejected",
        "retire",
        "budget_exhausted",
    ), c
    assert "without a significant win" in c.decision_reason
    assert (
        conn.execute(
            "SELECT serve.current_prod(%s, %s) AS p", (r["tenant_id"], r["name"])
        ).fetchone()["p"]
        == (prod["id"])
    )
