"""The router's log writer through its child process (app/gateway/logprocess.py): a killed
child loses nothing and close() ends the child. (A record it can never store:
test_log_batch.py, both sinks.)"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from typing import Any

from app.core.config import get_settings
from app.core.metrics import ROUTER_LOG_PROCESS_RESTARTS
from app.gateway.logprocess import WRITER_PERMANENT_ERRORS, ProcessSink
from app.gateway.logsink import TENANT_KEY
from app.gateway.logwriter import LogWriter
from tests.support.factories import make_route, make_tenant


def _records(tenant_id: int, route: str, n: int) -> list[dict[str, Any]]:
    return [
        {
            TENANT_KEY: tenant_id,
            "request_id": str(uuid.uuid4()),
            "route": route,
            "messages": [{"role": "user", "content": f"q{i}"}],
            "completion": f"a{i}",
            "user": f"u{i % 3}",
            "status": "ok",
        }
        for i in range(n)
    ]


def _stored(conn: Any, records: list[dict[str, Any]]) -> int:
    ids = [r["request_id"] for r in records]
    row = conn.execute(
        "SELECT count(*) AS n FROM obs.inference_log WHERE request_id = ANY(%s::uuid[])", (ids,)
    ).fetchone()
    return int(row["n"])


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """The process has exited and been reaped."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_killed_log_process_loses_nothing_and_close_ends_the_next(db_url, conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    first, second = _records(t["id"], r["name"], 5), _records(t["id"], r["name"], 7)
    sink = ProcessSink(db_url, get_settings(), inline_max=0)
    restarts = ROUTER_LOG_PROCESS_RESTARTS._value.get()

    async def main() -> tuple[LogWriter, int]:
        writer = LogWriter(
            sink,
            max_delay=0.01,
            max_backoff=0.2,
            permanent=WRITER_PERMANENT_ERRORS,
        )
        writer.start()
        for rec in first:
            writer.submit(rec)
        assert await asyncio.to_thread(writer.wait_written, first[-1]["request_id"], 30.0)
        killed = sink.pid
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        for rec in second:
            writer.submit(rec)
        assert await asyncio.to_thread(writer.wait_written, second[-1]["request_id"], 30.0)
        await asyncio.wait_for(writer.close(), 30.0)
        return writer, killed

    try:
        writer, killed = asyncio.run(main())
        # Every record written once, by the first child or by the one started after the kill.
        assert writer.written == 12 and writer.dropped == 0
        assert _stored(conn, first + second) == 12
        assert sink.restarts == 1
        assert ROUTER_LOG_PROCESS_RESTARTS._value.get() == restarts + 1
        survivor = sink.pid
        assert survivor is not None and survivor != killed
    finally:
        sink.close()
    assert sink.pid is None and _gone(survivor)


def test_small_batches_are_written_inline_and_larger_ones_by_the_child(db_url, conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    small, large = _records(t["id"], r["name"], 4), _records(t["id"], r["name"], 5)
    sink = ProcessSink(db_url, get_settings(), inline_max=4)
    try:
        sink(small)
        assert sink.pid is None  # no child was needed
        assert _stored(conn, small) == 4
        sink(large)
        assert sink.pid is not None
        assert _stored(conn, large) == 5
        sink(small)  # written before: nothing twice
        assert _stored(conn, small) == 4
    finally:
        sink.close()


def test_the_log_process_outlives_a_stop_signal_until_the_router_closes_it(db_url, conn):
    """A stop signal sent to every process (a cgroup's SIGTERM) must not take the log process
    down before the router has flushed through it: it writes on, and ends at close()."""
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    records = _records(t["id"], r["name"], 6)
    sink = ProcessSink(db_url, get_settings(), inline_max=0)
    try:
        sink(records[:3])  # the child is up and has written
        child = sink.pid
        assert child is not None
        os.kill(child, signal.SIGTERM)
        os.kill(child, signal.SIGINT)
        sink(records[3:])
        assert sink.pid == child and sink.restarts == 0
        assert _stored(conn, records) == 6
    finally:
        sink.close()
    assert _gone(child)
