"""Prometheus metrics of the control plane and router (served at /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

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
