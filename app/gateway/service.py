"""The router's runtime: route table, engine pool and log writer, started with the app.

The reconciler (which loads adapters into the engines) is a process of its own in `workers/`;
the process that starts the API passes a ReconcilerFactory to run one beside the router.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

from app.core.auth import ApiKey, hash_key
from app.core.config import Settings
from app.core.db import Pool
from app.core.metrics import LOG_QUEUE_DEPTH, ROUTER_LOG_DROPPED
from app.core.pseudonym import user_hash, user_secret
from app.engines.state import EngineState
from app.gateway.finetuned import FineTunedModels
from app.gateway.logprocess import WRITER_PERMANENT_ERRORS, ProcessSink
from app.gateway.logsink import LogSink
from app.gateway.logwriter import LogWriter
from app.gateway.pool import EnginePool
from app.gateway.table import RouteTable

# Users whose pseudonym the router keeps (an HMAC per call is ~2 µs; a hit is a dict lookup).
USER_CACHE = 100_000
# GIL switch interval while the router runs. The log writer, the route listener and the
# reconciler are threads; with CPython's default (5 ms) the event loop waits up to 5 ms for the
# GIL whenever a call arrives while the log writer encodes a batch. 0.5 ms bounds that wait.
SWITCH_INTERVAL = 0.0005


class Reconciler(Protocol):
    """What the router needs of a reconciler running beside it (workers/reconciler)."""

    # True while it loads for the fleet (it adds what it loads to the engines' lists itself);
    # another reconciler leads otherwise, and the router sees its loads by probing.
    leader: bool

    @property
    def widened(self) -> frozenset[str]:
        """Adapters held by the first two engines of their rendezvous order (hot): the router
        spreads their calls over both."""

    def start(self) -> None:
        """Run passes in the background until stop()."""

    def kick(self) -> None:
        """Ask for a pass now."""

    def want(self, adapter_id: str) -> None:
        """Load this adapter now, into the engine that should hold it (a call waits for it)."""

    def stop(self) -> None:
        """Stop the passes (blocking: call it off the event loop)."""


# (database URL, the router's engines, settings) -> a reconciler, not yet started.
ReconcilerFactory = Callable[[str, list[EngineState], Settings], Reconciler]


@dataclass
class RouterRuntime:
    """Everything the gateway needs at request time."""

    table: RouteTable
    engines: EnginePool
    writer: LogWriter
    secret: bytes
    reconciler: Reconciler | None = None
    key_ttl: float = 5.0
    # The base model names the router may send to an engine (CFT_BASE_MODELS): a route's base
    # outside it is never sent, whatever the route says.
    bases: frozenset[str] = frozenset()
    # Seconds a call for an adapter no engine has yet waits for its load (CFT_ROUTER_LOAD_WAIT).
    load_wait: float = 10.0
    # Fine-tuned models called by name (ft:...), loaded on demand.
    finetuned: FineTunedModels = field(
        default_factory=lambda: FineTunedModels(ttl=5.0, demand_ttl=900.0)
    )
    switch_interval: float | None = None  # the interpreter's value before start(), restored
    sink: LogSink | ProcessSink | None = None  # the log writer's sink (closed at stop)
    # key hash -> (fresh until, key); hashes being re-checked; when a failed re-check may be
    # tried again.
    _keys: dict[bytes, tuple[float, ApiKey]] = field(default_factory=dict)
    _key_checks: set[bytes] = field(default_factory=set)
    _key_retry_at: dict[bytes, float] = field(default_factory=dict)
    _user_keys: Callable[[str], str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        secret = self.secret
        # The pseudonym depends on the user id and the server secret only (not the tenant),
        # so one LRU serves every tenant.
        self._user_keys = lru_cache(maxsize=USER_CACHE)(lambda u: user_hash(u, secret).hex())

    def user_key(self, user: str) -> str:
        """The user's pseudonym in hex: the key of the canary split (`serve.assign_adapter`)."""
        return self._user_keys(user)

    def cached_key(self, token: str) -> tuple[bytes, ApiKey | None, bool]:
        """(hash, key, recheck): the key when it was verified less than key_ttl seconds ago.

        A key verified between key_ttl and 2 * key_ttl seconds ago is still returned, with
        recheck True for exactly one caller, who starts one background lookup
        (stale-while-revalidate, like the route table): no call waits for a lookup every
        key_ttl seconds. A revoked key is dropped when that lookup returns, so it stops
        working within about key_ttl (CFT_ROUTER_KEY_CACHE_TTL) plus one lookup while it is
        in use, and within 2 * key_ttl plus one lookup at worst. Only live keys are cached:
        a new key works at once.
        """
        digest = hash_key(token)
        hit = self._keys.get(digest)
        if hit is None:
            return digest, None, False
        now = time.monotonic()
        if now < hit[0]:
            return digest, hit[1], False
        if now - hit[0] >= self.key_ttl:
            return digest, None, False
        if digest in self._key_checks or now < self._key_retry_at.get(digest, 0.0):
            return digest, hit[1], False
        self._key_checks.add(digest)
        return digest, hit[1], True

    def key_checked(self, digest: bytes, key: ApiKey | None, *, failed: bool = False) -> None:
        """Record a background re-check: the key again (live), None (revoked), or failed
        (PostgreSQL unavailable: keep serving the key, and try again in a second)."""
        self._key_checks.discard(digest)
        if failed:
            self._key_retry_at[digest] = time.monotonic() + 1.0
            return
        self._key_retry_at.pop(digest, None)
        if key is None:
            self._keys.pop(digest, None)
        else:
            self.remember_key(digest, key)

    def stale_key(self, digest: bytes) -> ApiKey | None:
        """A key verified earlier, however long ago (used only while PostgreSQL is down)."""
        hit = self._keys.get(digest)
        return hit[1] if hit else None

    def remember_key(self, digest: bytes, key: ApiKey) -> None:
        """Cache a verified live key."""
        if len(self._keys) > 10_000:
            self._keys.clear()
            self._key_retry_at.clear()
        self._keys[digest] = (time.monotonic() + self.key_ttl, key)


def log_dropped(record: dict[str, Any], exc: Exception) -> None:
    """Count a record the log writer gave up on, by reason (cft_router_log_records_dropped)."""
    ROUTER_LOG_DROPPED.labels(getattr(exc, "reason", type(exc).__name__)).inc()


def start(
    settings: Settings,
    *,
    db_url: str,
    pool: Pool,
    engine_urls: list[str],
    reconciler: ReconcilerFactory | None = None,
) -> RouterRuntime:
    """Start the route listener, the reconciler (given one) and the log writer (call inside
    the running event loop)."""
    engines = EnginePool(
        engine_urls, timeout=settings.engine_timeout, slack=settings.router_affinity_slack
    )
    running = reconciler(db_url, engines.engines, settings) if reconciler else None
    # No kick from the route table: the reconciler LISTENs on cft_adapter, which every change of an
    # adapter notifies, and passes on it.
    table = RouteTable(db_url, ttl=settings.route_cache_ttl)
    table.start()
    if running is not None:
        running.start()
    sink: LogSink | ProcessSink
    if settings.router_log_process:
        # The child starts with the first batch of more than INLINE_MAX records: a router that
        # never sees one (low traffic) runs no second process.
        sink = ProcessSink(db_url, settings)
    else:
        sink = LogSink(db_url, settings)
    writer = LogWriter(sink, permanent=WRITER_PERMANENT_ERRORS, on_drop=log_dropped)
    writer.start()
    LOG_QUEUE_DEPTH.set_function(lambda: writer.pending)
    runtime = RouterRuntime(
        table,
        engines,
        writer,
        user_secret(settings),
        reconciler=running,
        key_ttl=settings.router_key_cache_ttl,
        bases=settings.served_base_models,
        load_wait=settings.router_load_wait,
        finetuned=FineTunedModels(
            ttl=settings.route_cache_ttl, demand_ttl=settings.router_demand_ttl
        ),
        switch_interval=sys.getswitchinterval(),
        sink=sink,
    )
    sys.setswitchinterval(min(SWITCH_INTERVAL, sys.getswitchinterval()))
    # Everything allocated so far (modules, app, settings) lives as long as the process: keep
    # it out of the cyclic collector's full passes, which otherwise stall calls for many ms.
    gc.freeze()
    return runtime


async def stop(runtime: RouterRuntime) -> None:
    """Flush the logs, stop listening and reconciling, close the engine client."""
    await runtime.writer.close()
    if runtime.sink is not None:
        await asyncio.to_thread(runtime.sink.close)
    runtime.table.stop()
    if runtime.reconciler is not None:
        await asyncio.to_thread(runtime.reconciler.stop)
    await runtime.engines.close()
    if runtime.switch_interval is not None:
        sys.setswitchinterval(runtime.switch_interval)
