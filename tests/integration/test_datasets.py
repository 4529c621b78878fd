"""Datasets on real PostgreSQL + pgvector with the real embedding model: candidate views,
dedup, frozen snapshots, TRL-format exports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from app.core.auth import create_key
from app.core.config import Settings
from app.core.db import as_tenant
from app.core.errors import BadRequest
from app.datasets import service as datasets
from app.datasets.schemas import SnapshotOut
from app.main import create_app
from tests.support.embeddings import encoder
from tests.support.factories import make_log, make_route, make_tenant
from tests.support.servers import serve_app
from workers.embedder.service import embed_pending


def _user(text: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a support bot."},
        {"role": "user", "content": text},
    ]


def _snapshot(
    conn: Any, tenant: dict[str, Any], route: dict[str, Any], method: str, **kw: Any
) -> SnapshotOut:
    return datasets.create_snapshot(
        conn, tenant_id=tenant["id"], route=route["name"], method=method, **kw
    )


def _examples(conn: Any, snap: SnapshotOut) -> list[dict[str, Any]]:
    return datasets.export_snapshot(
        conn, snapshot_id=str(snap.id), split="train"
    ) + datasets.export_snapshot(conn, snapshot_id=str(snap.id), split="eval")


@pytest.fixture
def world(conn):
    tenant = make_tenant(conn)
    route = make_route(conn, tenant_id=tenant["id"])
    return tenant, route


def log(conn, tenant, route, **over):
    return make_log(conn, tenant_id=tenant["id"], route=route["name"], **over)


# --- views -------------------------------------------------------------------------------------


def test_kto_rules_consent_pii_and_zero_feedback(conn, world):
    tenant, route = world
    up = log(conn, tenant, route, messages=_user("good one"), completion="yes", fb_explicit=1)
    down = log(conn, tenant, route, messages=_user("bad one"), completion="no", fb_explicit=-1)
    log(conn, tenant, route, messages=_user("neutral"), fb_explicit=0)
    log(conn, tenant, route, messages=_user("unrated"), fb_explicit=None)
    log(conn, tenant, route, messages=_user("has pii"), fb_explicit=1, pii_flags=1)
    log(conn, tenant, route, messages=_user("errored"), fb_explicit=1, status="error")
    other = make_tenant(conn, consent_training=False)
    other_route = make_route(conn, tenant_id=other["id"])
    log(conn, other, other_route, messages=_user("no consent"), fb_explicit=1)

    snap = _snapshot(conn, tenant, route, "kto", dedup_threshold=0)
    examples = _examples(conn, snap)
    by_text = {e["prompt"][-1]["content"]: e for e in examples}
    assert set(by_text) == {"good one", "bad one"}
    assert by_text["good one"]["label"] is True and by_text["bad one"]["label"] is False
    assert by_text["good one"]["completion"] == [{"role": "assistant", "content": "yes"}]
    assert snap.counts["view_rows"] == 2
    rows = conn.execute(
        "SELECT log_ids FROM train.dataset_example WHERE snapshot_id = %s ORDER BY log_ids",
        (snap.id,),
    ).fetchall()
    assert sorted(r["log_ids"][0] for r in rows) == sorted([up["id"], down["id"]])

    # The non-consenting tenant is absent from the view itself, and consent is re-checked live.
    n = conn.execute(
        "SELECT count(*) AS n FROM train.kto_candidate WHERE tenant_id = %s", (other["id"],)
    ).fetchone()
    assert n["n"] == 0
    with pytest.raises(Exception, match="not found"):
        _snapshot(conn, tenant, other_route, "kto")


def test_consent_withdrawn_after_refresh_is_rechecked_live(conn, world):
    tenant, route = world
    log(conn, tenant, route, messages=_user("q"), completion="a", fb_explicit=1)
    datasets.refresh_candidates(conn)
    conn.execute("UPDATE tenant SET consent_training = false WHERE id = %s", (tenant["id"],))
    snap = _snapshot(conn, tenant, route, "kto", refresh=False)
    assert snap.counts["view_rows"] == 1 and snap.counts["live_ok"] == 0
    assert snap.n_train + snap.n_eval == 0


def test_pii_flag_set_after_refresh_is_rechecked_live(conn, world):
    tenant, route = world
    row = log(conn, tenant, route, messages=_user("q"), completion="a", fb_explicit=1)
    datasets.refresh_candidates(conn)
    conn.execute("UPDATE obs.inference_log SET pii_flags = 4 WHERE id = %s", (row["id"],))
    snap = _snapshot(conn, tenant, route, "kto", refresh=False)
    assert snap.counts["live_ok"] == 0


def _markers(conn: Any) -> list[int]:
    return [r["log_id"] for r in conn.execute("SELECT log_id FROM obs.deleted_log ORDER BY 1")]


def test_rows_deleted_after_refresh_are_skipped_by_their_markers(conn, world):
    tenant, route = world
    keep = log(conn, tenant, route, messages=_user("kept"), completion="a", fb_explicit=1)
    gone = log(conn, tenant, route, messages=_user("deleted"), completion="b", fb_explicit=1)
    _rej, cho = _regen(conn, tenant, route, "chosen deleted")
    datasets.refresh_candidates(conn)
    conn.execute("DELETE FROM obs.inference_log WHERE id = ANY(%s)", ([gone["id"], cho["id"]],))
    assert _markers(conn) == sorted([gone["id"], cho["id"]])
    # The views still hold both rows; the snapshots skip them.
    kto = _snapshot(conn, tenant, route, "kto", refresh=False, dedup_threshold=0)
    assert kto.counts["view_rows"] == 2 and kto.counts["live_ok"] == 1
    assert [e["prompt"][-1]["content"] for e in _examples(conn, kto)] == ["kept"]
    dpo = _snapshot(conn, tenant, route, "dpo", refresh=False, dedup_threshold=0)
    assert dpo.counts["view_rows"] == 1 and dpo.counts["live_ok"] == 0
    # A marker whose row exists again (moved to a new partition, logged again) skips nothing.
    conn.execute(
        "INSERT INTO obs.deleted_log (log_id, created_at) VALUES (%s, %s)",
        (keep["id"], keep["created_at"]),
    )
    again = _snapshot(conn, tenant, route, "kto", refresh=False, dedup_threshold=0)
    assert again.counts["live_ok"] == 1
    # A refresh drops the rows from the views and the markers it accounted for.
    datasets.refresh_candidates(conn)
    assert _markers(conn) == []
    kto = _snapshot(conn, tenant, route, "kto", refresh=False, dedup_threshold=0)
    assert kto.counts["view_rows"] == kto.counts["live_ok"] == 1
    assert [e["prompt"][-1]["content"] for e in _examples(conn, kto)] == ["kept"]
    dpo = _snapshot(conn, tenant, route, "dpo", refresh=False, dedup_threshold=0)
    assert dpo.counts["view_rows"] == 0


def test_rows_of_a_dropped_partition_are_skipped(conn, world):
    tenant, route = world
    now = datetime.now(UTC)
    log(
        conn,
        tenant,
        route,
        messages=_user("old"),
        fb_explicit=1,
        created_at=now - timedelta(days=20),
    )
    log(
        conn,
        tenant,
        route,
        messages=_user("new"),
        fb_explicit=1,
        created_at=now - timedelta(days=2),
    )
    datasets.refresh_candidates(conn)
    # What dropping the old rows' partition does: they are gone and no trigger fires.
    conn.execute("SET session_replication_role = replica")
    conn.execute(
        "DELETE FROM obs.inference_log WHERE route = %s AND created_at < %s",
        (route["name"], now - timedelta(days=10)),
    )
    conn.execute("RESET session_replication_role")
    assert _markers(conn) == []
    snap = _snapshot(conn, tenant, route, "kto", refresh=False, dedup_threshold=0)
    assert snap.counts["in_window"] == 2 and snap.counts["live_ok"] == 1
    assert [e["prompt"][-1]["content"] for e in _examples(conn, snap)] == ["new"]
    assert snap.params["oldest_log_row"] is not None


def test_a_delete_committed_while_a_refresh_runs_keeps_its_marker(conn, world, db_url):
    """The refresh began before the delete committed, so the view may still hold the row:
    its marker must outlive that refresh."""
    tenant, route = world
    row = log(conn, tenant, route, messages=_user("q"), completion="a", fb_explicit=1)
    datasets.refresh_candidates(conn)
    with psycopg.connect(db_url) as blocker, psycopg.connect(db_url, autocommit=True) as refresher:
        # The last view the refresh takes is held by another refresh: it refreshes the KTO
        # view, then waits.
        blocker.execute("REFRESH MATERIALIZED VIEW CONCURRENTLY train.pair_candidate")
        pid = refresher.execute("SELECT pg_backend_pid()").fetchone()[0]
        done = threading.Event()
        worker = threading.Thread(
            target=lambda: (datasets.refresh_candidates(refresher), done.set()), daemon=True
        )
        worker.start()
        for _ in range(200):
            waiting = conn.execute(
                "SELECT wait_event_type = 'Lock' AS w FROM pg_stat_activity WHERE pid = %s",
                (pid,),
            ).fetchone()
            if waiting and waiting["w"]:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the refresh never reached the locked view")
        conn.execute("DELETE FROM obs.inference_log WHERE id = %s", (row["id"],))
        blocker.rollback()
        worker.join(30)
        assert done.is_set()
    assert _markers(conn) == [row["id"]]
    snap = _snapshot(conn, tenant, route, "kto", refresh=False, dedup_threshold=0)
    assert snap.counts["view_rows"] == 1 and snap.counts["live_ok"] == 0
    datasets.refresh_candidates(conn)
    assert _markers(conn) == []


def _refreshed(conn: Any) -> dict[str, bool]:
    rows = conn.execute("SELECT view_name, seen IS NOT NULL AS r FROM train.candidate_view_refresh")
    return {r["view_name"].split(".")[1].split("_")[0]: r["r"] for r in rows}


def _view_rows(conn: Any, view: str) -> int:
    return int(conn.execute(f"SELECT count(*) AS n FROM train.{view}_candidate").fetchone()["n"])


def _view(conn: Any, view: str) -> dict[Any, Any]:
    rows = conn.execute(
        f"SELECT prompt_log_id, example, example_hash, dup_check_off FROM train.{view}_candidate"
    ).fetchall()
    assert all(r["dup_check_off"] is None for r in rows)
    return {r["prompt_log_id"]: r["example"] for r in rows}


def test_a_concurrent_refresh_follows_changed_new_and_deleted_rows(conn, world):
    """The views carry an always-NULL column so that REFRESH ... CONCURRENTLY skips its
    whole-row duplicate search; the diff must still replace changed rows, add new ones and drop
    deleted ones, in every view."""
    tenant, route = world
    thumbs = log(conn, tenant, route, messages=_user("t"), completion="a", fb_explicit=1)
    gone = log(conn, tenant, route, messages=_user("g"), completion="b", fb_explicit=1)
    edit = log(conn, tenant, route, messages=_user("e"), completion="c", fb_edited=True,
               edited_completion="c, edited")  # fmt: skip
    datasets.refresh_candidates(conn)
    before = {v: _view(conn, v) for v in ("kto", "sft", "pair")}
    assert before["kto"][thumbs["id"]]["label"] is True and gone["id"] in before["kto"]
    conn.execute("UPDATE obs.inference_log SET fb_explicit = -1 WHERE id = %s", (thumbs["id"],))
    conn.execute("DELETE FROM obs.inference_log WHERE id = %s", (gone["id"],))
    conn.execute(
        "UPDATE obs.inference_log SET edited_completion = 'c, edited twice' WHERE id = %s",
        (edit["id"],),
    )
    new = log(conn, tenant, route, messages=_user("n"), completion="d", fb_explicit=1)
    datasets.refresh_candidates(conn)
    after = {v: _view(conn, v) for v in ("kto", "sft", "pair")}
    assert set(after["kto"]) == {thumbs["id"], new["id"]}
    assert after["kto"][thumbs["id"]]["label"] is False
    assert after["sft"][edit["id"]]["messages"][-1]["content"] == "c, edited twice"
    assert after["pair"][edit["id"]]["chosen"][0]["content"] == "c, edited twice"
    hashes = conn.execute(
        "SELECT bool_and(example_hash = train.example_hash(example)) AS ok FROM train.kto_candidate"
    ).fetchone()
    assert hashes["ok"] is True


def test_a_snapshot_refreshes_only_the_view_its_method_reads(conn, world):
    tenant, route = world
    assert _refreshed(conn) == {"sft": False, "kto": False, "pair": False}
    log(conn, tenant, route, messages=_user("rated"), completion="a", fb_explicit=1)
    _regen(conn, tenant, route, "regenerated")
    kto = _snapshot(conn, tenant, route, "kto", dedup_threshold=0)
    assert kto.n_train + kto.n_eval == 1
    assert _refreshed(conn) == {"sft": False, "kto": True, "pair": False}
    assert (_view_rows(conn, "kto"), _view_rows(conn, "pair")) == (1, 0)
    dpo = _snapshot(conn, tenant, route, "dpo", dedup_threshold=0)
    assert dpo.n_train + dpo.n_eval == 1
    assert _refreshed(conn) == {"sft": False, "kto": True, "pair": True}
    datasets.refresh_candidates(conn, [])  # no method, no view
    assert _refreshed(conn) == {"sft": False, "kto": True, "pair": True}
    with pytest.raises(BadRequest, match="unknown method 'ppo'"):
        datasets.refresh_candidates(conn, ["kto", "ppo"])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="unknown method ppo"):
        conn.execute("SELECT train.refresh_dataset_candidates(ARRAY['ppo'])")


def test_markers_go_once_every_view_has_been_refreshed_since(conn, world):
    """A marker may only go when no view can still hold its row: after one view's refresh the
    others may, so it stays until each has been refreshed since the change."""
    tenant, route = world
    row = log(conn, tenant, route, messages=_user("q"), completion="a", fb_explicit=1)
    datasets.refresh_candidates(conn, ["kto"])
    conn.execute("DELETE FROM obs.inference_log WHERE id = %s", (row["id"],))
    # Never refreshed through v3: what the pair and sft views hold is not known.
    datasets.refresh_candidates(conn, ["kto", "orpo"])
    assert _markers(conn) == [row["id"]] and _view_rows(conn, "kto") == 0
    datasets.refresh_candidates(conn, ["sft"])
    assert _markers(conn) == []
    # Now every view has a known refresh: a change is cleared by the last view to see it.
    again = log(conn, tenant, route, messages=_user("q2"), completion="b", fb_explicit=1)
    datasets.refresh_candidates(conn)
    conn.execute("DELETE FROM obs.inference_log WHERE id = %s", (again["id"],))
    for method in ("kto", "sft"):
        datasets.refresh_candidates(conn, [method])
        assert _markers(conn) == [again["id"]], method
    datasets.refresh_candidates(conn, ["simpo"])
    assert _markers(conn) == []


def test_cli_refreshes_one_method_or_all(conn, db_url, tmp_path):
    env = os.environ | {"CFT_HOME": str(tmp_path), "CFT_DATABASE_URL": db_url}
    cmd = [sys.executable, "-m", "cft.cli", "dataset", "refresh"]
    res = subprocess.run([*cmd, "--method", "sft"], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "refreshed (sft)" in res.stdout
    assert _refreshed(conn) == {"sft": True, "kto": False, "pair": False}
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert res.returncode == 0 and "refreshed (all)" in res.stdout, res.stderr
    assert _refreshed(conn) == {"sft": True, "kto": True, "pair": True}
    res = subprocess.run([*cmd, "--method", "ppo"], env=env, capture_output=True, text=True)
    assert res.returncode == 2 and "invalid choice" in res.stderr


def _wait_for_lock(conn: Any, pid: int) -> None:
    for _ in range(200):
        waiting = conn.execute(
            "SELECT wait_event_type = 'Lock' AS w FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if waiting and waiting["w"]:
            return
        time.sleep(0.05)
    pytest.fail("the snapshot never reached the locked table")


def _snapshot_across_a_refresh(conn, db_url, world, take) -> Any:
    """Six KTO candidates; run take(connection) in a thread, held after reading its candidates
    (the draft's insert waits on a lock), while a candidate changes and its view is refreshed
    CONCURRENTLY; returns what take returned or raised."""
    tenant, route = world
    _some_traffic(conn, tenant, route, 6)
    datasets.refresh_candidates(conn)
    out: dict[str, Any] = {}
    with (
        psycopg.connect(db_url) as blocker,
        psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as taker,
    ):
        blocker.execute("LOCK TABLE train.dataset_snapshot IN SHARE MODE")
        pid = taker.execute("SELECT pg_backend_pid() AS p").fetchone()["p"]

        def run() -> None:
            try:
                out["result"] = take(taker)
            except Exception as exc:  # reported to the test
                out["result"] = exc

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        _wait_for_lock(conn, pid)
        conn.execute(
            "UPDATE obs.inference_log SET completion = 'changed' WHERE id ="
            " (SELECT min(id) FROM obs.inference_log WHERE fb_explicit <> 0)"
        )
        conn.execute("REFRESH MATERIALIZED VIEW CONCURRENTLY train.kto_candidate")
        blocker.rollback()
        worker.join(60)
        assert not worker.is_alive()
    return out["result"]


def test_a_refresh_between_reading_and_writing_refuses_the_snapshot(conn, world, db_url):
    """The snapshot reads the view's keys, then the survivors' rows by TID: rows a concurrent
    refresh replaced in between are gone, so the snapshot is refused, not written short."""
    tenant, route = world
    err = _snapshot_across_a_refresh(
        conn,
        db_url,
        world,
        lambda c: c.execute(
            "SELECT id FROM train.create_snapshot(%s, %s, 'kto', p_dedup_threshold => 0)",
            (tenant["id"], route["name"]),
        ).fetchone(),
    )
    assert isinstance(err, psycopg.errors.SerializationFailure), err
    assert "was refreshed while this snapshot was taken: 1 of 6" in str(err)
    left = conn.execute("SELECT count(*) AS n FROM train.dataset_snapshot").fetchone()
    assert left["n"] == 0


def test_the_service_takes_a_refused_snapshot_again(conn, world, db_url):
    tenant, route = world
    snap = _snapshot_across_a_refresh(
        conn,
        db_url,
        world,
        lambda c: datasets.create_snapshot(
            c,
            tenant_id=tenant["id"],
            route=route["name"],
            method="kto",
            dedup_threshold=0,
            refresh=False,
        ),
    )
    assert isinstance(snap, SnapshotOut), snap
    assert snap.n_train + snap.n_eval == 6
    rows = [
        *datasets.export_snapshot(conn, snapshot_id=str(snap.id), split="train"),
        *datasets.export_snapshot(conn, snapshot_id=str(snap.id), split="eval"),
    ]
    assert sum(r["completion"][0]["content"] == "changed" for r in rows) == 1
    assert datasets.verify_snapshot(conn, snapshot_id=str(snap.id)).examples_ok is True


def test_a_snapshot_never_holds_an_example_twice(conn, world):
    """Without a primary key, the snapshot writer checks its hashes itself: two identical rows
    whose stored prompt hashes disagree (a stale hash) survive exact dedup, and the snapshot is
    refused."""
    tenant, route = world
    a = log(conn, tenant, route, messages=_user("same"), completion="same", fb_explicit=1)
    b = log(conn, tenant, route, messages=_user("same"), completion="same", fb_explicit=1)
    for row, h in ((a, b"\x01" * 32), (b, b"\x02" * 32)):
        conn.execute(
            "INSERT INTO obs.prompt_neighbour_scan (log_id, created_at, tenant_id, route, radius,"
            " max_neighbours, prompt_hash, scanned_at) VALUES (%s, %s, %s, %s, 0.2, 10, %s, now())"
            " ON CONFLICT (log_id, created_at) DO UPDATE SET prompt_hash = excluded.prompt_hash,"
            " radius = 0.2",
            (row["id"], row["created_at"], tenant["id"], route["name"], h),
        )
    datasets.refresh_candidates(conn)
    with pytest.raises(psycopg.errors.UniqueViolation, match="1 examples twice"):
        _snapshot(conn, tenant, route, "kto", refresh=False, dedup_threshold=0)


def test_examples_are_inserted_by_the_snapshot_writer_only(conn, world, db_url):
    tenant, route = world
    _some_traffic(conn, tenant, route, 4)
    sid = _draft(conn, tenant, route)
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as app:
        with pytest.raises(psycopg.errors.InsufficientPrivilege), app.transaction():
            as_tenant(app, tenant["id"])
            app.execute(
                "INSERT INTO train.dataset_example (snapshot_id, example_hash, split, log_ids,"
                " example) VALUES (%s, '\\x09', 'train', '{9}', '{}')",
                (sid,),
            )
        with app.transaction():  # ... yet the API role's snapshots are written
            as_tenant(app, tenant["id"])
            snap = _snapshot(app, tenant, route, "kto", dedup_threshold=0)
    assert snap.n_train + snap.n_eval == 4
    # Naming a draft in the setting exempts only that draft's rows from the checks.
    conn.execute("BEGIN")
    conn.execute("SELECT set_config('cft.writing_snapshot', %s, true)", (sid,))
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        conn.execute(
            "INSERT INTO train.dataset_example (snapshot_id, example_hash, split, log_ids, example)"
            " VALUES (%s, '\\x09', 'train', '{9}', '{}')",
            (str(uuid.uuid4()),),
        )
    conn.execute("ROLLBACK")


def _regen(conn, tenant, route, prompt, *, rej_tokens=10, cho_tokens=10, **child):
    rej = log(
        conn,
        tenant,
        route,
        messages=_user(prompt),
        completion=f"bad answer to {prompt}",
        tokens_out=rej_tokens,
        fb_regen=True,
    )
    cho = log(
        conn,
        tenant,
        route,
        messages=_user(prompt),
        completion=f"good answer to {prompt}",
        tokens_out=cho_tokens,
        parent_id=rej["id"],
        **child,
    )
    return rej, cho


def test_pairs_from_regenerate_rules(conn, world):
    tenant, route = world
    ok_rej, ok_cho = _regen(conn, tenant, route, "unrated child")
    _regen(conn, tenant, route, "liked child", fb_explicit=1)
    _regen(conn, tenant, route, "downvoted child", fb_explicit=-1)
    _regen(conn, tenant, route, "regenerated again", fb_regen=True)
    _regen(conn, tenant, route, "too long", cho_tokens=26)
    _regen(conn, tenant, route, "too short", cho_tokens=4)
    _regen(conn, tenant, route, "just long enough", cho_tokens=25)
    _regen(conn, tenant, route, "just short enough", cho_tokens=5)
    _regen(conn, tenant, route, "pii child", pii_flags=2)

    snap = _snapshot(conn, tenant, route, "dpo", dedup_threshold=0)
    examples = _examples(conn, snap)
    prompts = {e["prompt"][-1]["content"] for e in examples}
    assert prompts == {"unrated child", "liked child", "just long enough", "just short enough"}
    ex = next(e for e in examples if e["prompt"][-1]["content"] == "unrated child")
    assert ex["chosen"] == [{"role": "assistant", "content": "good answer to unrated child"}]
    assert ex["rejected"] == [{"role": "assistant", "content": "bad answer to unrated child"}]
    assert ex["prompt"] == _user("unrated child")
    log_ids = conn.execute(
        "SELECT log_ids FROM train.dataset_example WHERE snapshot_id = %s AND example = %s::jsonb",
        (snap.id, json.dumps(ex)),
    ).fetchone()["log_ids"]
    assert log_ids == [ok_rej["id"], ok_cho["id"]]


def test_edits_give_sft_rows_and_pairs(conn, world):
    tenant, route = world
    row = log(
        conn,
        tenant,
        route,
        messages=_user("fix me"),
        completion="draft",
        fb_edited=True,
        edited_completion="the corrected answer",
    )
    log(
        conn,
        tenant,
        route,
        messages=_user("edited but empty"),
        completion="x",
        fb_edited=True,
        edited_completion="  ",
    )
    sft = _snapshot(conn, tenant, route, "sft")
    assert _examples(conn, sft) == [
        {"messages": [*_user("fix me"), {"role": "assistant", "content": "the corrected answer"}]}
    ]
    for method in ("dpo", "orpo", "simpo"):
        pairs = _snapshot(conn, tenant, route, method)
        assert pairs.method == method
        assert _examples(conn, pairs) == [
            {
                "prompt": _user("fix me"),
                "chosen": [{"role": "assistant", "content": "the corrected answer"}],
                "rejected": [{"role": "assistant", "content": "draft"}],
            }
        ]
    got = conn.execute(
        "SELECT log_ids FROM train.dataset_example WHERE snapshot_id = %s", (sft.id,)
    ).fetchone()
    assert got["log_ids"] == [row["id"]]


def test_window_filters_rows(conn, world):
    tenant, route = world
    now = datetime.now(UTC)
    log(
        conn,
        tenant,
        route,
        messages=_user("recent"),
        fb_explicit=1,
        created_at=now - timedelta(days=3),
    )
    log(
        conn,
        tenant,
        route,
        messages=_user("old"),
        fb_explicit=1,
        created_at=now - timedelta(days=90),
    )
    default = _snapshot(conn, tenant, route, "kto")
    assert default.counts["view_rows"] == 2 and default.counts["in_window"] == 1
    wide = _snapshot(conn, tenant, route, "kto", since=now - timedelta(days=120))
    assert wide.counts["in_window"] == 2


# --- dedup -------------------------------------------------------------------------------------


def test_exact_dedup_keeps_best_rated_newest(conn, world):
    tenant, route = world
    now = datetime.now(UTC)
    log(
        conn,
        tenant,
        route,
        messages=_user("Reset   my PASSWORD"),
        completion="old good",
        fb_explicit=1,
        created_at=now - timedelta(days=2),
    )
    log(
        conn,
        tenant,
        route,
        messages=_user("reset my password"),
        completion="new good",
        fb_explicit=1,
        created_at=now - timedelta(days=1),
    )
    log(
        conn,
        tenant,
        route,
        messages=_user("reset my password "),
        completion="newest bad",
        fb_explicit=-1,
        created_at=now - timedelta(hours=1),
    )
    log(conn, tenant, route, messages=_user("something else"), completion="x", fb_explicit=1)
    snap = _snapshot(conn, tenant, route, "kto", dedup_threshold=0)
    assert snap.counts["live_ok"] == 4 and snap.counts["exact_dedup"] == 2
    kept = {e["completion"][0]["content"] for e in _examples(conn, snap)}
    assert kept == {"new good", "x"}


PARAPHRASES = [
    "How do I reset my password?",
    "How can I reset my password?",
    "What's the way to reset my password?",
    "I forgot my password, how do I reset it?",
]
DISTINCT = [
    "What is the capital of France?",
    "How do I change my email address?",
    "Cancel my subscription please",
]


def test_semantic_dedup_with_real_embeddings(conn, world):
    tenant, route = world
    now = datetime.now(UTC)
    for i, text in enumerate(PARAPHRASES):
        # The oldest paraphrase is the only upvoted one: best-rated wins over newest.
        log(
            conn,
            tenant,
            route,
            messages=_user(text),
            completion=f"p{i}",
            fb_explicit=1 if i == 0 else -1,
            created_at=now - timedelta(hours=10 - i),
        )
    for text in DISTINCT:
        log(conn, tenant, route, messages=_user(text), completion="d", fb_explicit=-1)
    unrelated = make_route(
        conn, tenant_id=tenant["id"]
    )  # same prompts, other route: not neighbours
    log(
        conn,
        tenant,
        unrelated,
        messages=_user(PARAPHRASES[1]),
        completion="o",
        fb_explicit=1,
        created_at=now,
    )
    assert embed_pending(conn, encoder(), batch_size=3) == 8
    assert embed_pending(conn, encoder()) == 0  # idempotent
    pending = conn.execute(
        "SELECT count(*) AS n FROM obs.inference_log WHERE embedding IS NULL"
    ).fetchone()
    assert pending["n"] == 0

    snap = _snapshot(conn, tenant, route, "kto", dedup_threshold=0.1)
    counts = snap.counts
    assert counts["exact_dedup"] == 7 and counts["without_embedding"] == 0
    assert counts["semantic_dedup"] == 4
    kept = {
        e["prompt"][-1]["content"]: e["completion"][0]["content"] for e in _examples(conn, snap)
    }
    assert kept == {PARAPHRASES[0]: "p0", **{t: "d" for t in DISTINCT}}
    assert "relaxed_order" not in snap.query_sql  # the dedup statement is kept in params
    assert "ORDER BY n.embedding <=> c.embedding" in snap.params["semantic_dedup"]

    strict = _snapshot(conn, tenant, route, "kto", dedup_threshold=0.004)
    assert strict.counts["semantic_dedup"] == 7


def test_semantic_dedup_probes_the_hnsw_index(conn, world):
    tenant, route = world
    for text in ["alpha question", "beta question", "gamma question"]:
        log(conn, tenant, route, messages=_user(text), fb_explicit=1)
    embed_pending(conn, encoder())
    scans = """SELECT coalesce(sum(s.idx_scan), 0) AS n FROM pg_stat_user_indexes s
                JOIN pg_index i ON i.indexrelid = s.indexrelid
                JOIN pg_am a ON a.oid = (SELECT relam FROM pg_class WHERE oid = s.indexrelid)
               WHERE a.amname = 'hnsw' AND s.schemaname = 'obs'"""
    conn.execute("SELECT pg_stat_force_next_flush()")
    before = conn.execute(scans).fetchone()["n"]
    snap = _snapshot(conn, tenant, route, "kto", dedup_threshold=0.05)
    conn.execute("SELECT pg_stat_force_next_flush()")
    after = conn.execute(scans).fetchone()["n"]
    assert snap.counts["semantic_dedup"] == 3
    assert after - before >= 3  # one index probe (at least) per example


# --- snapshots ---------------------------------------------------------------------------------


def _some_traffic(conn, tenant, route, n=40):
    for i in range(n):
        log(
            conn,
            tenant,
            route,
            messages=_user(f"question number {i} about topic {i * 7 % 13}"),
            completion=f"answer {i}",
            fb_explicit=1 if i % 3 else -1,
        )


def test_snapshot_is_immutable(conn, world):
    tenant, route = world
    _some_traffic(conn, tenant, route, 5)
    snap = _snapshot(conn, tenant, route, "kto")
    sid = snap.id
    refused = psycopg.errors.ObjectNotInPrerequisiteState
    with pytest.raises(refused):
        conn.execute(
            "UPDATE train.dataset_example SET split = 'eval' WHERE snapshot_id = %s", (sid,)
        )
    with pytest.raises(refused):
        conn.execute("DELETE FROM train.dataset_example WHERE snapshot_id = %s", (sid,))
    with pytest.raises(refused):
        conn.execute("UPDATE train.dataset_snapshot SET set_hash = 'x' WHERE id = %s", (sid,))
    with pytest.raises(refused):
        conn.execute(
            "UPDATE train.dataset_snapshot SET query_sql = 'SELECT 1' WHERE id = %s", (sid,)
        )
    with pytest.raises(refused):
        conn.execute("DELETE FROM train.dataset_snapshot WHERE id = %s", (sid,))
    with pytest.raises(refused):
        conn.execute("TRUNCATE train.dataset_example")
    with pytest.raises(refused):
        conn.execute(
            "INSERT INTO train.dataset_example (snapshot_id, example_hash, split, log_ids, example)"
            " VALUES (%s, '\\x00', 'train', '{1}', '{}')",
            (sid,),
        )
    conn.execute(
        "UPDATE train.dataset_snapshot SET tainted_at = now(), tainted_reason = 'forgotten user' WHERE id = %s",
        (sid,),
    )
    assert datasets.verify_snapshot(conn, snapshot_id=sid) == datasets.SnapshotCheck(
        set_hash_ok=True, examples_ok=True, split_ok=True, n_examples=5
    )


def _draft(conn: Any, tenant: dict[str, Any], route: dict[str, Any]) -> str:
    """An unsealed snapshot (set_hash NULL) with two examples."""
    sid = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO train.dataset_snapshot (id, tenant_id, route, method, query_sql)"
        " VALUES (%s, %s, %s, 'kto', 'SELECT 1')",
        (sid, tenant["id"], route["name"]),
    )
    conn.execute(
        "INSERT INTO train.dataset_example (snapshot_id, example_hash, split, log_ids, example)"
        " VALUES (%s, '\\x01', 'train', '{1}', '{}'), (%s, '\\x02', 'eval', '{2}', '{}')",
        (sid, sid),
    )
    return sid


def test_examples_still_reference_an_existing_snapshot(conn, world):
    tenant, route = world
    fk = psycopg.errors.ForeignKeyViolation
    examples = "SELECT count(*) AS n FROM train.dataset_example WHERE snapshot_id = %s"
    # No declared foreign key any more (it cost a query per example): the triggers refuse
    # what it refused, for single rows and whole statements alike.
    with pytest.raises(fk):
        conn.execute(
            "INSERT INTO train.dataset_example (snapshot_id, example_hash, split, log_ids, example)"
            " VALUES (%s, '\\x00', 'train', '{1}', '{}')",
            (str(uuid.uuid4()),),
        )
    sid = _draft(conn, tenant, route)
    with pytest.raises(fk):
        conn.execute(
            "INSERT INTO train.dataset_example (snapshot_id, example_hash, split, log_ids, example)"
            " SELECT CASE WHEN i = 4 THEN gen_random_uuid() ELSE %s END, int4send(i), 'train',"
            " '{1}', '{}' FROM generate_series(3, 5) i",
            (sid,),
        )
    assert conn.execute(examples, (sid,)).fetchone()["n"] == 2
    with pytest.raises(fk):
        conn.execute(
            "UPDATE train.dataset_example SET snapshot_id = gen_random_uuid() WHERE snapshot_id = %s",
            (sid,),
        )
    with pytest.raises(fk):
        conn.execute(
            "UPDATE train.dataset_snapshot SET id = gen_random_uuid() WHERE id = %s", (sid,)
        )
    other = _draft(conn, tenant, route)
    # Deleting a draft deletes its examples (ON DELETE CASCADE, as before), and only its own.
    conn.execute("DELETE FROM train.dataset_snapshot WHERE id = %s", (sid,))
    assert conn.execute(examples, (sid,)).fetchone()["n"] == 0
    assert conn.execute(examples, (other,)).fetchone()["n"] == 2
    # A sealed snapshot still cannot be deleted, nor can its examples.
    _some_traffic(conn, tenant, route, 4)
    snap = _snapshot(conn, tenant, route, "kto")
    refused = psycopg.errors.ObjectNotInPrerequisiteState
    with pytest.raises(refused):
        conn.execute("DELETE FROM train.dataset_snapshot WHERE id = %s", (snap.id,))
    with pytest.raises(refused):
        conn.execute("DELETE FROM train.dataset_example WHERE snapshot_id = %s", (snap.id,))
    assert conn.execute(examples, (snap.id,)).fetchone()["n"] == 4
    fks = conn.execute(
        "SELECT count(*) AS n FROM pg_constraint WHERE conrelid = 'train.dataset_example'::regclass"
        " AND contype = 'f'"
    ).fetchone()
    assert fks["n"] == 0


def test_a_draft_deleted_meanwhile_refuses_the_examples(conn, world, db_url):
    tenant, route = world
    sid = _draft(conn, tenant, route)
    with psycopg.connect(db_url) as writer:
        # The writer holds the snapshot (FOR KEY SHARE, as the constraint's check did) ...
        writer.execute(
            "INSERT INTO train.dataset_example (snapshot_id, example_hash, split, log_ids, example)"
            " VALUES (%s, '\\x03', 'train', '{3}', '{}')",
            (sid,),
        )
        conn.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):  # ... so a delete must wait
            conn.execute("DELETE FROM train.dataset_snapshot WHERE id = %s", (sid,))
        conn.execute("RESET lock_timeout")
        writer.commit()
    conn.execute("DELETE FROM train.dataset_snapshot WHERE id = %s", (sid,))
    left = conn.execute(
        "SELECT count(*) AS n FROM train.dataset_example WHERE snapshot_id = %s", (sid,)
    ).fetchone()
    assert left["n"] == 0
    # Deleted first, then examples: refused.
    sid = _draft(conn, tenant, route)
    with psycopg.connect(db_url) as deleter:
        deleter.execute("DELETE FROM train.dataset_snapshot WHERE id = %s", (sid,))
        deleter.commit()
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        conn.execute(
            "INSERT INTO train.dataset_example (snapshot_id, example_hash, split, log_ids, example)"
            " VALUES (%s, '\\x04', 'train', '{4}', '{}')",
            (sid,),
        )


def test_rebuild_gives_identical_split_and_set_hash(conn, world):
    tenant, route = world
    _some_traffic(conn, tenant, route, 60)
    until = datetime.now(UTC) + timedelta(seconds=1)
    a = _snapshot(conn, tenant, route, "kto", until=until, eval_pct=20)
    b = _snapshot(conn, tenant, route, "kto", until=until, eval_pct=20)
    assert a.id != b.id
    assert a.set_hash == b.set_hash and len(a.set_hash) == 64
    assert (a.n_train, a.n_eval) == (b.n_train, b.n_eval)
    assert a.n_train + a.n_eval == 60 and 0 < a.n_eval < 30

    def splits(s):
        return {
            (bytes(r["example_hash"]), r["split"])
            for r in conn.execute(
                "SELECT example_hash, split FROM train.dataset_example WHERE snapshot_id = %s",
                (s.id,),
            )
        }

    assert splits(a) == splits(b)
    assert datasets.export_snapshot(
        conn, snapshot_id=a.id, split="eval"
    ) == datasets.export_snapshot(conn, snapshot_id=b.id, split="eval")
    # The set hash is reproducible by hand from the stored examples.
    h = conn.execute(
        "SELECT encode(sha256(string_agg(train.example_hash(example), ''::bytea"
        " ORDER BY train.example_hash(example))), 'hex') AS h FROM train.dataset_example WHERE snapshot_id = %s",
        (a.id,),
    ).fetchone()["h"]
    assert h == a.set_hash
    assert "FROM train.kto_candidate c" in a.query_sql
    # The statements that are not the candidate query are kept with it, as run.
    assert "FROM obs.deleted_log d" in a.params["dead_rows"]
    assert "c.log_ids, c.example\n  FROM train.kto_candidate c" in a.params["write"]
    assert a.params["until"] and a.params["eval_pct"] == 20


def test_api_role_can_snapshot_only_its_own_tenant(conn, world):
    tenant, route = world
    _some_traffic(conn, tenant, route, 3)
    other = make_tenant(conn)
    with psycopg.connect(conn.info.dsn, row_factory=dict_row) as c:
        as_tenant(c, other["id"])
        with pytest.raises(Exception, match="own behalf"):
            datasets.create_snapshot(c, tenant_id=tenant["id"], route=route["name"], method="kto")
        c.rollback()
        as_tenant(c, tenant["id"])
        snap = datasets.create_snapshot(
            c, tenant_id=tenant["id"], route=route["name"], method="kto"
        )
        assert snap.n_train + snap.n_eval == 3
        assert len(datasets.export_snapshot(c, snapshot_id=snap.id, split="train")) == snap.n_train
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SELECT * FROM train.kto_candidate")
        c.rollback()


def test_a_file_snapshot_is_taken_only_for_the_own_tenant_and_an_existing_route(conn, world):
    """train.create_file_snapshot (the fine-tuning API's) shares create_snapshot's check."""
    tenant, route = world
    other = make_tenant(conn)
    example = Jsonb([{"messages": [{"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": "hello"}]}])  # fmt: skip
    call = "SELECT id FROM train.create_file_snapshot(%s, %s, 'sft', %s, NULL, NULL, 'test')"
    with psycopg.connect(conn.info.dsn, row_factory=dict_row) as c:
        as_tenant(c, other["id"])
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="own behalf"):
            c.execute(call, (tenant["id"], route["name"], example))
        c.rollback()
        as_tenant(c, tenant["id"])
        with pytest.raises(psycopg.errors.NoDataFound, match="route nope not found"):
            c.execute(call, (tenant["id"], "nope", example))
        c.rollback()
        as_tenant(c, tenant["id"])
        assert c.execute(call, (tenant["id"], route["name"], example)).fetchone()["id"]
        c.rollback()


# --- export ------------------------------------------------------------------------------------


def test_rest_snapshot_get_and_export(conn, db_url, world):
    tenant, route = world
    _some_traffic(conn, tenant, route, 30)
    trainer = create_key(conn, tenant_id=tenant["id"], role="trainer")
    reader = create_key(conn, tenant_id=tenant["id"], role="reader")
    stranger = create_key(conn, tenant_id=make_tenant(conn)["id"], role="trainer")
    app = create_app(Settings(), db_url=db_url)
    with serve_app(app) as base:
        h = {"Authorization": f"Bearer {trainer}"}
        r = httpx.post(
            f"{base}/v1/datasets/snapshots",
            headers=h,
            json={"route": route["name"], "method": "kto", "eval_pct": 20},
        )
        assert r.status_code == 201, r.text
        snap = r.json()
        assert snap["n_train"] + snap["n_eval"] == 30 and snap["counts"]["exact_dedup"] == 30
        r = httpx.post(
            f"{base}/v1/datasets/snapshots",
            headers={"Authorization": f"Bearer {reader}"},
            json={"route": route["name"], "method": "kto"},
        )
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        r = httpx.post(
            f"{base}/v1/datasets/snapshots", headers=h, json={"route": "nope", "method": "kto"}
        )
        assert r.status_code == 404, r.text
        r = httpx.post(
            f"{base}/v1/datasets/snapshots",
            headers=h,
            json={"route": route["name"], "method": "ppo"},
        )
        assert r.status_code == 422
        r = httpx.get(
            f"{base}/v1/datasets/snapshots/{snap['id']}",
            headers={"Authorization": f"Bearer {reader}"},
        )
        assert r.status_code == 200 and r.json()["set_hash"] == snap["set_hash"]
        r = httpx.get(
            f"{base}/v1/datasets/snapshots/{snap['id']}",
            headers={"Authorization": f"Bearer {stranger}"},
        )
        assert r.status_code == 404
        r = httpx.get(f"{base}/v1/datasets/snapshots/{uuid.uuid4()}", headers=h)
        assert r.status_code == 404
        r = httpx.get(
            f"{base}/v1/datasets/snapshots/{snap['id']}/export", headers=h, params={"split": "eval"}
        )
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.text.splitlines()]
        assert len(lines) == snap["n_eval"]
        assert lines == datasets.export_snapshot(conn, snapshot_id=snap["id"], split="eval")
        r = httpx.get(
            f"{base}/v1/datasets/snapshots/{snap['id']}/export", headers=h, params={"split": "test"}
        )
        assert r.status_code == 422


def test_small_snapshot_still_has_one_eval_example_and_verifies(conn, world):
    tenant, route = world
    for i in range(3):
        log(conn, tenant, route, messages=_user(f"question {i}"), completion="a", fb_explicit=1)
    # eval_pct 1: with three examples, no bucket is likely below it, yet one goes to eval.
    snap = _snapshot(conn, tenant, route, "kto", dedup_threshold=0, eval_pct=1)
    assert (snap.n_train, snap.n_eval) == (2, 1)
    assert datasets.verify_snapshot(conn, snapshot_id=str(snap.id)).split_ok is True
    again = _snapshot(conn, tenant, route, "kto", dedup_threshold=0, eval_pct=1)
    ev = lambda s: {r["example_hash"] for r in conn.execute(  # noqa: E731
        "SELECT example_hash FROM train.dataset_example WHERE snapshot_id=%s AND split='eval'",
        (s.id,)).fetchall()}  # fmt: skip
    assert ev(snap) == ev(again)
    none = _snapshot(conn, tenant, route, "kto", dedup_threshold=0, eval_pct=0)
    assert none.n_eval == 0
