"""Loop triggers and limits in SQL: each fires at its threshold and not below; pause, the kill
switch and the limits hold new cycles; two workers start and claim one cycle."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from tests.support.factories import make_adapter, make_log, make_route, make_tenant
from tests.support.loop import refresh, set_policy, trigger

DIM = 384


def vec(axis: int) -> str:
    v = ["0"] * DIM
    v[axis] = "1"
    return "[" + ",".join(v) + "]"


def world(conn: Any, **policy: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    set_policy(conn, r, **policy)
    return t, r


def edit(conn: Any, t: dict[str, Any], r: dict[str, Any], text: str, **over: Any) -> dict[str, Any]:
    return make_log(conn, tenant_id=t["id"], route=r["name"], fb_edited=True,
                    edited_completion=f"better {text}",
                    messages=[{"role": "user", "content": text}], **over)  # fmt: skip


def started(conn: Any) -> list[dict[str, Any]]:
    return list(conn.execute("SELECT * FROM loop.start_due_cycles()").fetchall())


def test_volume_fires_at_n_usable_examples_not_below(conn):
    t, r = world(conn, min_new_examples=3)
    edit(conn, t, r, "q1")
    edit(conn, t, r, "q2")
    edit(conn, t, r, "q2")  # same prompt: exact dedup counts it once
    edit(conn, t, r, "q3", pii_flags=1)  # PII: not usable
    refresh(conn)
    v = trigger(conn, r, "volume")
    assert (v["fired"], v["value"], v["threshold"]) == (False, 2, 3)
    assert v["line"].startswith("waiting: 2 of 3 usable examples that can teach")
    assert started(conn) == []
    edit(conn, t, r, "q4")
    refresh(conn)
    v = trigger(conn, r, "volume")
    assert (v["fired"], v["value"]) == (True, 3)
    (cycle,) = started(conn)
    assert cycle["trigger"] == "volume" and cycle["state"] == "triggered"
    assert cycle["trigger_values"]["triggers"]["volume"]["value"] == 3
    # After the cycle, only newer examples count.
    conn.execute("UPDATE loop.cycle SET state = 'failed' WHERE id = %s", (cycle["id"],))
    assert trigger(conn, r, "volume")["value"] == 0


def test_thumbs_down_alone_never_fire_the_volume_trigger(conn):
    """Users who only reject answers give nothing to learn from: 30 thumbs down do not start a
    cycle; what users wanted (an edit, a thumbs-up answer) does count."""
    t, r = world(conn, min_new_examples=3)
    for i in range(30):
        make_log(conn, tenant_id=t["id"], route=r["name"], fb_explicit=-1,
                 messages=[{"role": "user", "content": f"down {i}"}])  # fmt: skip
    refresh(conn)
    v = trigger(conn, r, "volume")
    assert (v["fired"], v["value"]) == (False, 0)
    assert v["detail"]["thumbs_down"] == 30 and v["detail"]["desirable"] == 0
    assert started(conn) == []
    edit(conn, t, r, "q1")
    for i in range(2):
        make_log(conn, tenant_id=t["id"], route=r["name"], fb_explicit=1,
                 messages=[{"role": "user", "content": f"up {i}"}])  # fmt: skip
    refresh(conn)
    v = trigger(conn, r, "volume")
    assert (v["fired"], v["value"]) == (True, 3)
    assert (v["detail"]["edits"], v["detail"]["thumbs_up"]) == (1, 2)


def test_volume_needs_consent(conn):
    t, r = world(conn, min_new_examples=1)
    edit(conn, t, r, "q1")
    refresh(conn)
    conn.execute("UPDATE tenant SET consent_training = false WHERE id = %s", (t["id"],))
    assert trigger(conn, r, "volume")["value"] == 0


def test_schedule_fires_after_max_interval_not_before(conn):
    t, r = world(conn, max_interval=timedelta(hours=1), min_interval=timedelta(0))
    conn.execute(
        "INSERT INTO loop.cycle (tenant_id, route, trigger, state, created_at)"
        " VALUES (%s, %s, 'manual', 'promoted', now() - interval '59 minutes')",
        (t["id"], r["name"]),
    )
    s = trigger(conn, r, "schedule")
    assert not s["fired"] and s["line"].startswith("waiting")
    conn.execute("UPDATE loop.cycle SET created_at = now() - interval '61 minutes'")
    assert trigger(conn, r, "schedule")["fired"]
    (cycle,) = started(conn)
    assert cycle["trigger"] == "schedule"


def _thumbs(conn: Any, t: Any, r: Any, adapter: str, at: datetime, up: int, down: int) -> None:
    for i in range(up + down):
        make_log(conn, tenant_id=t["id"], route=r["name"], adapter_id=adapter,
                 fb_explicit=1 if i < up else -1, created_at=at)  # fmt: skip


def test_decline_fires_on_a_significant_drop_with_enough_rows(conn):
    t, r = world(conn, decline_min_n=40, decline_alpha=0.01, min_new_examples=1000)
    promoted = datetime.now(UTC) - timedelta(days=3)
    prod = make_adapter(conn, route=r, status="prod", traffic_pct=100)
    conn.execute("UPDATE serve.adapter SET promoted_at = %s WHERE id = %s", (promoted, prod["id"]))
    _thumbs(conn, t, r, prod["id"], promoted + timedelta(hours=1), 32, 7)  # 39 rated: below min_n
    _thumbs(conn, t, r, prod["id"], datetime.now(UTC) - timedelta(hours=1), 15, 24)
    d = trigger(conn, r, "decline")
    assert not d["fired"] and "40 each needed" in d["line"]
    _thumbs(conn, t, r, prod["id"], promoted + timedelta(hours=1), 1, 0)  # 40 after promotion
    _thumbs(conn, t, r, prod["id"], datetime.now(UTC) - timedelta(hours=1), 1, 0)
    d = trigger(conn, r, "decline")
    assert d["fired"], d["line"]
    assert d["detail"]["p_value"] < 0.01 and d["value"] < d["threshold"]
    (cycle,) = started(conn)
    assert cycle["trigger"] == "decline"


def test_decline_does_not_fire_on_a_steady_rate(conn):
    t, r = world(conn, decline_min_n=40)
    promoted = datetime.now(UTC) - timedelta(days=3)
    prod = make_adapter(conn, route=r, status="prod", traffic_pct=100)
    conn.execute("UPDATE serve.adapter SET promoted_at = %s WHERE id = %s", (promoted, prod["id"]))
    _thumbs(conn, t, r, prod["id"], promoted + timedelta(hours=1), 30, 10)
    _thumbs(conn, t, r, prod["id"], datetime.now(UTC) - timedelta(hours=1), 28, 12)
    d = trigger(conn, r, "decline")
    assert not d["fired"] and d["line"].startswith("steady")


def _drift_world(conn: Any, far: int, near: int) -> tuple[Any, Any]:
    t, r = world(conn, drift_min_n=10, drift_share=0.3, drift_distance=0.5, min_new_examples=1000)
    before = datetime.now(UTC) - timedelta(hours=2)
    logs = [make_log(conn, tenant_id=t["id"], route=r["name"], created_at=before) for _ in range(3)]
    for log in logs:
        conn.execute(
            "UPDATE obs.inference_log SET embedding = %s WHERE id = %s", (vec(0), log["id"])
        )
    with conn.transaction():
        snap = conn.execute(
            "INSERT INTO train.dataset_snapshot (tenant_id, route, method, query_sql, n_train,"
            " set_hash) VALUES (%s, %s, 'sft', '-- test', 3, %s) RETURNING id",
            (t["id"], r["name"], "ab" * 32),
        ).fetchone()
        for i, log in enumerate(logs):
            conn.execute(
                "INSERT INTO train.dataset_example (snapshot_id, example_hash, split, log_ids, example)"
                " VALUES (%s, %s, 'train', %s, %s)",
                (snap["id"], bytes([i]) * 32, [log["id"]], Jsonb({"messages": []})),
            )
    make_adapter(conn, route=r, status="prod", traffic_pct=100, dataset_snapshot_id=snap["id"])
    after = datetime.now(UTC) + timedelta(seconds=1)  # logged after the snapshot was taken
    for i in range(far + near):
        log = make_log(conn, tenant_id=t["id"], route=r["name"], created_at=after)
        conn.execute("UPDATE obs.inference_log SET embedding = %s WHERE id = %s",
                     (vec(1 if i < far else 0), log["id"]))  # fmt: skip
    return t, r


def test_drift_fires_at_its_share_not_below(conn):
    _, r = _drift_world(conn, far=2, near=8)
    d = trigger(conn, r, "drift")
    assert (d["fired"], d["value"]) == (False, 0.2)
    assert d["detail"]["training_prompts"] == 3 and d["detail"]["recent_prompts"] == 10


def test_drift_fires_when_the_share_is_reached(conn):
    _, r = _drift_world(conn, far=3, near=7)
    d = trigger(conn, r, "drift")
    assert (d["fired"], d["value"]) == (True, 0.3), d["line"]
    (cycle,) = started(conn)
    assert cycle["trigger"] == "drift"


def test_drift_needs_min_n_recent_prompts(conn):
    _, r = _drift_world(conn, far=9, near=0)
    d = trigger(conn, r, "drift")
    assert not d["fired"] and d["line"].startswith("waiting: 9 of 10")


def test_forget_fires_on_a_tainted_prod_and_skips_the_interval(conn):
    t, r = world(conn, min_new_examples=1000, min_interval=timedelta(days=1))
    prod = make_adapter(conn, route=r, status="prod", traffic_pct=100)
    assert not trigger(conn, r, "forget")["fired"]
    conn.execute(
        "INSERT INTO loop.cycle (tenant_id, route, trigger, state) VALUES (%s, %s, 'manual', 'promoted')",
        (t["id"], r["name"]),
    )
    conn.execute(
        "UPDATE serve.adapter SET tainted_at = now(),"
        " tainted_reason = 'built from rows of a forgotten user (forget request 7)' WHERE id = %s",
        (prod["id"],),
    )
    f = trigger(conn, r, "forget")
    assert f["fired"] and f["detail"]["forget_request_id"] == 7
    (cycle,) = started(conn)  # min_interval (1 day) does not hold a forget cycle
    assert cycle["trigger"] == "forget" and cycle["forget_request_id"] == 7


def test_pause_kill_switch_and_limits_hold_new_cycles(conn):
    t, r = world(conn, min_new_examples=1, min_interval=timedelta(0), max_cycles_per_day=2,
                 cooldown_after_reject=timedelta(hours=1))  # fmt: skip
    key = (t["id"], r["name"])
    edit(conn, t, r, "q1")
    refresh(conn)
    conn.execute("UPDATE loop.policy SET paused = true, paused_reason = 'holiday'")
    assert started(conn) == []
    conn.execute("UPDATE loop.policy SET paused = false")
    conn.execute("SELECT loop.set_control(true, 'incident 42', 'ops')")
    assert started(conn) == []
    lim = {x["limit_name"]: x for x in conn.execute("SELECT * FROM loop.limits(%s, %s)", key)}
    assert lim["kill_switch"]["blocking"] and "incident 42" in lim["kill_switch"]["line"]
    conn.execute("SELECT loop.set_control(false, NULL, 'ops')")
    (first,) = started(conn)
    assert started(conn) == []  # one cycle at a time
    conn.execute("UPDATE loop.cycle SET state = 'rejected', finished_at = now() WHERE id = %s",
                 (first["id"],))  # fmt: skip
    assert started(conn) == []  # cool-down after a rejection
    lim = {x["limit_name"]: x for x in conn.execute("SELECT * FROM loop.limits(%s, %s)", key)}
    assert lim["cooldown_after_reject"]["blocking"]
    conn.execute("UPDATE loop.cycle SET finished_at = now() - interval '2 hours'")
    edit(conn, t, r, "q2")  # new since the first cycle
    refresh(conn)
    (second,) = started(conn)
    conn.execute("UPDATE loop.cycle SET state = 'failed' WHERE id = %s", (second["id"],))
    edit(conn, t, r, "q3")
    refresh(conn)
    assert started(conn) == []  # two cycles today: max_cycles_per_day
    lim = {x["limit_name"]: x for x in conn.execute("SELECT * FROM loop.limits(%s, %s)", key)}
    assert lim["max_cycles_per_day"]["blocking"]


def test_training_capacity_holds_new_cycles(conn):
    t, r = world(conn, min_new_examples=1, max_concurrent_training=1)
    edit(conn, t, r, "q1")
    refresh(conn)
    conn.execute(
        "INSERT INTO train.training_run (tenant_id, route, method, base_model) VALUES (%s, %s, 'sft', 'm')",
        (t["id"], r["name"]),
    )
    assert started(conn) == []
    conn.execute("UPDATE train.training_run SET status = 'succeeded'")
    assert len(started(conn)) == 1


def test_two_workers_start_and_claim_one_cycle(conn, db_url):
    t, r = world(conn, min_new_examples=1)
    edit(conn, t, r, "q1")
    refresh(conn)
    barrier = threading.Barrier(2)
    got: dict[str, Any] = {}

    def work(name: str) -> None:
        with psycopg.connect(db_url, row_factory=dict_row) as c:
            barrier.wait()
            with c.transaction():
                got[f"start-{name}"] = c.execute(
                    "SELECT id FROM loop.start_due_cycles()"
                ).fetchall()
            barrier.wait()
            with c.transaction():
                got[f"claim-{name}"] = c.execute(
                    "SELECT id FROM loop.claim_cycle(%s, '1 minute')", (name,)
                ).fetchall()

    threads = [threading.Thread(target=work, args=(n,)) for n in ("w1", "w2")]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(got["start-w1"]) + len(got["start-w2"]) == 1
    assert len(got["claim-w1"]) + len(got["claim-w2"]) == 1
    assert conn.execute("SELECT count(*) AS n FROM loop.cycle").fetchone()["n"] == 1


def test_tenants_see_only_their_loop(conn):
    _, r = world(conn, min_new_examples=1)
    other = make_tenant(conn)
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cft_app")
        conn.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(other["id"]),))
        assert conn.execute("SELECT count(*) AS n FROM loop.policy").fetchone()["n"] == 0
        try:
            with conn.transaction():
                conn.execute("SELECT * FROM loop.triggers(%s, %s)", (r["tenant_id"], r["name"]))
            raise AssertionError("another tenant's triggers were readable")
        except psycopg.errors.NoDataFound:
            pass
