"""vLLM's own LoRA numbers, read from the Prometheus text its gauge produces."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from app.engines.lora_metrics import vllm_lora_state


def _vllm_text(states: list[tuple[str, str]]) -> str:
    """What vllm/v1/metrics/loggers.py serves: the gauge with vLLM's labels, one series per
    state, each set to the time it was recorded (set_to_current_time), newest last."""
    registry = CollectorRegistry()
    gauge = Gauge(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        registry=registry,
    )
    for at, (running, waiting) in enumerate(states, start=1):
        gauge.labels("8", waiting, running).set(1_700_000_000 + at)
    return generate_latest(registry).decode()


def test_the_newest_sample_is_the_state() -> None:
    text = _vllm_text([("a,b", ""), ("c", "d,e,f"), ("", "")])
    state = vllm_lora_state(text)
    assert state is not None
    assert state.running == frozenset() and state.waiting == frozenset() and state.max_loras == 8
    state = vllm_lora_state(_vllm_text([("", ""), ("c", "d,e,f")]))
    assert state is not None
    assert state.running == {"c"} and state.waiting == {"d", "e", "f"}


def test_no_lora_gauge_is_none() -> None:
    assert vllm_lora_state("# no metrics\nvllm:num_requests_running 0\n") is None
