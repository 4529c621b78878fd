"""Prometheus metrics of the control plane and router.

They are served on a port of their own (CFT_METRICS_HOST:CFT_METRICS_PORT, loopback by
default), never on the API's public port: their labels name every tenant's routes and adapters.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REGISTRY = CollectorRegistry(auto_describe=True)
M = TypeVar("M", bound=MetricWrapperBase)

HTTP_REQUESTS = Counter(
    "cft_http_requests_total", "HTTP requests", ["method", "route", "status"], registry=REGISTRY
)
HTTP_LATENCY = Histogram(
    "cft_http_request_duration_seconds",
    "HTTP request latency (until the response headers are sent)",
    ["method", "route"],
    registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

LOG_ROWS = Counter(
    "cft_log_rows_total",
    "Log records accepted by POST /v1/logs, by result (inserted, existing)",
    ["result"],
    registry=REGISTRY,
)
LOG_REJECTED = Counter(
    "cft_log_records_rejected_total",
    "Log records refused by POST /v1/logs, by reason",
    ["reason"],
    registry=REGISTRY,
)

# The gateway (docs/serving.md).
ROUTER_ACTIVE_ADAPTERS = Gauge(
    "cft_router_active_adapters",
    "Adapters of serve.adapter loaded on each engine (as last reconciled)",
    ["engine"],
    registry=REGISTRY,
)
ROUTE_CACHE = Counter(
    "cft_router_route_cache_total",
    "Route table lookups, by result (hit, miss)",
    ["result"],
    registry=REGISTRY,
)
ROUTE_READS = Counter(
    "cft_router_route_reads_total",
    "Queries of routes' serving state (one query reads every route of a NOTIFY burst or of a"
    " reconnect), by why: miss (a call's first), notify (a NOTIFY without the state), resync"
    " (after the LISTEN connection came back), stale (no LISTEN connection: past the TTL)",
    ["why"],
    registry=REGISTRY,
)
COLD_STARTS = Counter(
    "cft_router_cold_starts_total",
    "Adapter loads into an engine by the reconciler (rate() gives cold starts per minute)",
    ["engine"],
    registry=REGISTRY,
)
ROUTER_REQUESTS = Counter(
    "cft_router_requests_total",
    "Requests proxied, by what answered (lora, base) and status; per route and adapter in SQL"
    " (obs.adapter_serving_7d), so the series stay few at any number of routes",
    ["kind", "status"],
    registry=REGISTRY,
)
ROUTER_LOG_DROPPED = Counter(
    "cft_router_log_records_dropped_total",
    "Router log records that can never be stored (the call was served), by reason",
    ["reason"],
    registry=REGISTRY,
)
ROUTER_LOG_PROCESS_RESTARTS = Counter(
    "cft_router_log_process_restarts_total",
    "Times the router's log process died or hung and was started again (its batch retried)",
    registry=REGISTRY,
)
ROUTER_LATENCY = Histogram(
    "cft_router_upstream_seconds",
    "Engine response time seen by the router (streams: to headers; whole calls: to the body),"
    " LoRA adapter vs base model",
    ["kind"],
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
ROUTING_DECISIONS = Counter(
    "cft_router_decisions_total",
    "Routing decisions by variant (A = prod, B.. = canaries, base, or fallback)",
    ["variant"],
    registry=REGISTRY,
)
ROUTER_FALLBACKS = Counter(
    "cft_router_fallbacks_total",
    "Requests served by another model than assigned, by reason (not_loaded, adapter_error)",
    ["reason"],
    registry=REGISTRY,
)
ENGINE_FAILURES = Counter(
    "cft_router_engine_failures_total",
    "Engine calls that failed (connect, timeout, protocol), by engine",
    ["engine", "reason"],
    registry=REGISTRY,
)
RECONCILER_ERRORS = Counter(
    "cft_reconciler_errors_total",
    "Reconciler failures by reason (engine_down, fetch, sha256, load, unload, db)",
    ["reason"],
    registry=REGISTRY,
)
RECONCILER_CPU = Counter(
    "cft_reconciler_cpu_seconds_total",
    "CPU time the reconciler spent (its passes and its engines' load threads)",
    registry=REGISTRY,
)
ADAPTER_LOOKUPS = Counter(
    "cft_router_adapter_lookups_total",
    "Calls for an adapter, by whether an engine had it loaded: hit, loaded (waited for its"
    " load), missing (not loaded in CFT_ROUTER_LOAD_WAIT); hit / all = the cache hit ratio",
    ["result"],
    registry=REGISTRY,
)
LOAD_WAIT = Histogram(
    "cft_router_load_wait_seconds",
    "Time a call for an adapter no engine had loaded waited for its load",
    registry=REGISTRY,
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
COLD_START_SECONDS = Histogram(
    "cft_cold_start_seconds",
    "Adapter cold starts, by stage: stage (the reconciler fetches and verifies the artefact),"
    " load (the engine's load call), first_token (a call that waited for its adapter's load:"
    " from the wait's start to the answer's first token)",
    ["stage"],
    registry=REGISTRY,
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
FIRST_TOKEN_COLD = COLD_START_SECONDS.labels("first_token")
ENGINE_LORA_ADAPTERS = Gauge(
    "cft_engine_lora_adapters",
    "Adapters on each engine by state: running and waiting in its scheduler and its"
    " --max-loras (max) from vLLM's vllm:lora_requests_info; resident (listed by the engine"
    " now), pinned (by cft) and capacity (what it keeps loaded, where it says)",
    ["engine", "state"],
    registry=REGISTRY,
)
LOG_QUEUE_DEPTH = Gauge(
    "cft_router_log_queue_depth",
    "Inference log records queued, not yet written",
    registry=REGISTRY,
)


# The loop (docs/loop.md): `cft worker loop` serves these with --metrics-port.
LOOP_CYCLES_STARTED = Counter(
    "cft_loop_cycles_started_total",
    "Loop cycles started, by trigger",
    ["trigger"],
    registry=REGISTRY,
)
LOOP_CYCLES_FINISHED = Counter(
    "cft_loop_cycles_finished_total",
    "Loop cycles finished, by outcome (promoted, rejected, rolled_back, failed)",
    ["outcome"],
    registry=REGISTRY,
)
LOOP_STATE_SECONDS = Histogram(
    "cft_loop_state_duration_seconds",
    "Time a loop cycle spent in a state (from entering it to leaving it)",
    ["state"],
    registry=REGISTRY,
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600, 7 * 24 * 3600),
)


@lru_cache(maxsize=4096)
def _child(metric: Any, labels: tuple[str, ...]) -> Any:
    return metric.labels(*labels)


def child(metric: M, *labels: str) -> M:
    """metric.labels(*labels), memoised: the hot path skips label validation and the lock."""
    result: M = _child(metric, labels)
    return result


class MetricsMiddleware:
    """Count and time every HTTP request by method, route template and status (pure ASGI).

    Starlette's `@app.middleware("http")` (BaseHTTPMiddleware) runs each request in a task
    with memory streams; this only wraps `send` to see the status and the header time.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        seen: list[Any] = []  # [status, seconds to headers, route template] once headers go

        async def send_and_watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                # The route is in the scope once routing matched (read it now: frameworks may
                # restore the scope after the endpoint returns).
                route = scope.get("route")
                seen[:] = (
                    message["status"],
                    time.perf_counter() - start,
                    getattr(route, "path", "unmatched"),
                )
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            if seen:
                status, seconds, path = seen
            else:  # the app raised before answering: the server error middleware sends 500
                route = scope.get("route")
                status, seconds = 500, time.perf_counter() - start
                path = getattr(route, "path", "unmatched")
            method = scope["method"]
            child(HTTP_LATENCY, method, path).observe(seconds)
            child(HTTP_REQUESTS, method, path, str(status)).inc()


_log = logging.getLogger("cft.metrics")
# (host, port) -> [server, users]: apps of one process share one metrics listener.
_listeners: dict[tuple[str, int], list[Any]] = {}
_listeners_lock = threading.Lock()


def serve_metrics(host: str, port: int) -> Callable[[], None]:
    """Serve REGISTRY at http://host:port/metrics (shared within the process); returns a stop
    function. A port another process holds is logged, not fatal: serving calls matters more."""
    key = (host, port)
    with _listeners_lock:
        entry = _listeners.get(key)
        if entry is None:
            try:
                server, _thread = start_http_server(port, addr=host, registry=REGISTRY)
            except OSError as exc:
                _log.error("metrics not served on %s:%s: %s", host, port, exc)
                return lambda: None
            entry = _listeners[key] = [server, 0]
        entry[1] += 1

    def stop() -> None:
        with _listeners_lock:
            entry[1] -= 1
            if entry[1] == 0 and _listeners.get(key) is entry:
                del _listeners[key]
                entry[0].shutdown()
                entry[0].server_close()

    return stop
