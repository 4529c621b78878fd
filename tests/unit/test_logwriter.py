"""The router's log writer: batches, retries until written, overflows instead of dropping."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from app.gateway.logwriter import LogWriter


class Sink:
    def __init__(self, fail_first: int = 0, gate: threading.Event | None = None) -> None:
        self.batches: list[list[str]] = []
        self.fail_first = fail_first
        self.gate = gate

    def __call__(self, batch: list[dict[str, Any]]) -> None:
        if self.gate is not None:
            self.gate.wait()
        if self.fail_first:
            self.fail_first -= 1
            raise ConnectionError("PostgreSQL is down")
        self.batches.append([r["request_id"] for r in batch])


def records(n: int) -> list[dict[str, Any]]:
    return [{"request_id": f"r{i}"} for i in range(n)]


def test_batches_close_flushes_and_wait_written() -> None:
    sink = Sink()

    async def main() -> LogWriter:
        writer = LogWriter(sink, batch_size=10, max_delay=0.01)
        writer.start()
        for rec in records(25):
            writer.submit(rec)
        assert await asyncio.to_thread(writer.wait_written, "r24", 5.0)
        assert writer.wait_written("never-queued", 0.0)
        await writer.close()
        return writer

    writer = asyncio.run(main())
    assert [r for b in sink.batches for r in b] == [f"r{i}" for i in range(25)]
    assert max(len(b) for b in sink.batches) <= 10
    assert writer.written == 25 and writer.pending == 0


def test_a_failed_batch_is_retried_until_written() -> None:
    sink = Sink(fail_first=2)

    async def main() -> LogWriter:
        writer = LogWriter(sink, max_delay=0.0, max_backoff=0.2)
        writer.start()
        writer.submit({"request_id": "x"})
        await writer.close()
        return writer

    writer = asyncio.run(main())
    assert sink.batches == [["x"]] and writer.failures == 2


def test_a_full_queue_overflows_in_order_and_loses_nothing() -> None:
    gate = threading.Event()
    sink = Sink(gate=gate)

    async def main() -> LogWriter:
        writer = LogWriter(sink, maxsize=5, batch_size=3, max_delay=0.0)
        writer.start()
        for rec in records(40):
            writer.submit(rec)  # the sink is blocked: the queue fills, the rest overflows
        assert writer.pending >= 30
        gate.set()
        await writer.close()
        return writer

    writer = asyncio.run(main())
    assert [r for b in sink.batches for r in b] == [f"r{i}" for i in range(40)]
    assert writer.pending == 0


class Poison(ValueError):
    """A record the sink can never write."""


def test_a_record_that_can_never_be_written_is_split_out_and_dropped() -> None:
    written: list[str] = []
    dropped: list[str] = []

    def sink(batch: list[dict[str, Any]]) -> None:
        if any(r.get("bad") for r in batch):
            raise Poison("invalid record")
        written.extend(r["request_id"] for r in batch)

    async def main() -> LogWriter:
        writer = LogWriter(
            sink,
            batch_size=50,
            max_delay=0.05,
            permanent=(Poison,),
            on_drop=lambda rec, exc: dropped.append(rec["request_id"]),
        )
        writer.start()
        recs = records(20)
        recs[7]["bad"] = recs[13]["bad"] = True
        for rec in recs:
            writer.submit(rec)
        assert await asyncio.to_thread(writer.wait_written, "r13", 5.0)
        await asyncio.wait_for(writer.close(), 5.0)
        return writer

    writer = asyncio.run(main())
    assert sorted(written) == sorted(f"r{i}" for i in range(20) if i not in (7, 13))
    assert dropped == ["r7", "r13"] and writer.dropped == 2 and writer.failures == 0


def test_the_routers_permanent_errors_leave_a_concurrent_duplicate_to_the_retry() -> None:
    """unique_violation (a concurrent write of the same request id) is retried, not dropped:
    the retry finds the row and skips it."""
    import psycopg

    from app.gateway.logsink import PERMANENT_LOG_ERRORS

    calls: list[int] = []

    def sink(batch: list[dict[str, Any]]) -> None:
        calls.append(len(batch))
        if len(calls) == 1:
            raise psycopg.errors.UniqueViolation("request id already logged")

    async def main() -> LogWriter:
        writer = LogWriter(sink, max_delay=0.0, max_backoff=0.05, permanent=PERMANENT_LOG_ERRORS)
        writer.start()
        writer.submit({"request_id": "x"})
        await writer.close()
        return writer

    writer = asyncio.run(main())
    assert calls == [1, 1] and writer.dropped == 0 and writer.written == 1
    assert writer.failures == 1
