"""Queue semantics of train.training_run: claims, leases, reclaim, cancel, retries, failures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from app.core.artefacts import LocalStore
from tests.support.training import make_run, make_snapshot, setup_route
from workers.trainer.worker import Worker, WorkerConfig, adapter_name, claim

ROOT = Path(__file__).resolve().parents[2]


def _connect(url: str) -> psycopg.Connection[dict]:  # type: ignore[type-arg]
    return psycopg.connect(url, autocommit=True, row_factory=dict_row)


def _run(conn, run_id):  # type: ignore[no-untyped-def]
    return conn.execute("SELECT * FROM train.training_run WHERE id = %s", (run_id,)).fetchone()


def test_two_workers_never_claim_the_same_run(conn, db_url) -> None:  # type: ignore[no-untyped-def]
    _, _, snap = setup_route(conn)
    make_run(conn, snapshot=snap)
    barrier = threading.Barrier(8)
    got: list[object] = []

    def worker(i: int) -> None:
        with _connect(db_url) as c:
            barrier.wait()
            row = claim(c, f"w{i}", 60)
            if row:
                got.append(row["id"])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 1

    # Many runs, two workers draining concurrently: each run claimed exactly once.
    ids = {make_run(conn, snapshot=snap)["id"] for _ in range(20)}
    claimed: dict[str, list[object]] = {"a": [], "b": []}

    def drain(name: str) -> None:
        with _connect(db_url) as c:
            while (row := claim(c, name, 60)) is not None:
                claimed[name].append(row["id"])

    ts = [threading.Thread(target=drain, args=(n,)) for n in claimed]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    all_ids = claimed["a"] + claimed["b"]
    assert sorted(map(str, all_ids)) == sorted(map(str, ids))
    assert len(set(all_ids)) == len(all_ids)


def test_expired_lease_is_reclaimed_then_bounded(conn) -> None:  # type: ignore[no-untyped-def]
    _, _, snap = setup_route(conn)
    run = make_run(conn, snapshot=snap, max_attempts=2)
    first = claim(conn, "dead-worker", 0.2)
    assert first["id"] == run["id"] and first["attempts"] == 1
    assert claim(conn, "other", 60) is None  # lease still held
    time.sleep(0.4)
    second = claim(conn, "other", 0.2)
    assert second["id"] == run["id"] and second["worker_id"] == "other"
    assert second["attempts"] == 2 and "lease of worker dead-worker expired" in second["error"]
    # The old worker's heartbeat learns the run is not its own any more.
    hb = conn.execute(
        "SELECT train.heartbeat_training_run(%s, 'dead-worker', '60 s') AS c", (run["id"],)
    ).fetchone()
    assert hb["c"] is None
    time.sleep(0.4)
    assert claim(conn, "third", 60) is None
    row = _run(conn, run["id"])
    assert row["status"] == "failed"
    assert "giving up after max_attempts = 2" in row["error"] and row["finished_at"] is not None


def test_heartbeat_renews_and_reports_cancel(conn) -> None:  # type: ignore[no-untyped-def]
    _, _, snap = setup_route(conn)
    run = make_run(conn, snapshot=snap)
    claim(conn, "w", 0.5)
    for _ in range(3):
        time.sleep(0.25)
        c = conn.execute(
            "SELECT train.heartbeat_training_run(%s, 'w', '0.5 s', %s) AS c",
            (run["id"], '{"step": 1}'),
        ).fetchone()["c"]
        assert c is False
    assert claim(conn, "thief", 60) is None  # renewed, never expired
    assert _run(conn, run["id"])["progress"] == {"step": 1}
    assert (
        conn.execute("SELECT train.cancel_training_run(%s) AS s", (run["id"],)).fetchone()["s"]
        == "running"
    )
    c = conn.execute(
        "SELECT train.heartbeat_training_run(%s, 'w', '1 s') AS c", (run["id"],)
    ).fetchone()["c"]
    assert c is True
    st = conn.execute(
        "SELECT train.fail_training_run(%s, 'w', 'cancelled', true) AS s", (run["id"],)
    ).fetchone()["s"]
    assert st == "cancelled"


def test_cancel_queued_run_and_notify_on_enqueue(conn, db_url) -> None:  # type: ignore[no-untyped-def]
    _, _, snap = setup_route(conn)
    with _connect(db_url) as listener:
        listener.execute("LISTEN cft_training")
        run = make_run(conn, snapshot=snap)
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.payload for n in notes] == [str(run["id"])]
    st = conn.execute("SELECT train.cancel_training_run(%s) AS s", (run["id"],)).fetchone()["s"]
    assert st == "cancelled"
    assert claim(conn, "w", 60) is None


def test_retry_is_bounded_and_failure_is_readable(conn) -> None:  # type: ignore[no-untyped-def]
    _, _, snap = setup_route(conn)
    run = make_run(conn, snapshot=snap, max_attempts=2)
    claim(conn, "w", 60)
    st = conn.execute(
        "SELECT train.fail_training_run(%s, 'w', 'OSError: boom', true) AS s", (run["id"],)
    ).fetchone()["s"]
    assert st == "queued"
    assert claim(conn, "w", 60)["attempts"] == 2
    st = conn.execute(
        "SELECT train.fail_training_run(%s, 'w', 'OSError: boom again', true) AS s",
        (run["id"],),
    ).fetchone()["s"]
    assert st == "failed"
    assert _run(conn, run["id"])["error"] == "OSError: boom again"


def test_worker_reports_bad_data_without_adapter_row(conn, db_url, tmp_path, models_dir) -> None:  # type: ignore[no-untyped-def]
    tenant, route, _ = setup_route(conn)
    # DPO run on SFT-shaped examples: refused before any model is loaded.
    snap = make_snapshot(conn, tenant_id=tenant["id"], route=route["name"], method="sft")
    run = make_run(conn, snapshot=snap, method="dpo")
    cfg = WorkerConfig(
        db_url=db_url, models_dir=models_dir, store=LocalStore(tmp_path), worker_id="w1"
    )
    assert Worker(cfg).run_once() is True
    row = _run(conn, run["id"])
    assert row["status"] == "failed" and row["attempts"] == 1
    assert "train example 1 lacks prompt, chosen, rejected for method dpo" in row["error"]
    assert conn.execute("SELECT count(*) AS n FROM serve.adapter").fetchone()["n"] == 0
    assert Worker(cfg).run_once() is False


def test_adapter_names_are_never_reused() -> None:
    import uuid
    from datetime import UTC, datetime

    rid = uuid.uuid4()
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    name = adapter_name(3, "support-es", rid, 1, now)
    assert name == f"support-es-20260102030405-t3-{rid.hex[:8]}"
    assert adapter_name(3, "support-es", rid, 2, now) != name
    # Two tenants' routes of one name never share an adapter id (nor its artefact's path).
    assert adapter_name(4, "support-es", rid, 1, now) != name


def test_killed_worker_run_is_reclaimed(conn, db_url, tmp_path, models_dir) -> None:  # type: ignore[no-untyped-def]
    """A real worker process is SIGKILLed mid-run; after its lease another worker reclaims it."""
    _, _, snap = setup_route(conn)
    run = make_run(conn, snapshot=snap, max_attempts=3)
    env = os.environ | {
        "CFT_DATABASE_URL": db_url,
        "CFT_HOME": str(tmp_path / "home"),
        "CFT_ARTEFACT_DIR": str(tmp_path / "store"),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workers.trainer",
            "--once",
            "--lease",
            "2",
            "--worker-id",
            "doomed",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while _run(conn, run["id"])["status"] != "running":
            assert proc.poll() is None, "worker exited before claiming"
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _run(conn, run["id"])["worker_id"] == "doomed"
    assert claim(conn, "survivor", 60) is None  # the dead worker's lease still holds
    deadline = time.monotonic() + 10
    while (row := claim(conn, "survivor", 60)) is None:
        assert time.monotonic() < deadline, "run was never reclaimed"
        time.sleep(0.3)
    assert row["id"] == run["id"] and row["attempts"] == 2
    assert "lease of worker doomed expired" in row["error"]


@pytest.mark.parametrize("n", [0, 1, 3])
def test_claim_hands_out_only_runnable_runs(conn, n) -> None:  # type: ignore[no-untyped-def]
    """Among runs no worker may take, n queued runs: n claims get them by priority, then none."""
    _, _, snap = setup_route(conn)
    leased = datetime.now(UTC) + timedelta(hours=1)
    blocked = [
        make_run(conn, snapshot=snap, priority=9, status="succeeded"),
        make_run(conn, snapshot=snap, priority=9, status="failed"),
        make_run(conn, snapshot=snap, priority=9, status="cancelled"),
        make_run(conn, snapshot=snap, priority=9, cancel_requested=True),
        make_run(conn, snapshot=snap, priority=9, attempts=3, max_attempts=3),
        make_run(
            conn,
            snapshot=snap,
            priority=9,
            status="running",
            worker_id="alive",
            lease_until=leased,
            attempts=1,
        ),
    ]
    queued = [make_run(conn, snapshot=snap, priority=p) for p in range(n)]
    got = [claim(conn, f"w{i}", 60) for i in range(n)]
    assert [r["id"] for r in got] == [r["id"] for r in reversed(queued)]
    assert [(r["status"], r["worker_id"], r["attempts"]) for r in got] == [
        ("running", f"w{i}", 1) for i in range(n)
    ]
    assert claim(conn, "idle", 60) is None
    assert [_run(conn, r["id"]) for r in blocked] == blocked


def test_tenants_take_turns_whatever_their_priorities(conn) -> None:  # type: ignore[no-untyped-def]
    """A tenant that queues many runs at the highest priority cannot starve another tenant's
    run: the tenant served longest ago goes first, priority orders a tenant's own runs."""
    _, _, greedy = setup_route(conn)
    _, _, modest = setup_route(conn)
    g = [make_run(conn, snapshot=greedy, priority=10) for _ in range(3)]
    m = make_run(conn, snapshot=modest, priority=-10)
    got = [claim(conn, f"w{i}", 60)["id"] for i in range(4)]
    assert got.index(m["id"]) <= 1, got  # second at the latest, not after all of greedy's
    assert {*got} == {*(r["id"] for r in g), m["id"]}
