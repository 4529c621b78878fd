"""The cft client: log records and feedback, batched and sent by one background thread.

`log()` and `feedback()` only put an item on a bounded queue (memory stays bounded by
`max_queue` items); the sender thread turns log items into batches for `POST /v1/logs` and
sends feedback in order after the logs before it, so feedback never overtakes its log.

When the queue is full, `log()` waits up to `enqueue_timeout` seconds (default 0.05) for room,
then drops the record and counts it in `stats.dropped` (it never raises, so logging cannot
break the caller's request). Transient failures (connection errors, timeouts, 429, 5xx) are
retried with exponential backoff and jitter, for as long as the client is open: records
wait in the queue while the server is down and land once it is back. Other 4xx answers are not
retried: a refused batch is split in halves until the records the server refuses are isolated,
those are dropped (`stats.rejected`, with the server's message in the log) and the rest land.
Retrying is safe because `POST /v1/logs` is idempotent by request_id (the server reports a
record it already has as "existing"), and `log()` stamps request_id and created_at once, on the
caller's side, so a re-sent batch is the same batch.

`close()` (also run at interpreter exit) sends what is queued, retrying until its timeout;
records still unsent then are counted in `stats.lost` and logged as an error.
"""

from __future__ import annotations

import atexit

# httpx encodes every host name with the "idna" codec, which Python imports on first use. In a
# forked child (gunicorn, multiprocessing) that first import, made by the new sender thread, can
# fail with "LookupError: unknown encoding: idna" (seen in 1 of 3 runs of test_sdk's fork test:
# the child's 50 records were lost); imported here, before any fork or thread, it is never late.
import encodings.idna  # noqa: F401
import functools
import json
import logging
import os
import queue
import random
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from cft_sdk.ids import new_request_id

log = logging.getLogger("cft_sdk")

USER_AGENT = "cft-sdk/0.1"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass
class Stats:
    """What the client did so far (read `client.stats`)."""

    sent: int = 0  # records the server acknowledged (inserted or existing)
    inserted: int = 0
    existing: int = 0  # already logged: a retried batch, or a duplicate request_id
    dropped: int = 0  # the queue was full
    rejected: int = 0  # the server refused the record (4xx): see the log for why
    lost: int = 0  # still unsent when close() timed out
    retries: int = 0
    feedback_sent: int = 0
    feedback_failed: int = 0


@dataclass
class _Log:
    json: str  # the record, serialised by log() so that a bad value fails there, not later


@dataclass
class _Feedback:
    request_id: str
    body: dict[str, Any]


@dataclass
class _Flush:
    done: threading.Event = field(default_factory=threading.Event)


_STOP = object()


class Client:
    """Send inference logs and feedback to a cft API server in the background.

    base_url: the cft API, e.g. "http://cft.internal:8000"; api_key: a key with role ingest
    (or client). route: the default route of records that name none.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        route: str | None = None,
        batch_size: int = 200,
        max_batch_bytes: int = 1_000_000,
        flush_interval: float = 0.5,
        max_queue: int = 10_000,
        enqueue_timeout: float = 0.05,
        request_timeout: float = 10.0,
        backoff_initial: float = 0.2,
        backoff_max: float = 10.0,
        feedback_attempts: int = 8,
        close_timeout: float = 10.0,
        flush_at_exit: bool = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not api_key:
            raise ValueError("api_key is required (create one with `cft key create`)")
        self.route = route
        self.batch_size = batch_size
        self.max_batch_bytes = max_batch_bytes
        self.flush_interval = flush_interval
        self.enqueue_timeout = enqueue_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.feedback_attempts = feedback_attempts
        self.close_timeout = close_timeout
        self.stats = Stats()
        self._stats_lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        self._closed = False
        self._wake = threading.Event()
        self._request_timeout = request_timeout
        self._give_up_at: float | None = None  # set by close(): stop retrying after it
        self._http_options: dict[str, Any] = {
            "base_url": base_url.rstrip("/"),
            "headers": {"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT},
            "timeout": request_timeout,
            "transport": transport,
        }
        self._start()
        os.register_at_fork(after_in_child=functools.partial(_restart_in_child, weakref.ref(self)))
        if flush_at_exit:
            atexit.register(_close_at_exit, weakref.ref(self))

    def _start(self) -> None:
        self._http = httpx.Client(**self._http_options)
        self._thread = threading.Thread(target=self._run, name="cft-sdk-sender", daemon=True)
        self._thread.start()

    def _after_fork(self) -> None:
        # A forked worker (gunicorn --preload, multiprocessing) has the queue but no sender
        # thread: it starts its own, and drops the parent's items, which the parent sends.
        self._queue = queue.Queue(maxsize=self._queue.maxsize)
        self._stats_lock = threading.Lock()
        self._wake = threading.Event()
        self.stats = Stats()
        self._start()

    # The caller's side: enqueue only. ------------------------------------------------------

    def log(
        self,
        *,
        messages: Sequence[Mapping[str, Any]],
        completion: str | None = None,
        route: str | None = None,
        request_id: str | None = None,
        adapter_id: str | None = None,
        model: str | None = None,
        experiment: str | None = None,
        variant: str | None = None,
        ttft_ms: int | None = None,
        tokens_in: int | None = None,
        tokens_out: int | None = None,
        user: str | None = None,
        parent_request_id: str | None = None,
        status: str | None = None,
        created_at: datetime | str | None = None,
        embedding: Sequence[float] | None = None,
    ) -> str:
        """Queue one inference record for POST /v1/logs; return its request_id at once.

        The fields are those of POST /v1/logs (docs/sdk.md). request_id defaults to a new
        UUID and created_at to now, both fixed here so that a retried send is idempotent.
        """
        route = route or self.route
        if not route:
            raise ValueError("route is required: pass route= here or to Client(route=...)")
        rid = request_id or new_request_id()
        stamp = created_at or datetime.now(UTC)
        record: dict[str, Any] = {
            "request_id": rid,
            "route": route,
            "messages": [dict(m) for m in messages],
            "created_at": stamp.isoformat() if isinstance(stamp, datetime) else stamp,
        }
        optional = {
            "completion": completion,
            "adapter_id": adapter_id,
            "model": model,
            "experiment": experiment,
            "variant": variant,
            "ttft_ms": ttft_ms,
            "tokens_in": tokens_in,
            "tokens_out": tokens_out,
            "user": user,
            "parent_request_id": parent_request_id,
            "status": status,
            "embedding": list(embedding) if embedding is not None else None,
        }
        record.update({k: v for k, v in optional.items() if v is not None})
        self._put(_Log(json.dumps(record, ensure_ascii=False)))
        return rid

    def feedback(
        self,
        request_id: str,
        *,
        thumbs: int | bool | None = None,
        regenerate: bool | str | None = None,
        edited: str | None = None,
    ) -> None:
        """Queue feedback on a logged request (sent after the logs queued before it).

        thumbs: 1 good, 0 neutral, -1 bad (True/False mean 1/-1). regenerate: True when the
        user asked for another answer, or the request_id of that new answer. edited: the
        completion as the user corrected it.
        """
        body: dict[str, Any] = {}
        if thumbs is not None:
            value = (1 if thumbs else -1) if isinstance(thumbs, bool) else thumbs
            if value not in (-1, 0, 1):
                raise ValueError(f"thumbs must be -1, 0 or 1, got {thumbs!r}")
            body["thumbs"] = value
        if isinstance(regenerate, str):
            body["regenerated"] = True
            body["regenerated_by"] = regenerate
        elif regenerate is not None:
            body["regenerated"] = regenerate
        if edited is not None:
            body["edited_completion"] = edited
        if not body:
            raise ValueError("give at least one of thumbs, regenerate or edited")
        self._put(_Feedback(str(request_id), body))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued before this call is sent; False on timeout."""
        if self._closed or not self._thread.is_alive():
            return self._queue.empty()
        marker = _Flush()
        try:
            self._queue.put(marker, timeout=timeout)
        except queue.Full:
            return False
        return marker.done.wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Send what is queued (retrying until timeout, default close_timeout), then stop."""
        if self._closed:
            return
        self._closed = True
        wait = self.close_timeout if timeout is None else timeout
        self._give_up_at = time.monotonic() + wait
        self._wake.set()  # cut a backoff sleep short: the deadline now decides
        # The sender drains the queue before it reaches the stop marker; past the deadline it
        # no longer tries to send, so a full queue frees up fast.
        end = self._give_up_at + self._request_timeout
        while True:
            try:
                self._queue.put(_STOP, timeout=0.1)
                break
            except queue.Full:
                if time.monotonic() > end:
                    break
        self._thread.join(max(0.0, end - time.monotonic()))
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _put(self, item: _Log | _Feedback) -> None:
        if self._closed:
            self._count(dropped=1)
            log.warning("cft client is closed: a record or feedback was dropped")
            return
        try:
            if self.enqueue_timeout > 0:
                self._queue.put(item, timeout=self.enqueue_timeout)
            else:
                self._queue.put_nowait(item)
        except queue.Full:
            with self._stats_lock:
                self.stats.dropped += 1
                dropped = self.stats.dropped
            if dropped == 1 or dropped % 1000 == 0:
                log.warning(
                    "cft queue full (%d items): %d records dropped so far",
                    self._queue.maxsize,
                    dropped,
                )

    # The sender thread. ----------------------------------------------------------------------

    def _run(self) -> None:
        batch: list[str] = []
        size = 0
        due = 0.0
        while True:
            timeout = max(0.0, due - time.monotonic()) if batch else None
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                item = None
            if isinstance(item, _Log):
                if not batch:
                    due = time.monotonic() + self.flush_interval
                batch.append(item.json)
                size += len(item.json)
                if len(batch) < self.batch_size and size < self.max_batch_bytes:
                    continue
            try:
                if batch:  # full, due, or a feedback/flush/stop that must follow these logs
                    self._send_logs(batch)
                    batch, size = [], 0
                if isinstance(item, _Feedback):
                    self._send_feedback(item)
            except Exception:  # never let the sender die: later records must still go
                log.exception("cft sender: unexpected error (%d records dropped)", len(batch))
                self._count(lost=len(batch))
                batch, size = [], 0
            if isinstance(item, _Flush):
                item.done.set()
            elif item is _STOP:
                self._drain_after_stop()
                return

    def _drain_after_stop(self) -> None:
        # A log() that raced close() may have queued behind the stop marker: count it.
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Log | _Feedback):
                self._count(lost=1)
            elif isinstance(item, _Flush):
                item.done.set()

    def _send_logs(self, records: list[str]) -> None:
        body = ('{"records":[' + ",".join(records) + "]}").encode()
        response = self._post("/v1/logs", body, what=f"{len(records)} records")
        if response is None:
            self._count(lost=len(records))
            log.error("cft: %d records were not sent before close() timed out", len(records))
            return
        if response.status_code == 200:
            body = response.json()
            self._count(sent=len(records), inserted=body["inserted"], existing=body["existing"])
            return
        if len(records) > 1 and response.status_code in (400, 413, 422):
            half = len(records) // 2
            self._send_logs(records[:half])
            self._send_logs(records[half:])
            return
        self._count(rejected=len(records))
        log.error(
            "cft refused %d record(s) with HTTP %d: %s",
            len(records),
            response.status_code,
            _message(response),
        )

    def _send_feedback(self, item: _Feedback) -> None:
        path = f"/v1/logs/{item.request_id}/feedback"
        for attempt in range(self.feedback_attempts):
            body = json.dumps(item.body, ensure_ascii=False).encode()
            response = self._post(path, body, what=f"feedback on {item.request_id}")
            if response is None:
                break
            if response.status_code == 200:
                self._count(feedback_sent=1)
                return
            # 404: the log may still be on its way (e.g. through a router's writer).
            if response.status_code != 404 or attempt == self.feedback_attempts - 1:
                log.error(
                    "cft refused feedback on %s with HTTP %d: %s",
                    item.request_id,
                    response.status_code,
                    _message(response),
                )
                break
            self._sleep(self._backoff(attempt))
        self._count(feedback_failed=1)

    def _post(self, path: str, content: bytes, *, what: str) -> httpx.Response | None:
        """POST until an answer that is not transient; None if close() gave up first."""
        headers = {"Content-Type": "application/json"}
        attempt = 0
        while True:
            if self._give_up_at is not None and time.monotonic() >= self._give_up_at:
                return None
            try:
                response = self._http.post(path, content=content, headers=headers)
                if response.status_code not in RETRY_STATUSES:
                    return response
                reason = f"HTTP {response.status_code}"
                delay = _retry_after(response) or self._backoff(attempt)
            except httpx.TransportError as exc:  # connect/read errors and timeouts
                reason = f"{type(exc).__name__}: {exc}"
                delay = self._backoff(attempt)
            attempt += 1
            self._count(retries=1)
            if attempt == 1 or attempt % 10 == 0:
                log.warning(
                    "cft: sending %s failed (%s); retry %d in %.2fs", what, reason, attempt, delay
                )
            self._sleep(delay)

    def _backoff(self, attempt: int) -> float:
        cap = min(self.backoff_max, self.backoff_initial * 2**attempt)
        return random.uniform(cap / 2, cap)  # jitter: retries of many clients spread out

    def _sleep(self, delay: float) -> None:
        if self._give_up_at is not None:  # closing: the last try falls on the deadline
            delay = min(delay, max(0.0, self._give_up_at - time.monotonic()))
        self._wake.wait(delay)
        self._wake.clear()

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return min(60.0, float(value)) if value else None
    except ValueError:
        return None


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:500]


def _restart_in_child(ref: weakref.ref[Client]) -> None:
    client = ref()
    if client is not None and not client._closed:
        client._after_fork()


def _close_at_exit(ref: weakref.ref[Client]) -> None:
    client = ref()
    if client is not None:
        client.close()
