"""The router's log sink in a process of its own.

The log writer's batches (validation, the pseudonyms, the rows' JSON, psycopg) are Python:
run in a thread of the router, each batch held the router's GIL for 0.4-0.8 ms, and a call that
arrived meanwhile waited for it (BENCHMARKS.md, "Router against LiteLLM (issue 26)"). Here the
writer thread only pickles the batch onto a pipe and waits for the answer, which it does without
the GIL; a child process (`python -m app.gateway.logprocess`) runs `LogSink` on it.

The log writer's guarantees hold: the child answers a batch only after its COMMIT, so a record
counts as written only once it is in the database. A child that dies, or does not answer within
`reply_timeout`, is killed and the batch fails as a transient error: the writer retries it with
backoff, the next batch starts a new child, and the writes are idempotent by request_id, so a
batch the old child had committed is not written twice. An error the child reports is raised
here as `PermanentLogError` (one of `PERMANENT_LOG_ERRORS` there: the writer drops that record
alone) or `RemoteLogError` (anything else: retried).

Small batches (at most `inline_max` records) are written by the caller's own `LogSink`
instead: at low rates every call is a batch of one, a batch holds the GIL too briefly and too
rarely to delay a call, and two processes waking per call cost more CPU than the batch itself
(a batch of one at 10 calls/s: ~440 µs in the caller plus ~600 µs in the child, against ~630 µs
in the caller alone, BENCHMARKS.md "The log writer in a process of its own"). From 500 calls/s
on, batches hold ~25 records and all go to the child.

The child starts in a session of its own and ignores SIGINT and SIGTERM (a terminal's Ctrl-C,
or a stop signal sent to the whole process group or cgroup, reaches the router, which then
flushes through the child); it exits when the router closes the pipe or dies (EOF).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from app.core.config import Settings
from app.core.metrics import ROUTER_LOG_PROCESS_RESTARTS
from app.gateway.logsink import PERMANENT_LOG_ERRORS, LogSink

log = logging.getLogger("cft.gateway.logs")

# The directory that holds the `app` package: the child imports it from there whatever its cwd.
_SOURCE_ROOT = str(Path(__file__).resolve().parents[2])


class RemoteLogError(Exception):
    """A batch the log process could not write (retried)."""

    def __init__(self, kind: str, message: str, reason: str | None = None) -> None:
        super().__init__(f"{kind}: {message}")
        self.reason = reason or kind


class PermanentLogError(RemoteLogError):
    """A batch the log process can never write (one of PERMANENT_LOG_ERRORS there)."""


class LogProcessError(RemoteLogError):
    """The log process died or did not answer; it is restarted for the next batch."""


# What the log writer drops rather than retries, whichever sink it writes through.
WRITER_PERMANENT_ERRORS: tuple[type[Exception], ...] = (*PERMANENT_LOG_ERRORS, PermanentLogError)


# Batches of at most this many records are written in the caller's process (see above).
INLINE_MAX = 4


class ProcessSink:
    """A LogWriter sink that hands each batch of more than inline_max records to a child
    process running `LogSink`, and writes smaller ones itself."""

    def __init__(
        self,
        url: str,
        settings: Settings,
        *,
        reply_timeout: float = 120.0,
        inline_max: int = INLINE_MAX,
    ) -> None:
        self.url = url
        self.settings = settings
        self.reply_timeout = reply_timeout
        self.inline_max = inline_max
        self.inline = LogSink(url, settings)
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._tx: Connection | None = None
        self._rx: Connection | None = None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        """The child's process id (None before the first start)."""
        return self._proc.pid if self._proc is not None else None

    def _ensure_child(self) -> tuple[Connection, Connection]:
        if self._proc is not None and self._proc.poll() is None:
            assert self._tx is not None and self._rx is not None
            return self._tx, self._rx
        if self._proc is not None:
            self.restarts += 1
            ROUTER_LOG_PROCESS_RESTARTS.inc()
            log.warning("the log process exited (%s); starting another", self._proc.returncode)
            self._drop_child()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_SOURCE_ROOT, env.get("PYTHONPATH")]))
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.gateway.logprocess"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        # The pipes as framed connections of our own; Popen keeps no handle on them.
        self._tx = Connection(os.dup(proc.stdin.fileno()), readable=False)
        self._rx = Connection(os.dup(proc.stdout.fileno()), writable=False)
        proc.stdin.close()
        proc.stdout.close()
        proc.stdin = proc.stdout = None
        self._proc = proc
        self._tx.send((self.url, self.settings))
        return self._tx, self._rx

    def __call__(self, batch: list[dict[str, Any]]) -> None:
        if len(batch) <= self.inline_max:
            self.inline(batch)
            return
        with self._lock:
            tx, rx = self._ensure_child()
            try:
                tx.send(batch)
                if not rx.poll(self.reply_timeout):
                    raise TimeoutError(f"no answer in {self.reply_timeout:g} s")
                reply = rx.recv()
            except (OSError, EOFError, TimeoutError) as exc:
                self._kill()
                raise LogProcessError(type(exc).__name__, f"the log process failed: {exc}") from exc
        if reply is None:
            return
        permanent, kind, message, reason = reply
        raise (PermanentLogError if permanent else RemoteLogError)(kind, message, reason)

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def _drop_child(self) -> None:
        for conn in (self._tx, self._rx):
            if conn is not None:
                conn.close()
        self._tx = self._rx = None
        self._proc = None

    def close(self, timeout: float = 10.0) -> None:
        """Close the inline connection; ask the child to close its own and exit (killed after
        timeout seconds)."""
        self.inline.close()
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            try:
                if proc.poll() is None and self._tx is not None:
                    self._tx.send(None)
                proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                self._kill()
            finally:
                self._drop_child()


def _reply(exc: Exception) -> tuple[bool, str, str, str | None]:
    permanent = isinstance(exc, PERMANENT_LOG_ERRORS)
    return permanent, type(exc).__name__, str(exc), getattr(exc, "reason", None)


def main() -> None:
    """The child: (url, settings), then batches until None or EOF; one answer per batch."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    rx = Connection(os.dup(0), writable=False)
    tx = Connection(os.dup(1), readable=False)
    # The replies own the pipe: a stray print must not land in it.
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    try:
        url, settings = rx.recv()
    except EOFError:
        return
    sink = LogSink(url, settings)
    try:
        while True:
            try:
                batch = rx.recv()
            except EOFError:
                break
            if batch is None:
                break
            try:
                sink(batch)
                tx.send(None)
            except Exception as exc:
                tx.send(_reply(exc))
    finally:
        sink.close()


if __name__ == "__main__":
    main()
