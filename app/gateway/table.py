"""The router's view of serve.adapter: a TTL cache invalidated at once by NOTIFY cft_adapter.

On a NOTIFY the listener drops the route and a reload thread reads it again at once, so a
promotion is cached before the next call needs it (that call would otherwise read it itself).
Reads go over one kept connection (a new one costs 10-30 ms on a busy machine: most of what
promotion to routing took; BENCHMARKS.md, "Router against LiteLLM (issue 26)").
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from decimal import Decimal

import psycopg
from psycopg.rows import dict_row

from app.core.db import Connection
from app.core.errors import DB_UNAVAILABLE
from app.core.metrics import ROUTE_CACHE
from app.gateway.assign import Canary, RouteState

log = logging.getLogger("cft.gateway")

CHANNEL = "cft_adapter"
_HITS = ROUTE_CACHE.labels("hit")


def load_route(conn: Connection, name: str) -> RouteState | None:
    """Read one route's serving state (as the owner: routing spans tenants)."""
    route = conn.execute(
        "SELECT name, tenant_id, base_model, experiment FROM serve.route WHERE name = %s", (name,)
    ).fetchone()
    if route is None:
        return None
    rows = conn.execute(
        "SELECT id, status, traffic_pct, created_at FROM serve.adapter"
        " WHERE route = %s AND status IN ('prod', 'canary') ORDER BY created_at, id",
        (name,),
    ).fetchall()
    prod = next((r["id"] for r in rows if r["status"] == "prod"), None)
    canaries = [
        Canary(r["id"], Decimal(r["traffic_pct"]), r["created_at"])
        for r in rows
        if r["status"] == "canary"
    ]
    return RouteState(
        name=route["name"],
        tenant_id=route["tenant_id"],
        base_model=route["base_model"],
        experiment=route["experiment"],
        prod=prod,
        canaries=canaries,
    )


class RouteTable:
    """Routes cached for ttl seconds; a NOTIFY on cft_adapter drops the route at once."""

    def __init__(
        self, url: str, *, ttl: float = 5.0, on_change: Callable[[str], None] | None = None
    ):
        self.url = url
        self.ttl = ttl
        self.on_change = on_change
        self._cache: dict[str, tuple[float, RouteState | None]] = {}
        self._lock = threading.Lock()
        self._generation = 0
        self._stop = threading.Event()
        self._listener: threading.Thread | None = None
        self._conn: Connection | None = None
        self.listening = threading.Event()
        self._refreshing: set[str] = set()
        self._retry_at: dict[str, float] = {}
        # The kept connection for route reads (not the LISTEN one), one read at a time.
        self._reader: Connection | None = None
        self._reader_lock = threading.Lock()
        # Routes a NOTIFY dropped, re-read by a thread of their own (the listener never
        # waits for a read: the next NOTIFY is handled at once). None stops that thread.
        self._reloads: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._reloader: threading.Thread | None = None

    def peek(self, name: str) -> tuple[bool, RouteState | None]:
        """(True, state) when the route is cached and fresh; never touches the database."""
        hit = self._cache.get(name)  # a dict read is atomic: no lock on the hot path
        if hit is not None and time.monotonic() - hit[0] < self.ttl:
            _HITS.inc()
            return True, hit[1]
        return False, None

    def lookup(self, name: str) -> tuple[bool, RouteState | None]:
        """Like peek, but a route cached longer than ttl is still served while one background
        read refreshes it (stale-while-revalidate); never touches the database.

        The TTL only covers a missed NOTIFY, and re-reading a route takes 10-30 ms (a new
        connection): without this, every call in that window waited for its own re-read,
        every ttl seconds. A route dropped by NOTIFY is not cached at all, so a promotion,
        canary change or rollback still reaches the next call at once (it reads the route).
        """
        hit = self._cache.get(name)
        if hit is None:
            return False, None
        if time.monotonic() - hit[0] >= self.ttl:
            self._refresh_soon(name)
        _HITS.inc()
        return True, hit[1]

    def _refresh_soon(self, name: str) -> None:
        with self._lock:
            if name in self._refreshing or time.monotonic() < self._retry_at.get(name, 0.0):
                return
            self._refreshing.add(name)
        threading.Thread(
            target=self._refresh, args=(name,), name="cft-route-refresh", daemon=True
        ).start()

    def _refresh(self, name: str) -> None:
        ROUTE_CACHE.labels("miss").inc()
        generation = self._generation
        retry_at = 0.0
        try:
            self._store(name, generation, self._read(name))
        except psycopg.Error as exc:
            # The database is down: keep serving what we knew, and try again in a second
            # (not on every call).
            log.warning("route %s: refresh failed (%s); serving the cached state", name, exc)
            retry_at = time.monotonic() + 1.0
        finally:
            with self._lock:
                self._refreshing.discard(name)
                self._retry_at[name] = retry_at

    def get(self, name: str) -> RouteState | None:
        """The route's state, from cache when fresh."""
        fresh, cached = self.peek(name)
        if fresh:
            return cached
        return self._load(name)

    def _load(self, name: str) -> RouteState | None:
        ROUTE_CACHE.labels("miss").inc()
        generation = self._generation
        try:
            state = self._read(name, cached_ok=True)
        except DB_UNAVAILABLE:
            # PostgreSQL is down: keep serving what we knew (it cannot change meanwhile).
            stale = self._cache.get(name)
            if stale is None:
                raise
            log.warning("route %s: database unavailable, serving the cached state", name)
            return stale[1]
        self._store(name, generation, state)
        return state

    def _read(self, name: str, *, cached_ok: bool = False) -> RouteState | None:
        """load_route over the kept reader connection; one new connection and one retry when
        the kept one is broken (PostgreSQL restarted, the backend was terminated).

        cached_ok: when the route got cached while this waited for the connection (the
        listener's re-read after a NOTIFY), that state, without a second read."""
        with self._reader_lock:
            if cached_ok:
                fresh, state = self.peek(name)
                if fresh:
                    return state
            for attempt in (1, 2):
                kept = self._reader is not None
                if self._reader is None or self._reader.closed:
                    self._reader = self._connection()
                try:
                    return load_route(self._reader, name)
                except psycopg.Error:
                    self._close_reader()
                    if attempt == 2 or not kept:
                        raise
        raise AssertionError("unreachable")

    def _close_reader(self) -> None:
        conn, self._reader = self._reader, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.debug("closing the route reader connection failed", exc_info=True)

    def _reload_forever(self) -> None:
        while (name := self._reloads.get()) is not None:
            self.reload(name)

    def reload(self, name: str) -> None:
        """Read a route again now and cache it (after a NOTIFY dropped it); on failure it
        stays uncached and the next call reads it."""
        generation = self._generation
        ROUTE_CACHE.labels("miss").inc()
        try:
            self._store(name, generation, self._read(name))
        except psycopg.Error as exc:
            log.warning("route %s: re-read after NOTIFY failed (%s)", name, exc)

    def _store(self, name: str, generation: int, state: RouteState | None) -> None:
        with self._lock:
            # A NOTIFY that arrived during the read may describe a newer state: don't cache.
            if generation == self._generation:
                self._cache[name] = (time.monotonic(), state)

    def invalidate(self, name: str | None = None) -> None:
        """Forget one route (or all)."""
        with self._lock:
            self._generation += 1
            if name is None:
                self._cache.clear()
            else:
                self._cache.pop(name, None)
        if self.on_change and name:
            self.on_change(name)

    def _connection(self) -> Connection:
        return psycopg.connect(self.url, autocommit=True, row_factory=dict_row)

    def start(self) -> None:
        """Start the LISTEN thread (reconnects with backoff; the TTL covers the gaps)."""
        self._reloader = threading.Thread(
            target=self._reload_forever, name="cft-route-reload", daemon=True
        )
        self._reloader.start()
        self._listener = threading.Thread(
            target=self._listen, name="cft-route-listener", daemon=True
        )
        self._listener.start()

    def stop(self) -> None:
        """Stop listening."""
        self._stop.set()
        conn = self._conn
        if conn is not None:
            try:
                conn.cancel_safe()
            except Exception:
                log.debug("cancel of listener connection failed", exc_info=True)
        if self._listener:
            self._listener.join(timeout=5)
        if self._reloader:
            self._reloads.put(None)
            self._reloader.join(timeout=5)
        with self._reader_lock:
            self._close_reader()

    def _listen(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                with self._connection() as conn:
                    self._conn = conn
                    conn.execute(f"LISTEN {CHANNEL}")
                    # Anything may have changed while we were not listening.
                    self.invalidate()
                    self.listening.set()
                    backoff = 0.2
                    while not self._stop.is_set():
                        # stop_after=1: back from the generator (which holds the connection)
                        # as soon as a packet of notifications is in.
                        names = [n.payload for n in conn.notifies(timeout=1.0, stop_after=1)]
                        for name in dict.fromkeys(names):
                            self.invalidate(name)
                            if name:
                                self._reloads.put(name)
            except psycopg.Error:
                self.listening.clear()
                if self._stop.is_set():
                    break
                log.warning("route listener lost its connection; retrying in %.1fs", backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                self._conn = None
