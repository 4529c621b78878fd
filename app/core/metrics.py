"""Prometheus metrics of the control plane and router (served at /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

HTTP_REQUESTS = Counter(
    "cft_http_requests_total", "HTTP requests", ["method", "route", "status"], registry=REGISTRY
)
HTTP_LATENCY = Histogram(
    "cft_http_request_duration_seconds",
    "HTTP request latency",
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

# Router (issue 8).
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
COLD_STARTS = Counter(
    "cft_router_cold_starts_total",
    "Adapter loads into an engine by the reconciler (rate() gives cold starts per minute)",
    ["engine"],
    registry=REGISTRY,
)
ROUTER_REQUESTS = Counter(
    "cft_router_requests_total",
    "Requests proxied, by route, adapter (or base model) and status",
    ["route", "adapter", "status"],
    registry=REGISTRY,
)
ROUTER_LATENCY = Histogram(
    "cft_router_upstream_seconds",
    "Engine response time seen by the router (time to headers), LoRA adapter vs base model",
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
LOG_QUEUE_DEPTH = Gauge(
    "cft_router_log_queue_depth",
    "Inference log records queued, not yet written",
    registry=REGISTRY,
)
