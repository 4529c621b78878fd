"""The router's view of routes: a cache kept current by NOTIFY cft_route.

Each commit that changes a route's serving state notifies cft_route with that state
(sql/serve/route_state.sql). The listener (two LISTEN connections, the first copy wins)
caches it as it arrives, without a query, when the payload's snapshot sees the route's
previous change (then nothing committed before it can be missing); otherwise it drops the
route and the reader thread reads it, with every other route dropped meanwhile, in one query
over one kept connection (a call that misses reads its route itself). Every lookup first takes
in what is already on the listener's sockets, so once a NOTIFY has reached the router no new
call gets the state before it. Where the milliseconds went: BENCHMARKS.md, "Promotion COMMIT →
routed (item 5b)".

While the listener is connected, a cached route is current: PostgreSQL delivers every
notification to a connected listener, so nothing is re-read on a timer, however many routes
are cached. A NOTIFY is lost only with the connection: while it is down, a route cached
longer than the TTL is served once more and re-read behind (all such routes in one query);
once it is back, every cached route is re-read in one query before the cache is trusted
again. At 10,000 routes that is a handful of queries per reconnect, not a read per route per
TTL (BENCHMARKS.md, "The fleet at 10,000 routes").

Routes are cached by (tenant id, name): a route's name is unique within its tenant only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row

from app.core.db import Connection
from app.core.errors import DB_UNAVAILABLE
from app.core.metrics import ROUTE_CACHE, ROUTE_READS
from app.gateway.assign import Canary, RouteState

log = logging.getLogger("cft.gateway")

CHANNEL = "cft_route"
# LISTEN on two connections: each NOTIFY is sent by each listener's own backend, and on a busy
# machine one backend can wait 10-20 ms for a CPU after the COMMIT while the other does not.
# The first copy is applied; the other is dropped (BENCHMARKS.md, "Promotion COMMIT → routed
# (item 5b)").
LISTENERS = 2
# The application_name of the table's connections, as pg_stat_activity shows them: the kept
# connection that reads routes, and the LISTEN ones.
READER_NAME = "cft-router-routes"
LISTENER_NAME = "cft-router-listen"
# How many recent notifications are remembered to drop their second copy.
_SEEN = 1024
# Routes read in one query at most.
_BATCH = 5000
# Many routes' states in one statement (NULL for a route that is gone).
_READ_MANY = (
    "SELECT k.tenant_id, k.name, serve.route_state(k.tenant_id, k.name)"
    " FROM unnest(%s::int[], %s::text[]) AS k(tenant_id, name)"
)
_HITS = ROUTE_CACHE.labels("hit")

# A route's key: its tenant's id and its name.
RouteKey = tuple[int, str]


def state_from_json(doc: dict[str, Any]) -> RouteState:
    """A RouteState from serve.route_state's JSON."""
    return RouteState(
        name=doc["name"],
        tenant_id=int(doc["tenant_id"]),
        base_model=doc["base_model"],
        experiment=doc["experiment"],
        prod=doc["prod"],
        canaries=[
            Canary(c["id"], Decimal(c["traffic_pct"]), datetime.fromisoformat(c["created_at"]))
            for c in doc["canaries"]
        ],
        fallback=doc.get("fallback") or "none",
    )


def load_route(conn: Connection, tenant_id: int, name: str) -> RouteState | None:
    """Read one route of a tenant's serving state (as the owner: routing spans tenants)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute("SELECT serve.route_state(%s, %s)", (tenant_id, name)).fetchone()
    return None if row is None or row[0] is None else state_from_json(row[0])


@dataclass(frozen=True)
class Change:
    """One NOTIFY cft_route: the route (None: unknown), and (when complete) its state as of
    snapshot."""

    route: RouteKey | None
    xid: int | None = None
    snapshot: str | None = None
    state: RouteState | None = None
    complete: bool = False

    @classmethod
    def parse(cls, payload: str) -> Change:
        """The payload of serve.notify_route_state; one that names no tenant and route says
        only that some route changed."""
        try:
            doc = json.loads(payload)
            route = (int(doc["tenant_id"]), str(doc["route"]))
        except (ValueError, TypeError, KeyError):
            return cls(None)
        if "state" not in doc:
            return cls(route)  # too large for a NOTIFY: read it
        state = None if doc["state"] is None else state_from_json(doc["state"])
        return cls(route, int(doc["xid"]), doc["snapshot"], state, complete=True)

    def sees(self, xid: int) -> bool:
        """Whether this state's snapshot sees transaction xid (known to have committed)."""
        if xid == self.xid:
            return True  # the same transaction: its later state includes its earlier ones
        if self.snapshot is None:
            return False
        xmin, xmax, running = self.snapshot.split(":")
        if xid < int(xmin):
            return True
        return xid < int(xmax) and str(xid) not in running.split(",")


class RouteTable:
    """Routes cached while the listener is connected (a NOTIFY on cft_route replaces or drops
    one at once), and for ttl seconds while it is not."""

    def __init__(self, url: str, *, ttl: float = 5.0):
        self.url = url
        self.ttl = ttl
        self._cache: dict[RouteKey, tuple[float, RouteState | None]] = {}
        self._lock = threading.Lock()
        # A read is cached only if its route did not change meanwhile: its version, and the
        # epoch of invalidate-all, are what they were when the read began.
        self._epoch = 0
        self._versions: dict[RouteKey, int] = {}
        self._stop = threading.Event()
        self._listener: threading.Thread | None = None
        # Set while the LISTEN connections are up and the cache was re-read after connecting.
        self.listening = threading.Event()
        # The LISTEN connections; their notifications are taken in under _notify_lock, by the
        # listener thread or by a lookup that finds them waiting (_catch_up).
        self._conns: list[Connection] = []
        self._fds: tuple[int, ...] = ()
        self._notify_lock = threading.Lock()
        # Per route, the transaction of its last NOTIFY (absent: unknown, read the route).
        self._last_xid: dict[RouteKey, int] = {}
        # The payloads with a state taken in lately, oldest first (to drop the second copy).
        self._seen: dict[str, None] = {}
        self._wake: tuple[int, int] | None = None  # a pipe that wakes the listener to stop
        # Routes to read again, by why (notify, stale), for the reader thread's next query.
        self._pending: dict[RouteKey, str] = {}
        self._pending_ready = threading.Condition(self._lock)
        self._retry_at = 0.0  # a failed stale re-read is tried again after this
        # The kept connection for route reads (not the LISTEN one), one read at a time.
        self._reader: Connection | None = None
        self._reader_lock = threading.Lock()
        self._reloader: threading.Thread | None = None

    def _fresh(self, hit: tuple[float, RouteState | None]) -> bool:
        return self.listening.is_set() or time.monotonic() - hit[0] < self.ttl

    def peek(self, tenant_id: int, name: str) -> tuple[bool, RouteState | None]:
        """(True, state) when the tenant's route is cached and current (the listener is
        connected, or it was read less than ttl ago); never touches the database."""
        self._catch_up()
        hit = self._cache.get((tenant_id, name))  # a dict read is atomic: no lock on the hot path
        if hit is not None and self._fresh(hit):
            _HITS.inc()
            return True, hit[1]
        return False, None

    def lookup(self, tenant_id: int, name: str) -> tuple[bool, RouteState | None]:
        """Like peek, but while the listener is down a route cached longer than ttl is still
        served while the reader thread re-reads it (stale-while-revalidate, every such route
        in one query); never touches the database.

        A NOTIFY replaces the route's state (or drops it, and the next call reads it), so a
        promotion, canary change or rollback still reaches the next call."""
        self._catch_up()
        key = (tenant_id, name)
        hit = self._cache.get(key)
        if hit is None:
            return False, None
        if not self._fresh(hit) and time.monotonic() >= self._retry_at:
            self._queue(key, "stale")
        _HITS.inc()
        return True, hit[1]

    def get(self, tenant_id: int, name: str) -> RouteState | None:
        """The tenant's route's state, from cache when current, else read now."""
        fresh, cached = self.peek(tenant_id, name)
        if fresh:
            return cached
        return self._load((tenant_id, name))

    def _load(self, key: RouteKey) -> RouteState | None:
        ROUTE_CACHE.labels("miss").inc()
        version = self._version(key)
        try:
            state = self._read_one(key)
        except DB_UNAVAILABLE:
            # PostgreSQL is down: keep serving what we knew (it cannot change meanwhile).
            stale = self._cache.get(key)
            if stale is None:
                raise
            log.warning("route %s: database unavailable, serving the cached state", key)
            return stale[1]
        self._store(key, version, state)
        return state

    def _read_one(self, key: RouteKey) -> RouteState | None:
        """Read one route a call missed; when the reader thread cached it while this waited
        for the connection, that state, without a second read."""
        with self._reader_lock:
            fresh, state = self.peek(*key)
            if fresh:
                return state
            return self._read([key], "miss")[key]

    def _read(self, keys: list[RouteKey], why: str) -> dict[RouteKey, RouteState | None]:
        """The routes' states in one query over the kept reader connection (hold
        _reader_lock); one new connection and one retry when the kept one is broken
        (PostgreSQL restarted, the backend was terminated)."""
        tenants = [k[0] for k in keys]
        names = [k[1] for k in keys]
        for attempt in (1, 2):
            kept = self._reader is not None
            if self._reader is None or self._reader.closed:
                self._reader = self._connection(READER_NAME)
            try:
                with self._reader.cursor(row_factory=tuple_row) as cur:
                    rows = cur.execute(_READ_MANY, (tenants, names)).fetchall()
            except psycopg.Error:
                self._close_reader()
                if attempt == 2 or not kept:
                    raise
                continue
            ROUTE_READS.labels(why).inc()
            return {
                (int(t), str(n)): None if doc is None else state_from_json(doc)
                for t, n, doc in rows
            }
        raise AssertionError("unreachable")

    def _read_batches(self, keys: list[RouteKey], why: str) -> None:
        """Read routes (by why: notify, stale, resync) in queries of up to _BATCH and cache
        each whose version did not change meanwhile."""
        for i in range(0, len(keys), _BATCH):
            chunk = keys[i : i + _BATCH]
            versions = [self._version(k) for k in chunk]
            with self._reader_lock:
                states = self._read(chunk, why)
            for key, version in zip(chunk, versions, strict=True):
                self._store(key, version, states.get(key))

    def _close_reader(self) -> None:
        conn, self._reader = self._reader, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.debug("closing the route reader connection failed", exc_info=True)

    def _queue(self, key: RouteKey, why: str) -> None:
        """Have the reader thread read this route with its next query."""
        with self._lock:
            if key not in self._pending or why == "notify":
                self._pending[key] = why
            self._pending_ready.notify()
            if self._reloader is None:
                self._start_reloader()

    def _start_reloader(self) -> None:
        """Start the reader thread (hold _lock)."""
        self._reloader = threading.Thread(
            target=self._reload_forever, name="cft-route-reload", daemon=True
        )
        self._reloader.start()

    def _reload_forever(self) -> None:
        """The reader thread: each round, every route queued since the last, in one query."""
        while not self._stop.is_set():
            with self._lock:
                while not self._pending and not self._stop.is_set():
                    self._pending_ready.wait()
                pending, self._pending = self._pending, {}
            if not pending:
                continue
            for why in ("notify", "stale"):
                keys = [k for k, w in pending.items() if w == why]
                if not keys:
                    continue
                try:
                    self._read_batches(keys, why)
                except psycopg.Error as exc:
                    # Dropped routes stay uncached (the next call reads its own); stale ones
                    # keep serving what was known, and are tried again in a second.
                    log.warning("re-reading %d routes (%s) failed: %s", len(keys), why, exc)
                    if why == "stale":
                        self._retry_at = time.monotonic() + 1.0

    def _catch_up(self) -> None:
        """Take in the notifications already on the listener's socket (or being taken in):
        the listener thread may not have run yet (the GIL, the scheduler), and a call must
        not be served the state that a NOTIFY in hand replaces. One poll(0) when none is."""
        fds = self._fds
        if not fds:
            return
        if not self._notify_lock.locked():
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            if not poller.poll(0):
                return
        # A lost connection: the listener thread sees it too, and reconnects.
        with self._notify_lock, contextlib.suppress(psycopg.Error):
            self._drain()

    def _drain(self) -> None:
        """Apply every notification received (hold _notify_lock)."""
        for conn in self._conns:
            pgconn = conn.pgconn
            pgconn.consume_input()
            while (note := pgconn.notifies()) is not None:
                self._on_notify(note.extra.decode("utf-8", "replace"))

    def _on_notify(self, payload: str) -> None:
        """Cache the state a NOTIFY carries, or drop the route and have it read."""
        if payload in self._seen:
            # The copy from the other connection. Each delivers in commit order, so taking
            # the first copy of each keeps that order.
            return
        change = Change.parse(payload)
        key = change.route
        if key is None:
            # Not a payload of serve.notify_route_state: which route changed is unknown.
            self.invalidate()
            return
        if change.complete:
            # Unique per transaction and snapshot (a bare route name is not: never dropped).
            self._seen[payload] = None
            if len(self._seen) > _SEEN:
                del self._seen[next(iter(self._seen))]
        previous = self._last_xid.pop(key, None)
        if change.xid is not None:
            self._last_xid[key] = change.xid
        if change.complete and previous is not None and change.sees(previous):
            with self._lock:
                self._versions[key] = self._versions.get(key, 0) + 1
                self._cache[key] = (time.monotonic(), change.state)
        else:
            # The first NOTIFY of this route since LISTEN (what came before is unknown), an
            # older snapshot than the previous change, or no state in it: read the route.
            self.invalidate(key)
            self._queue(key, "notify")

    def _version(self, key: RouteKey) -> tuple[int, int]:
        return self._epoch, self._versions.get(key, 0)

    def _store(self, key: RouteKey, version: tuple[int, int], state: RouteState | None) -> None:
        with self._lock:
            # A NOTIFY that arrived during the read may describe a newer state: don't cache.
            if self._version(key) == version:
                self._cache[key] = (time.monotonic(), state)

    def invalidate(self, key: RouteKey | None = None) -> None:
        """Forget one route, (tenant id, name), or all."""
        with self._lock:
            if key is None:
                self._epoch += 1
                self._cache.clear()
            else:
                self._versions[key] = self._versions.get(key, 0) + 1
                self._cache.pop(key, None)

    def _connection(self, name: str) -> Connection:
        return psycopg.connect(
            self.url, autocommit=True, row_factory=dict_row, application_name=name
        )

    def start(self) -> None:
        """Start the LISTEN thread (reconnects with backoff; the TTL covers the gaps) and the
        reader thread."""
        with self._lock:
            if self._reloader is None:
                self._start_reloader()
        self._wake = os.pipe()
        self._listener = threading.Thread(
            target=self._listen, name="cft-route-listener", daemon=True
        )
        self._listener.start()

    def stop(self) -> None:
        """Stop listening."""
        self._stop.set()
        if self._wake is not None:
            os.write(self._wake[1], b"x")
        if self._listener:
            self._listener.join(timeout=5)
        if self._reloader:
            with self._lock:
                self._pending_ready.notify_all()
            self._reloader.join(timeout=5)
        with self._reader_lock:
            self._close_reader()
        if self._wake is not None and not (self._listener and self._listener.is_alive()):
            for fd in self._wake:
                os.close(fd)
            self._wake = None

    def _listen(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            conns: list[Connection] = []
            try:
                for _ in range(LISTENERS):
                    conns.append(self._connection(LISTENER_NAME))
                    conns[-1].execute(f"LISTEN {CHANNEL}")
                self._serve(conns)
                backoff = 0.2
            except psycopg.Error:
                self.listening.clear()
                if self._stop.is_set():
                    break
                log.warning("route listener lost its connection; retrying in %.1fs", backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                for conn in conns:
                    conn.close()

    def _serve(self, conns: list[Connection]) -> None:
        """Re-read every cached route (anything may have changed while not listening), then
        take in notifications as they arrive until stop() (blocks on the sockets: no polling
        interval); raises psycopg.Error when a connection is lost."""
        with self._notify_lock:
            self._conns = conns
            self._last_xid.clear()
            self._seen.clear()
        try:
            fds = tuple(conn.pgconn.socket for conn in conns)
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            if self._wake is not None:
                poller.register(self._wake[0], select.POLLIN)
            self._fds = fds
            # Listening from here on: whatever this read misses, a NOTIFY brings.
            self._read_batches(list(self._cache), "resync")
            self.listening.set()
            while not self._stop.is_set():
                poller.poll()
                with self._notify_lock:
                    self._drain()
        finally:
            self.listening.clear()
            self._fds = ()
            with self._notify_lock:
                self._conns = []
