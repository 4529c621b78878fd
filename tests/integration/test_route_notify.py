"""NOTIFY cft_route carries a route's committed state; the router applies it without a read,
except when the state may miss an earlier change (then it reads the route)."""

from __future__ import annotations

import json
import select
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import psycopg
import pytest

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


def test_a_change_is_applied_from_the_notify_without_a_read(monkeypatch, conn, world, table):
    c1 = world["c1"]
    key = (world["route"]["tenant_id"], world["route"]["name"])
    assert table.get(*key) is not None
    # The first NOTIFY of a route since LISTEN is read (what came before it is unknown).
    set_pct(conn, c1, 11)
    wait_for("first change cached", lambda: pcts(cached(table, key)).get(c1["id"]) == 11)
    reads: list[tuple[int, str]] = []
    real_read = table._read

    def counted(route: tuple[int, str], **kw: Any) -> RouteState | None:
        reads.append(route)
        return real_read(route, **kw)

    monkeypatch.setattr(table, "_read", counted)
    set_pct(conn, c1, 12)
    wait_for("second change cached", lambda: pcts(cached(table, key)).get(c1["id"]) == 12)
    conn.execute("UPDATE serve.adapter SET status = 'retired' WHERE id = %s", (c1["id"],))
    wait_for("retired canary gone", lambda: c1["id"] not in pcts(cached(table, key)))
    assert reads == []
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


def test_a_lookup_takes_in_a_notify_before_the_listener_thread_runs(db_url, conn, world):
    name = world["route"]["name"]
    key = (world["route"]["tenant_id"], world["route"]["name"])
    table = RouteTable(db_url, ttl=3600)  # no listener thread: only lookups take NOTIFYs in
    with (
        psycopg.connect(db_url, autocommit=True) as one,
        psycopg.connect(db_url, autocommit=True) as two,
    ):
        one.execute("LISTEN cft_route")
        two.execute("LISTEN cft_route")
        table._conns, table._fds = [one, two], (one.pgconn.socket, two.pgconn.socket)
        both = []
        for fd in table._fds:
            both.append(select.poll())
            both[-1].register(fd, select.POLLIN)
        assert table.get(*key) is not None
        set_pct(conn, world["c1"], 11)  # the first NOTIFY since LISTEN: dropped, read
        assert all(p.poll(2000) for p in both)
        assert table.lookup(*key) == (False, None)
        assert table._reloads.get_nowait() == key  # once, not once per connection
        assert pcts(table.get(*key))[world["c1"]["id"]] == 11
        conn.execute("UPDATE serve.route SET experiment = 'exp-3' WHERE name = %s", (name,))
        assert all(p.poll(2000) for p in both)
        hit, state = table.lookup(*key)  # applied from the sockets by the lookup itself
        assert hit and state is not None and state.experiment == "exp-3"
        set_pct(conn, world["c2"], 12)
        wait_for("c2 at 12", lambda: pcts(table.lookup(*key)[1]).get(world["c2"]["id"]) == 12)
        time.sleep(0.1)  # the second copies arrive too
        assert pcts(table.lookup(*key)[1])[world["c2"]["id"]] == 12
        assert table._reloads.empty()  # the second copies were not taken for older states
        table._conns, table._fds = [], ()
