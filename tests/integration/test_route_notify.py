"""NOTIFY cft_route carries a route's committed state; the router applies it without a read,
except when the state may miss an earlier change (then it reads the route, with every other
route dropped at the same time, in one query), and reads every cached route again, in one
query, once its LISTEN connections are back after a drop."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from app.core.metrics import REGISTRY
from app.gateway import table as route_table
from app.gateway.assign import RouteState
from app.gateway.table import RouteTable, load_route
from tests.support.factories import make_adapter, make_route, make_tenant


def wait_for(what: str, ok: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.005)


def cached(table: RouteTable, key: tuple[int, str]) -> RouteState | None:
    """The route's (tenant id, name) cached state (None when not cached); never reads."""
    hit, state = table.peek(*key)
    return state if hit else None


def pcts(state: RouteState | None) -> dict[str, Decimal]:
    return {c.adapter_id: c.traffic_pct for c in state.canaries} if state else {}


def set_pct(conn: Any, adapter: dict[str, Any], pct: int) -> None:
    conn.execute("UPDATE serve.adapter SET traffic_pct = %s WHERE id = %s", (pct, adapter["id"]))


@pytest.fixture
def world(conn: Any) -> dict[str, Any]:
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    return {
        "route": r,
        "prod": make_adapter(conn, route=r, status="prod", traffic_pct=100),
        "c1": make_adapter(conn, route=r, status="canary", traffic_pct=10),
        "c2": make_adapter(conn, route=r, status="canary", traffic_pct=10),
    }


@pytest.fixture
def table(db_url: str) -> Any:
    table = RouteTable(db_url, ttl=3600)
    table.start()
    assert table.listening.wait(5)
    yield table
    table.stop()


def test_payload_is_the_final_state_at_commit(db_url, conn, world):
    name = world["route"]["name"]
    key = (world["route"]["tenant_id"], world["route"]["name"])
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN cft_route")
        with conn.transaction():
            set_pct(conn, world["c1"], 20)
            # After the adapter's row: the deferred trigger still sends the state at COMMIT.
            conn.execute("UPDATE serve.route SET experiment = 'exp-2' WHERE name = %s", (name,))
        got = [json.loads(n.payload) for n in listener.notifies(timeout=2, stop_after=1)]
        got += [json.loads(n.payload) for n in listener.notifies(timeout=0.2)]
    assert got and all(p["route"] == name for p in got)
    assert all(p["tenant_id"] == world["route"]["tenant_id"] for p in got)
    want = load_route(conn, *key)
    for p in got:
        state = p["state"]
        assert state["experiment"] == "exp-2" and state["prod"] == world["prod"]["id"]
        assert [(c["id"], c["traffic_pct"]) for c in state["canaries"]] == [
            (world["c1"]["id"], "20.00"),
            (world["c2"]["id"], "10.00"),
        ]
        assert int(p["xid"]) > 0 and p["snapshot"].count(":") == 2
        assert want is not None and pcts(want) == {
            world["c1"]["id"]: Decimal("20.00"),
            world["c2"]["id"]: Decimal("10.00"),
        }


def reads() -> float:
    """Route reads from PostgreSQL so far (cft_router_route_reads_total, every reason)."""
    return sum(
        REGISTRY.get_sample_value("cft_router_route_reads_total", {"why": why}) or 0.0
        for why in ("miss", "notify", "resync", "stale")
    )


def test_a_change_is_applied_from_the_notify_without_a_read(conn, world, table):
    c1 = world["c1"]
    key = (world["route"]["tenant_id"], world["route"]["name"])
    assert table.get(*key) is not None
    # The first NOTIFY of a route since LISTEN is read (what came before it is unknown).
    set_pct(conn, c1, 11)
    wait_for("first change cached", lambda: pcts(cached(table, key)).get(c1["id"]) == 11)
    before = reads()
    set_pct(conn, c1, 12)
    wait_for("second change cached", lambda: pcts(cached(table, key)).get(c1["id"]) == 12)
    conn.execute("UPDATE serve.adapter SET status = 'retired' WHERE id = %s", (c1["id"],))
    wait_for("retired canary gone", lambda: c1["id"] not in pcts(cached(table, key)))
    assert reads() == before
    assert cached(table, key) == load_route(conn, *key)


def test_a_state_older_than_the_previous_change_is_read_not_applied(db_url, conn, world, table):
    c1, c2 = world["c1"], world["c2"]
    key = (world["route"]["tenant_id"], world["route"]["name"])
    assert table.get(*key) is not None
    set_pct(conn, c1, 11)
    wait_for("first change cached", lambda: pcts(cached(table, key)).get(c1["id"]) == 11)
    with (
        psycopg.connect(db_url, autocommit=True) as listener,
        psycopg.connect(db_url) as old,
    ):
        listener.execute("LISTEN cft_route")
        old.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        old.execute("SELECT 1")  # its snapshot, before the next change
        set_pct(conn, c1, 12)
        wait_for("c1 at 12", lambda: pcts(cached(table, key)).get(c1["id"]) == 12)
        set_pct(old, c2, 15)
        old.commit()
        got = [json.loads(n.payload) for n in listener.notifies(timeout=2, stop_after=2)]
    # The second payload's state misses the first change (its snapshot is older) ...
    stale = {c["id"]: c["traffic_pct"] for c in got[-1]["state"]["canaries"]}
    assert stale == {c1["id"]: "11.00", c2["id"]: "15.00"}
    # ... so the router read the route instead: both changes, and c1 never went back to 11.
    wait_for("c2 at 15", lambda: pcts(cached(table, key)).get(c2["id"]) == 15)
    assert pcts(cached(table, key)) == {c1["id"]: 12, c2["id"]: 15}


def test_a_burst_of_changes_is_read_in_a_few_queries_not_one_per_route(conn, world, table):
    """30 routes' first NOTIFYs since LISTEN (each must be read) cost a few queries."""
    routes = [world["route"]] + [
        make_route(conn, tenant_id=world["route"]["tenant_id"]) for _ in range(29)
    ]
    prods = {
        r["name"]: make_adapter(conn, route=r, status="prod", traffic_pct=100) for r in routes[1:]
    }
    prods[world["route"]["name"]] = world["prod"]
    keys = [(r["tenant_id"], r["name"]) for r in routes]
    for key in keys:
        assert table.get(*key) is not None
    before = reads()
    with conn.transaction():  # one commit: 30 NOTIFYs at once
        for r in routes:
            conn.execute(
                "UPDATE serve.adapter SET status = 'retired', traffic_pct = 0 WHERE id = %s",
                (prods[r["name"]]["id"],),
            )

    def all_retired() -> bool:
        states = [cached(table, k) for k in keys]
        return all(s is not None and s.prod is None for s in states)

    wait_for("every route re-read", all_retired)
    assert reads() - before <= 3, reads() - before


def test_after_the_listen_connections_drop_every_cached_route_is_read_in_one_query(
    db_url, conn, world, table
):
    key = (world["route"]["tenant_id"], world["route"]["name"])
    others = [make_route(conn, tenant_id=world["route"]["tenant_id"]) for _ in range(9)]
    for k in [key] + [(r["tenant_id"], r["name"]) for r in others]:
        assert table.get(*k) is not None
    before = REGISTRY.get_sample_value("cft_router_route_reads_total", {"why": "resync"}) or 0.0
    pids = [
        r["pid"]
        for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            (route_table.LISTENER_NAME,),
        ).fetchall()
    ]
    for pid in pids:
        conn.execute("SELECT pg_terminate_backend(%s, 2000)", (pid,))
    # A change while nobody listens: its NOTIFY is lost.
    conn.execute("UPDATE serve.route SET experiment = 'exp-lost' WHERE name = %s", (key[1],))
    wait_for("listening again", lambda: table.listening.is_set() and bool(listen_pids(conn)), 10)
    after = REGISTRY.get_sample_value("cft_router_route_reads_total", {"why": "resync"})
    assert after == before + 1  # ten cached routes, one query
    hit, state = table.peek(*key)
    assert hit and state is not None and state.experiment == "exp-lost"


def listen_pids(conn: Any) -> list[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
        (route_table.LISTENER_NAME,),
    ).fetchall()
    return [r["pid"] for r in rows]
