"""The router's split and serve.assign_adapter agree, the share is exact, NOTIFY refreshes."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from app.core.config import get_settings
from app.gateway import logsink
from app.gateway import table as route_table
from app.gateway.logsink import TENANT_KEY, LogSink
from app.gateway.table import RouteTable, load_route
from tests.support.factories import make_adapter, make_route, make_tenant

USERS = 100_000


def backends(conn, application_name: str) -> list[int]:
    """The pids of this database's connections with that application_name."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = %s",
        (application_name,),
    ).fetchall()
    return [r["pid"] for r in rows]


@pytest.mark.parametrize("pct", [1, 5, 50])
def test_router_and_sql_agree_for_100k_users_with_exact_share(conn, pct):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"], experiment=f"exp-{pct}")
    prod = make_adapter(conn, route=r, status="prod", traffic_pct=100)
    canary = make_adapter(conn, route=r, status="canary", traffic_pct=pct)
    state = load_route(conn, r["tenant_id"], r["name"])
    rows = conn.execute(
        "SELECT g, serve.assign_adapter(%s, %s, 'user-' || g) AS a FROM generate_series(1, %s) g",
        (r["tenant_id"], r["name"], USERS),
    ).fetchall()
    mismatches = [x["g"] for x in rows if state.assign(f"user-{x['g']}").adapter_id != x["a"]]
    assert mismatches == []
    share = sum(1 for x in rows if x["a"] == canary["id"]) / USERS
    # Binomial sampling error of 100k users: 4 sigma.
    sigma = (pct / 100 * (1 - pct / 100) / USERS) ** 0.5
    assert abs(share - pct / 100) < 4 * sigma
    assert {x["a"] for x in rows} == {prod["id"], canary["id"]}


def test_two_canaries_take_consecutive_ranges_and_variants(conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    make_adapter(conn, route=r, status="prod", traffic_pct=100)
    c1 = make_adapter(conn, route=r, status="canary", traffic_pct=10)
    c2 = make_adapter(conn, route=r, status="canary", traffic_pct=15)
    state = load_route(conn, r["tenant_id"], r["name"])
    got = [state.assign(f"u{i}") for i in range(20000)]
    by_variant = {v: sum(1 for a in got if a.variant == v) / len(got) for v in "ABC"}
    assert abs(by_variant["B"] - 0.10) < 0.01 and abs(by_variant["C"] - 0.15) < 0.01
    assert {a.adapter_id for a in got if a.variant == "B"} == {c1["id"]}
    assert {a.adapter_id for a in got if a.variant == "C"} == {c2["id"]}
    rows = conn.execute(
        "SELECT serve.assign_adapter(%s, %s, 'u' || g) AS a FROM generate_series(0, 1999) g",
        (r["tenant_id"], r["name"]),
    ).fetchall()
    assert [x["a"] for x in rows] == [a.adapter_id for a in got[:2000]]


def test_sticky_while_split_unchanged(conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    make_adapter(conn, route=r, status="prod", traffic_pct=100)
    make_adapter(conn, route=r, status="canary", traffic_pct=30)
    state = load_route(conn, r["tenant_id"], r["name"])
    first = [state.assign(f"user-{i}").adapter_id for i in range(1000)]
    again = [
        load_route(conn, r["tenant_id"], r["name"]).assign(f"user-{i}").adapter_id
        for i in range(1000)
    ]
    assert first == again


def test_route_table_refreshes_on_notify_before_ttl(db_url, conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    a = make_adapter(conn, route=r, status="prod", traffic_pct=100)
    table = RouteTable(db_url, ttl=3600)
    table.start()
    try:
        assert table.listening.wait(5)
        assert table.get(r["tenant_id"], r["name"]).prod == a["id"]
        conn.execute(
            "UPDATE serve.adapter SET status='retired', traffic_pct=0 WHERE id=%s", (a["id"],)
        )
        deadline = time.monotonic() + 2
        while table.get(r["tenant_id"], r["name"]).prod is not None:
            assert time.monotonic() < deadline, "NOTIFY did not refresh the route within 2 s"
            time.sleep(0.01)
    finally:
        table.stop()


def test_notify_recaches_the_new_state_over_one_kept_connection(db_url, conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    a = make_adapter(conn, route=r, status="prod", traffic_pct=100)
    table = RouteTable(db_url, ttl=3600)
    table.start()
    try:
        assert table.listening.wait(5)
        assert table.get(r["tenant_id"], r["name"]).prod == a["id"]
        [pid] = backends(conn, route_table.READER_NAME)
        assert len(backends(conn, route_table.LISTENER_NAME)) == route_table.LISTENERS
        conn.execute(
            "UPDATE serve.adapter SET status='retired', traffic_pct=0 WHERE id=%s", (a["id"],)
        )
        # The listener re-reads the route itself: it is cached with the new state before any
        # caller asks (peek never reads), over the same kept connection.
        deadline = time.monotonic() + 2
        while not ((hit := table.peek(r["tenant_id"], r["name"]))[0] and hit[1].prod is None):
            assert time.monotonic() < deadline, "the route was not re-read after NOTIFY"
            time.sleep(0.005)
        assert backends(conn, route_table.READER_NAME) == [pid]
        # A kept connection that died (backend terminated) is replaced on the next read.
        conn.execute("SELECT pg_terminate_backend(%s, 2000)", (pid,))
        table.invalidate((r["tenant_id"], r["name"]))
        assert table.get(r["tenant_id"], r["name"]).prod is None
        [new_pid] = backends(conn, route_table.READER_NAME)
        assert new_pid != pid
    finally:
        table.stop()


def test_log_sink_keeps_one_connection_and_replaces_a_dead_one(db_url, conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    sink = LogSink(db_url, get_settings())

    def record() -> dict[str, object]:
        rid = str(uuid.uuid4())
        msgs = [{"role": "user", "content": "hi"}]
        return {TENANT_KEY: t["id"], "request_id": rid, "route": r["name"], "messages": msgs}

    try:
        sink([record(), record()])
        [pid] = backends(conn, logsink.APPLICATION_NAME)
        sink([record()])
        assert backends(conn, logsink.APPLICATION_NAME) == [pid]  # kept, not one per batch
        conn.execute("SELECT pg_terminate_backend(%s, 2000)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            sink([record()])  # the writer retries a failed batch (idempotent by request_id)
        last = record()
        sink([last])  # a new connection
        row = conn.execute(
            "SELECT count(*) AS n FROM obs.inference_log WHERE tenant_id = %s", (t["id"],)
        ).fetchone()
        assert row["n"] == 4
    finally:
        sink.close()


def test_route_table_converges_within_ttl_without_listener(db_url, conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    a = make_adapter(conn, route=r, status="prod", traffic_pct=100)
    table = RouteTable(db_url, ttl=0.3)  # listener never started: notifications are lost
    assert table.get(r["tenant_id"], r["name"]).prod == a["id"]
    conn.execute("UPDATE serve.adapter SET status='retired', traffic_pct=0 WHERE id=%s", (a["id"],))
    assert table.get(r["tenant_id"], r["name"]).prod == a["id"]  # stale within the TTL
    time.sleep(0.35)
    assert table.get(r["tenant_id"], r["name"]).prod is None


def test_route_table_lookup_serves_stale_once_while_one_read_refreshes(db_url, conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    a = make_adapter(conn, route=r, status="prod", traffic_pct=100)
    table = RouteTable(db_url, ttl=0.3)  # no listener: only the TTL refreshes
    assert table.lookup(r["tenant_id"], r["name"]) == (
        False,
        None,
    )  # never read: the caller reads it
    assert table.get(r["tenant_id"], r["name"]).prod == a["id"]
    conn.execute("UPDATE serve.adapter SET status='retired', traffic_pct=0 WHERE id=%s", (a["id"],))
    time.sleep(0.35)
    cached, state = table.lookup(
        r["tenant_id"], r["name"]
    )  # expired: served as is, refreshed behind
    assert cached and state is not None and state.prod == a["id"]
    deadline = time.monotonic() + 5
    while (
        state := table.lookup(r["tenant_id"], r["name"])[1]
    ) is not None and state.prod is not None:
        assert time.monotonic() < deadline, "the background refresh never landed"
        time.sleep(0.005)
    assert table.peek(r["tenant_id"], r["name"])[0]  # fresh again
    table.invalidate(
        (r["tenant_id"], r["name"])
    )  # as a NOTIFY does: no stale state is served after it
    assert table.lookup(r["tenant_id"], r["name"]) == (False, None)


def test_without_prod_the_base_is_the_control_arm(conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    canary = make_adapter(conn, route=r, status="canary", traffic_pct=20)
    state = load_route(conn, r["tenant_id"], r["name"])
    got = [state.assign(f"u{i}") for i in range(2000)]
    assert {(a.adapter_id, a.variant) for a in got} == {(None, "A"), (canary["id"], "B")}
    rows = conn.execute(
        "SELECT serve.assign_adapter(%s, %s, 'u' || g) AS a FROM generate_series(0, 1999) g",
        (r["tenant_id"], r["name"]),
    ).fetchall()
    assert [x["a"] for x in rows] == [a.adapter_id for a in got]
