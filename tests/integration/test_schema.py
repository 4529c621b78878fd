"""The schema on real PostgreSQL 18 + pgvector: partitions, constraints, audit, roles, the split."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from app.core.db import server_versions
from tests.support.factories import make_adapter, make_log, make_route, make_tenant


def test_versions(conn):
    v = server_versions(conn)
    assert v["postgres"].startswith("18.")
    assert v["pgvector"].startswith("0.8.")


def _partition_of(conn, log_id):
    return conn.execute(
        "SELECT tableoid::regclass::text AS p FROM obs.inference_log WHERE id = %s", (log_id,)
    ).fetchone()["p"]


def test_default_partition_catches_far_rows_and_move_rescues_them(conn):
    t = make_tenant(conn)
    far = datetime(2031, 3, 5, 12, tzinfo=UTC)
    row = make_log(conn, tenant_id=t["id"], created_at=far)
    assert _partition_of(conn, row["id"]) == "obs.inference_log_default"

    # Beyond the window (4 weeks ahead by default) a row waits in DEFAULT for its week.
    assert conn.execute("SELECT * FROM obs.move_default_rows()").fetchall() == []
    assert _partition_of(conn, row["id"]) == "obs.inference_log_default"
    created = [
        r["move_default_rows"] for r in conn.execute("SELECT obs.move_default_rows(NULL, 52 * 6)")
    ]
    assert created == ["inference_log_2031w10"]
    assert _partition_of(conn, row["id"]) == "obs.inference_log_2031w10"
    # The moved row keeps its request key: a retry of the same request is still refused.
    with pytest.raises(psycopg.errors.UniqueViolation):
        make_log(conn, tenant_id=t["id"], request_id=row["request_id"])
    # The new partition carries the indexes of the parent, HNSW included.
    idx = conn.execute(
        "SELECT indexdef FROM pg_indexes WHERE schemaname='obs' AND tablename='inference_log_2031w10'"
    ).fetchall()
    defs = " ".join(r["indexdef"] for r in idx)
    assert (
        "hnsw" in defs
        and "halfvec_cosine_ops" in defs
        and "tenant_id, adapter_id, created_at" in defs
    )


def test_create_partition_moves_stray_rows_of_that_week(conn):
    t = make_tenant(conn)
    ts = datetime.now(UTC) + timedelta(weeks=20)
    row = make_log(conn, tenant_id=t["id"], created_at=ts)
    assert _partition_of(conn, row["id"]) == "obs.inference_log_default"
    made = conn.execute("SELECT * FROM obs.create_partitions(21)").fetchall()
    assert len(made) >= 16
    assert _partition_of(conn, row["id"]).startswith("obs.inference_log_20")
    assert conn.execute("SELECT count(*) AS n FROM obs.inference_log_default").fetchone()["n"] == 0
    # Idempotent.
    assert conn.execute("SELECT * FROM obs.create_partitions(21)").fetchall() == []


def test_drop_partitions_past_retention(conn):
    t = make_tenant(conn)
    old = datetime.now(UTC) - timedelta(days=200)
    make_log(conn, tenant_id=t["id"], created_at=old)
    conn.execute("SELECT obs.move_default_rows()")
    recent = make_log(conn, tenant_id=t["id"])
    stray = make_log(conn, tenant_id=t["id"], created_at=old - timedelta(days=400))
    dropped = [r["drop_partitions"] for r in conn.execute("SELECT obs.drop_partitions('90 days')")]
    assert len(dropped) == 1 and dropped[0].startswith("inference_log_")
    ids = {r["id"] for r in conn.execute("SELECT id FROM obs.inference_log")}
    assert ids == {recent["id"]}
    keys = conn.execute("SELECT count(*) AS n FROM obs.request_key").fetchone()["n"]
    assert keys == 1
    assert stray["id"] not in ids


def test_request_id_unique_per_tenant_across_partitions(conn):
    t1, t2 = make_tenant(conn), make_tenant(conn)
    rid = uuid.uuid4()
    make_log(conn, tenant_id=t1["id"], request_id=rid)
    with pytest.raises(psycopg.errors.UniqueViolation, match="already logged"):
        # Another week (another partition) does not escape the check.
        make_log(
            conn,
            tenant_id=t1["id"],
            request_id=rid,
            created_at=datetime.now(UTC) + timedelta(days=14),
        )
    # The same id in another tenant is a different request.
    make_log(conn, tenant_id=t2["id"], request_id=rid)


def test_one_prod_per_route(conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    make_adapter(conn, route=r, status="prod", traffic_pct=100)
    with pytest.raises(psycopg.errors.UniqueViolation):
        make_adapter(conn, route=r, status="prod", traffic_pct=100)
    other = make_route(conn, tenant_id=t["id"])
    make_adapter(conn, route=other, status="prod", traffic_pct=100)


@pytest.mark.parametrize(
    ("status", "pct"),
    [("canary", 101), ("canary", -1), ("prod", 50), ("candidate", 10), ("bogus", 0)],
)
def test_traffic_and_status_checks(conn, status, pct):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    with pytest.raises(psycopg.errors.CheckViolation):
        make_adapter(conn, route=r, status=status, traffic_pct=pct)


def test_canaries_of_a_route_sum_to_at_most_100(conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    make_adapter(conn, route=r, status="canary", traffic_pct=60)
    b = make_adapter(conn, route=r, status="canary", traffic_pct=40)
    with pytest.raises(psycopg.errors.CheckViolation, match="at most 100"):
        conn.execute("UPDATE serve.adapter SET traffic_pct = 40.01 WHERE id = %s", (b["id"],))
    with pytest.raises(psycopg.errors.CheckViolation):
        make_adapter(conn, route=r, status="canary", traffic_pct=1)


def test_audit_trigger_records_raw_sql_update_with_actor(conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    a = make_adapter(conn, route=r, status="candidate")
    # The canary gate wants eval results for the policy's required metrics.
    conn.execute(
        "INSERT INTO train.promotion_policy (tenant_id, route, suite_id, metric, direction)"
        " VALUES (%s, %s, 'heldout', 'loss', 'lower')",
        (t["id"], r["name"]),
    )
    conn.execute(
        "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
        " VALUES (%s, 'heldout', 'loss', 1.5)",
        (a["id"],),
    )
    with conn.transaction():
        conn.execute("SET LOCAL application_name = 'release-console'")
        conn.execute("SET LOCAL ROLE cft_release")
        conn.execute("SET LOCAL cft.reason = 'start canary at 5%'")
        conn.execute(
            "UPDATE serve.adapter SET status='canary', traffic_pct=5 WHERE id=%s", (a["id"],)
        )
    ev = conn.execute(
        "SELECT * FROM serve.adapter_event WHERE adapter_id=%s ORDER BY id", (a["id"],)
    ).fetchall()
    assert [e["op"] for e in ev] == ["INSERT", "UPDATE"]
    upd = ev[1]
    assert (upd["old_status"], upd["new_status"]) == ("candidate", "canary")
    assert (float(upd["old_traffic_pct"]), float(upd["new_traffic_pct"])) == (0.0, 5.0)
    assert upd["actor"] == "postgres as cft_release"
    assert upd["application_name"] == "release-console"
    assert upd["reason"] == "start canary at 5%"


def test_notify_on_adapter_change(db_url, conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN cft_adapter")
        make_adapter(conn, route=r)
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert got == [r["name"]]


def test_dashboard_role_cannot_update_adapters(conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    a = make_adapter(conn, route=r)
    with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
        conn.execute("SET LOCAL ROLE cft_dashboard")
        conn.execute("UPDATE serve.adapter SET status='retired' WHERE id=%s", (a["id"],))
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cft_dashboard")
        assert conn.execute("SELECT count(*) AS n FROM serve.adapter").fetchone()["n"] == 1
        assert conn.execute("SELECT count(*) AS n FROM obs.inference_log").fetchone()["n"] == 0


def test_release_role_may_change_status_but_not_weights(conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    a = make_adapter(conn, route=r)
    with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
        conn.execute("SET LOCAL ROLE cft_release")
        conn.execute("UPDATE serve.adapter SET weights_uri='s3://evil' WHERE id=%s", (a["id"],))


def test_tenant_isolation_by_row_level_security(conn):
    t1, t2 = make_tenant(conn), make_tenant(conn)
    make_log(conn, tenant_id=t1["id"])
    b = make_log(conn, tenant_id=t2["id"])
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cft_app")
        conn.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(t1["id"]),))
        # No WHERE tenant_id: still only tenant 1.
        rows = conn.execute("SELECT tenant_id FROM obs.inference_log").fetchall()
        assert {r["tenant_id"] for r in rows} == {t1["id"]}
        upd = conn.execute(
            "UPDATE obs.inference_log SET fb_explicit = 1 WHERE request_id = %s", (b["request_id"],)
        )
        assert upd.rowcount == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO obs.inference_log (request_id, tenant_id, route, adapter_id, messages)"
                " VALUES (gen_random_uuid(), %s, 'r', 'a', '[]')",
                (t2["id"],),
            )
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cft_app")  # no tenant set: nothing visible
        assert conn.execute("SELECT count(*) AS n FROM obs.inference_log").fetchone()["n"] == 0


def test_assign_adapter_sticky_and_exact_share(conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"], experiment="exp-1")
    prod = make_adapter(conn, route=r, status="prod", traffic_pct=100)
    canary = make_adapter(conn, route=r, status="canary", traffic_pct=20)
    # The share is exact: the bucket is md5-based and never negative (hashtext(x) % 100 is
    # negative for about half of all inputs, which would hand a 5 % canary ~55 % of users).
    rows = conn.execute(
        "SELECT serve.assign_adapter(%s, %s, 'user-' || g) AS a FROM generate_series(1, 20000) g",
        (t["id"], r["name"]),
    ).fetchall()
    share = sum(1 for x in rows if x["a"] == canary["id"]) / len(rows)
    assert 0.19 < share < 0.21
    assert {x["a"] for x in rows} == {prod["id"], canary["id"]}
    again = conn.execute(
        "SELECT serve.assign_adapter(%s, %s, 'user-7') AS a", (t["id"], r["name"])
    ).fetchone()
    assert again["a"] == rows[6]["a"]
