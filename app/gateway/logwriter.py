"""Asynchronous, batched, lossless writer of the router's inference logs.

The router answers the client first and hands the log record to this writer. Records wait in a
bounded queue; a single task writes them in batches (up to `batch_size` records or
`max_delay` seconds). Nothing is dropped:
- if PostgreSQL is down, the batch is retried with exponential backoff (capped) until it lands;
  writes are idempotent by (tenant, request_id), so a retry after an ambiguous failure does
  not duplicate rows;
- while it is down the queue fills; when full, `put` waits (back-pressure: new calls slow down
  instead of records being lost);
- `close()` flushes everything still queued before the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("cft.gateway.logs")

WriteBatch = Callable[[list[dict[str, Any]]], None]


class LogWriter:
    """Bounded queue + one writer task; see the module docstring for the guarantees."""

    def __init__(
        self,
        write_batch: WriteBatch,
        *,
        maxsize: int = 10_000,
        batch_size: int = 500,
        max_delay: float = 0.05,
        max_backoff: float = 5.0,
    ):
        self._write_batch = write_batch
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=maxsize)
        self._batch_size = batch_size
        self._max_delay = max_delay
        self._max_backoff = max_backoff
        self._task: asyncio.Task[None] | None = None
        self._pending_puts: set[asyncio.Task[None]] = set()
        self.written = 0
        self.failures = 0
        # request_ids queued and not yet written (feedback may arrive before the row). A set
        # and one condition, not an Event per record: an Event costs ~15 µs on the hot path.
        self._unwritten: set[str] = set()
        self._written_cond = threading.Condition()

    def start(self) -> None:
        """Start the writer task on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cft-log-writer")

    @property
    def pending(self) -> int:
        """Records queued and not yet written."""
        return self._queue.qsize()

    async def put(self, record: dict[str, Any]) -> None:
        """Queue a record; waits while the queue is full (back-pressure)."""
        self._track(record)
        await self._queue.put(record)

    def _track(self, record: dict[str, Any]) -> None:
        rid = record.get("request_id")
        if rid:
            self._unwritten.add(str(rid))

    def wait_written(self, request_id: str, timeout: float) -> bool:
        """Block (in a worker thread) until request_id's record is written; False on timeout.

        Returns True at once for ids this writer never queued.
        """
        if request_id not in self._unwritten:
            return True
        with self._written_cond:
            return self._written_cond.wait_for(lambda: request_id not in self._unwritten, timeout)

    def submit(self, record: dict[str, Any]) -> None:
        """Queue a record without awaiting (for cleanup code that may run while cancelled).

        When the queue is full the record waits in a task instead: still never dropped.
        """
        self._track(record)
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            task = asyncio.get_running_loop().create_task(self._queue.put(record))
            self._pending_puts.add(task)
            task.add_done_callback(self._pending_puts.discard)

    async def close(self) -> None:
        """Write everything queued, then stop."""
        if self._pending_puts:
            await asyncio.gather(*self._pending_puts)
        await self._queue.join()
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _next_batch(self) -> list[dict[str, Any]]:
        # Wait for a first record, then let the batch fill for up to max_delay with one sleep
        # (not one wait_for, i.e. one task and one timer, per record), then take what is there.
        batch = [await self._queue.get()]
        if self._queue.qsize() < self._batch_size - 1:
            await asyncio.sleep(self._max_delay)
        while len(batch) < self._batch_size:
            try:
                batch.append(self._queue.get_nowait())
            except asyncio.QueueEmpty:
                break
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._next_batch()
            backoff = 0.1
            while True:
                try:
                    await asyncio.to_thread(self._write_batch, batch)
                    self.written += len(batch)
                    break
                except Exception as exc:
                    self.failures += 1
                    log.warning(
                        "writing %d log records failed (%s); retrying in %.1fs",
                        len(batch),
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                        backoff,
                    )
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self._max_backoff)
            with self._written_cond:
                for record in batch:
                    self._unwritten.discard(str(record.get("request_id")))
                self._written_cond.notify_all()
            for _ in batch:
                self._queue.task_done()
