"""Asynchronous, batched, lossless writer of the router's inference logs.

The router answers the client first and hands the log record to this writer. Records wait in a
bounded queue; one thread of its own writes them in batches (up to `batch_size` records or
`max_delay` seconds). Nothing is dropped:
- if PostgreSQL is down, the batch is retried with exponential backoff (capped) until it lands;
  writes are idempotent by (tenant, request_id), so a retry after an ambiguous failure does
  not duplicate rows;
- while it is down the queue fills; when full, records wait in an overflow list that one task
  moves into the queue as room appears (memory grows instead of records being lost);
- `close()` flushes everything still queued before the process exits.
The one exception is a record the sink can never write (a `permanent` error such as an invalid
record: the call was already served, a retry cannot help): the batch is split until that record
is alone, every other record is written, and that one is handed to `on_drop` (a log line and a
metric), instead of blocking every later record behind it forever.

A thread rather than a task that hands each batch to an executor: at low rates every call is a
batch of its own, and the task's timer, executor future and wake-up of the event loop per batch
cost the loop more CPU than the call's own routing (BENCHMARKS.md, "Router against LiteLLM
(issue 26)"). The event loop's whole share is now one queue put per record.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("cft.gateway.logs")

WriteBatch = Callable[[list[dict[str, Any]]], None]
OnDrop = Callable[[dict[str, Any], Exception], None]


class LogWriter:
    """Bounded queue + one writer thread; see the module docstring for the guarantees."""

    def __init__(
        self,
        write_batch: WriteBatch,
        *,
        maxsize: int = 10_000,
        batch_size: int = 500,
        max_delay: float = 0.05,
        max_backoff: float = 5.0,
        permanent: tuple[type[Exception], ...] = (),
        on_drop: OnDrop | None = None,
    ):
        self._write_batch = write_batch
        self._permanent = permanent
        self._on_drop = on_drop
        # None is the stop sentinel (put by close(), after every record).
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=maxsize)
        self._batch_size = batch_size
        self._max_delay = max_delay
        self._max_backoff = max_backoff
        self._thread: threading.Thread | None = None
        # Records that found the queue full, in order, and the task that moves them in.
        self._overflow: collections.deque[dict[str, Any]] = collections.deque()
        self._mover: asyncio.Task[None] | None = None
        self.written = 0
        self.failures = 0
        self.dropped = 0
        # request_ids queued and not yet written (feedback may arrive before the row). A set
        # and one condition, not an Event per record: an Event costs ~15 µs on the hot path.
        self._unwritten: set[str] = set()
        self._written_cond = threading.Condition()

    def start(self) -> None:
        """Start the writer thread."""
        self._thread = threading.Thread(target=self._run, name="cft-log-writer", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Records queued and not yet written."""
        return self._queue.qsize() + len(self._overflow)

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
        """Queue a record without awaiting (also from cleanup code that runs while cancelled).

        When the queue is full the record waits in the overflow list instead: still never
        dropped. Call it on the event loop.
        """
        self._track(record)
        if not self._overflow:
            try:
                self._queue.put_nowait(record)
                return
            except queue.Full:
                pass
        self._overflow.append(record)
        if self._mover is None or self._mover.done():
            self._mover = asyncio.get_running_loop().create_task(self._move_overflow())

    async def _move_overflow(self) -> None:
        while self._overflow:
            try:
                self._queue.put_nowait(self._overflow[0])
            except queue.Full:
                await asyncio.sleep(0.01)  # only while PostgreSQL is down and the queue full
                continue
            self._overflow.popleft()

    async def close(self) -> None:
        """Write everything queued, then stop the thread."""
        if self._mover is not None:
            await self._mover
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        await asyncio.to_thread(self._queue.put, None)
        await asyncio.to_thread(thread.join)

    def _next_batch(self) -> tuple[list[dict[str, Any]], bool]:
        """(records, stop): waits for a first record, then lets the batch fill for up to
        max_delay with one sleep, then takes what is there."""
        first = self._queue.get()
        if first is None:
            return [], True
        batch = [first]
        if self._queue.qsize() < self._batch_size - 1:
            time.sleep(self._max_delay)
        while len(batch) < self._batch_size:
            try:
                record = self._queue.get_nowait()
            except queue.Empty:
                break
            if record is None:
                return batch, True
            batch.append(record)
        return batch, False

    def _write(self, batch: list[dict[str, Any]]) -> None:
        self._write_until_done(batch)
        with self._written_cond:
            for record in batch:
                self._unwritten.discard(str(record.get("request_id")))
            self._written_cond.notify_all()

    def _write_until_done(self, batch: list[dict[str, Any]]) -> None:
        """Write the batch, retrying transient failures; a permanent one splits it (see above)."""
        backoff = 0.1
        while True:
            try:
                self._write_batch(batch)
                self.written += len(batch)
                return
            except self._permanent as exc:
                if len(batch) > 1:
                    half = len(batch) // 2
                    self._write_until_done(batch[:half])
                    self._write_until_done(batch[half:])
                    return
                self.dropped += 1
                log.error(
                    "dropping the log record of request %s: %s (it can never be stored)",
                    batch[0].get("request_id"),
                    exc,
                )
                if self._on_drop is not None:
                    self._on_drop(batch[0], exc)
                return
            except Exception as exc:
                self.failures += 1
                log.warning(
                    "writing %d log records failed (%s); retrying in %.1fs",
                    len(batch),
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                    backoff,
                )
                time.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)

    def _run(self) -> None:
        stop = False
        while not stop:
            batch, stop = self._next_batch()
            if batch:
                self._write(batch)
