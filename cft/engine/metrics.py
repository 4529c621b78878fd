"""Prometheus metrics of one engine (its own registry, served at /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class EngineMetrics:
    """The engine's counters, gauges and histograms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "cft_engine_requests_total",
            "Generation requests by endpoint, model and outcome",
            ["endpoint", "model", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "cft_engine_prompt_tokens_total", "Prompt tokens processed", registry=r
        )
        self.generation_tokens = Counter(
            "cft_engine_generation_tokens_total", "Tokens generated", registry=r
        )
        self.batch_size = Histogram(
            "cft_engine_batch_size",
            "Requests decoded together, per decode step",
            registry=r,
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32),
        )
        self.ttft = Histogram(
            "cft_engine_time_to_first_token_seconds",
            "From arrival to the first generated token",
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.loaded_adapters = Gauge(
            "cft_engine_loaded_adapters", "LoRA adapters registered (GET /v1/models)", registry=r
        )
        self.resident_adapters = Gauge(
            "cft_engine_resident_adapters", "LoRA adapters in memory now", registry=r
        )
        self.evictions = Counter(
            "cft_engine_adapter_evictions_total", "Adapters evicted from memory (LRU)", registry=r
        )
        self.queue_time = Histogram(
            "cft_engine_queue_time_seconds",
            "From arrival to the start of the request's prefill",
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.running = Gauge(
            "cft_engine_requests_running", "Requests in the running batch", registry=r
        )
        self.waiting = Gauge("cft_engine_requests_waiting", "Requests queued", registry=r)
        self.rejected = Counter(
            "cft_engine_requests_rejected_total",
            "Requests refused with 429 because the waiting queue was full",
            registry=r,
        )
