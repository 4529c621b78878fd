"""Engine kinds: how the router names an adapter on each kind of engine, and how it tells
that an engine refused an adapter. docs/engines.md is the user's guide to these rules.

An engine is written `KIND+URL` in CFT_ENGINE_URLS (`sglang+http://sglang:30000`); a bare URL is
a vLLM engine. The kinds:

- `vllm`: vLLM's OpenAI server. Adapters are loaded with POST /v1/load_lora_adapter (lora_name =
  the adapter id) and called by that name in `model`; an unknown name is a 404.
- `local`: cft's CPU engine (`cft engine`), which speaks vLLM's API: the same rules.
- `sglang`: SGLang's server. Adapters are loaded with POST /load_lora_adapter and called as
  `<base model>:<adapter name>` (split at the first colon); an adapter that is not loaded is a
  400 ("The following requested LoRA adapters are not loaded").
- `lorax`: LoRAX. Nothing is loaded ahead: a call names the adapter itself (`model` = the
  adapter's directory, `adapter_source` = "local") and LoRAX loads it on first use; the base
  model is `model` = "". An adapter LoRAX cannot load fails the call with 424.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

EngineKind = Literal["vllm", "sglang", "lorax", "local"]
KINDS: tuple[str, ...] = get_args(EngineKind)
DEFAULT_KIND: EngineKind = "vllm"
# Kinds whose adapters are loaded by a call to the engine (the others read them on first use).
LOADS_ADAPTERS = frozenset({"vllm", "local", "sglang"})
# What a LoRAX call says about where its adapter is: a directory on the engine's filesystem.
LORAX_SOURCE = "local"


@dataclass(frozen=True)
class EngineSpec:
    """One entry of CFT_ENGINE_URLS: the engine's kind and its base URL."""

    kind: EngineKind
    url: str


def parse_engine_url(raw: str) -> EngineSpec:
    """`KIND+http://host:port` (or a bare URL, a vLLM engine) as an EngineSpec.

    Raises ValueError with a message saying what to write instead.
    """
    text = raw.strip()
    kind: str = DEFAULT_KIND
    url = text
    scheme = text.split("://", 1)[0] if "://" in text else ""
    if "+" in scheme:
        kind, _, rest = text.partition("+")
        kind = kind.strip().lower()
        url = rest.strip()
    if kind not in KINDS:
        raise ValueError(
            f"engine {raw!r}: unknown engine kind {kind!r}; write KIND+URL with KIND one of"
            f" {', '.join(KINDS)} (e.g. sglang+http://sglang:30000), or a bare URL for vLLM"
        )
    if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1]) == 0:
        raise ValueError(
            f"engine {raw!r}: {url!r} is not an http(s) URL; write e.g. http://vllm:8000"
            " or sglang+http://sglang:30000"
        )
    return EngineSpec(kind, url.rstrip("/"))  # type: ignore[arg-type]  # checked above


def parse_engine_urls(raw: str | list[str]) -> list[EngineSpec]:
    """A comma-separated CFT_ENGINE_URLS value (or its entries) as EngineSpecs, in order."""
    entries = raw.split(",") if isinstance(raw, str) else raw
    return [parse_engine_url(e) for e in entries if e.strip()]


def upstream_fields(
    kind: str, model: str, *, base_model: str, adapter_path: str | None
) -> dict[str, str]:
    """The body fields that select `model` (an adapter id, or the route's base model) on an
    engine of this kind."""
    is_base = model == base_model
    if kind == "sglang":
        return {"model": model if is_base else f"{base_model}:{model}"}
    if kind == "lorax":
        if is_base:
            return {"model": ""}
        return {"model": adapter_path or model, "adapter_source": LORAX_SOURCE}
    return {"model": model}


def adapter_refused(kind: str, status: int, body: bytes) -> bool:
    """True when an engine's answer to a call for an adapter means "that adapter is not
    available here" (drop it from the engine's list, fall back), not a bad request."""
    if status == 404 or status >= 500:
        return True
    if kind == "sglang":
        return status == 400 and b"not loaded" in body
    if kind == "lorax":
        # LoRAX answers 424 (its GenerationError) when it could not fetch or load the adapter.
        return status == 424
    return False
