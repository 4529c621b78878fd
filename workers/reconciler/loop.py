"""The reconciler's loop: a pass now, then on NOTIFY cft_adapter, on kick(), and every interval;
between passes, what the router asks for (a load now) without a whole pass.

Between passes the thread blocks in select() on its one kept connection (which both LISTENs
and runs the passes) and a wake-up socket for kick() and stop(): idle, it costs nothing (a 0.1
s poll and a connection per pass cost the API process 10-14 ms of CPU per second;
BENCHMARKS.md, "Router against LiteLLM").
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time

import psycopg
from psycopg.rows import dict_row

from app.core.db import Connection
from app.core.metrics import RECONCILER_ERRORS

log = logging.getLogger("cft.reconciler")

# serve.adapter's change trigger (sql/serve/adapter_audit.sql) notifies here on every change of
# an adapter; the router's route cache has a channel of its own (app/gateway/table.py).
CHANNEL = "cft_adapter"
# A reconciler that does not lead passes what its router asks for to the leader here (the
# payload: an adapter id to load now, or WIDEN_PREFIX and an adapter id to widen).
WANT_CHANNEL = "cft_adapter_want"
WIDEN_PREFIX = "+"


class PassLoop:
    """Runs run_once() in a thread of its own until stop(), over one kept connection."""

    def __init__(self, db_url: str, *, interval: float):
        self.db_url = db_url
        self.interval = interval
        self._kick = threading.Event()
        self._stop = threading.Event()
        # kick() and stop() send a byte here to wake the loop out of select(). Socket objects,
        # not raw pipe fds: a kick after close() raises instead of writing to a reused fd.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        # The one kept connection: LISTENs between passes and runs them (None when lost).
        self._conn: Connection | None = None
        self._thread: threading.Thread | None = None
        # Set by a NOTIFY (and a new connection): serve.adapter changed since the last read.
        self._dirty = True

    def run_once(self) -> object:
        """One pass (the subclass's)."""
        raise NotImplementedError

    def next_wait(self) -> float:
        """Seconds until the next pass when nothing asks for one sooner."""
        return self.interval

    def opened(self) -> None:
        """A new kept connection: whatever the last one held (a lock) is gone."""

    def asked(self, adapter_id: str) -> None:
        """Another reconciler's router asked for this adapter (NOTIFY cft_adapter_want)."""

    def between_passes(self, conn: Connection) -> None:
        """Work that does not need a pass (what the router asked for), before waiting."""

    def work_in(self) -> float | None:
        """Seconds until between_passes() has work of its own (None: none)."""
        return None

    def kick(self) -> None:
        """Ask for a pass now."""
        self._kick.set()
        self._wake()

    def _connection(self) -> Connection:
        """The kept connection, opened (and LISTENing) when there is none."""
        conn = self._conn
        if conn is None or conn.closed:
            conn = psycopg.connect(self.db_url, autocommit=True, row_factory=dict_row)
            try:
                conn.execute(f"LISTEN {CHANNEL}")
                conn.execute(f"LISTEN {WANT_CHANNEL}")
            except BaseException:
                conn.close()
                raise
            self._conn = conn
            self._dirty = True  # not listening meanwhile: anything may have changed
            self.opened()
        return conn

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.debug("closing the reconciler's connection failed", exc_info=True)

    def _wake(self) -> None:
        # OSError: full (a wake-up is pending anyway) or closed (stopped).
        with contextlib.suppress(OSError):
            self._wake_w.send(b"k")

    def _notified(self, conn: Connection) -> None:
        own = conn.info.backend_pid
        for note in conn.notifies(timeout=0):
            if note.channel == WANT_CHANNEL:
                if note.pid != own:  # what this one passed on comes back to it too
                    self.asked(note.payload)
            else:
                self._dirty = True
                self._kick.set()

    def pending(self) -> bool:
        """Whether there is work for between_passes() (do not wait)."""
        return False

    def _wait(self, conn: Connection, timeout: float) -> None:
        """Block until a NOTIFY on conn, a kick()/stop()/wake, or timeout seconds; a NOTIFY on
        cft_adapter sets the kick. Raises psycopg.Error when the connection is lost."""
        # A NOTIFY that came in while a pass used the connection waits in psycopg's backlog,
        # not on the socket: take it first (timeout=0 also reads what the socket holds).
        self._notified(conn)
        if self._kick.is_set() or self._stop.is_set() or self.pending():
            return
        fd, wake = conn.fileno(), self._wake_r.fileno()
        ready, _, _ = select.select([fd, wake], [], [], max(0.0, timeout))
        if wake in ready:
            with contextlib.suppress(OSError):
                self._wake_r.recv(4096)
        if fd in ready:
            self._notified(conn)

    def start(self) -> None:
        """Run passes in a background thread until stop()."""
        self._thread = threading.Thread(target=self.run_forever, name="cft-reconciler", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Make run_forever return after the current pass."""
        self._stop.set()
        self._wake()

    def stop(self) -> None:
        """Stop the loop, then close what it holds."""
        self.request_stop()
        if self._thread:
            self._thread.join(timeout=10)
        self.close()

    def close(self) -> None:
        """Close the kept connection and the wake-up sockets (after the loop has stopped)."""
        self._close_connection()
        self._wake_r.close()
        self._wake_w.close()

    def run_forever(self) -> None:
        """Pass now, then on NOTIFY cft_adapter, on kick(), and every next_wait() seconds."""
        backoff = 0.5
        due = 0.0
        while not self._stop.is_set():
            try:
                conn = self._connection()
                backoff = 0.5
                if self._kick.is_set() or time.monotonic() >= due:
                    self._kick.clear()
                    self.run_once()
                    due = time.monotonic() + self.next_wait()
                    continue
                self.between_passes(conn)
                wait, soon = due - time.monotonic(), self.work_in()
                self._wait(conn, wait if soon is None else min(wait, soon))
            except psycopg.Error as exc:
                self._close_connection()
                RECONCILER_ERRORS.labels("db").inc()
                log.warning("reconciler lost its database connection (%s); retrying", exc)
                # Not listening meanwhile: anything may have changed, pass once back.
                due = 0.0
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
