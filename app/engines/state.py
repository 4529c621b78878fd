"""One engine as the router and the reconciler see it: its kind and URL, what it serves.

`EngineState.models` is the set of names the engine serves, as last seen on its /v1/models
(refreshed by every reconciler pass, and trimmed at once when the engine refuses one). The
gateway only sends an adapter name to an engine whose set contains it (never route to an
adapter that is not loaded); `None` means not probed yet. An engine of a kind that lists no
models (LoRAX) loads adapters on first use, so its set is what the reconciler verified and
staged for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from app.engines.base import EngineKind
from app.engines.kinds import parse_engine_url

# An engine that refused a connection or timed out is skipped for this long.
DOWN_FOR = 2.0


@dataclass
class EngineState:
    """One engine: its URL and kind, the models it serves, and whether it looks down."""

    url: str
    models: frozenset[str] | None = None
    down_until: float = 0.0
    kind: EngineKind = "vllm"
    # lorax: adapter id -> the directory the engine reads it from (set by the reconciler).
    adapter_paths: dict[str, str] = field(default_factory=dict)
    # Calls sent to it whose answer is not finished yet (the router's own count).
    inflight: int = 0

    @classmethod
    def parse(cls, raw: str) -> EngineState:
        """An engine from a CFT_ENGINE_URLS entry (`KIND+URL` or a bare vLLM URL)."""
        spec = parse_engine_url(raw)
        return cls(spec.url, kind=spec.kind)

    @property
    def up(self) -> bool:
        """False for DOWN_FOR seconds after a failure."""
        return time.monotonic() >= self.down_until

    def mark_down(self) -> None:
        """Skip this engine for a while."""
        self.down_until = time.monotonic() + DOWN_FOR

    def has(self, model: str) -> bool:
        """True when the engine serves this model name."""
        models = self.models
        return models is not None and model in models

    def forget(self, model: str) -> None:
        """Drop a name the engine said it does not have."""
        models = self.models
        if models is not None and model in models:
            self.models = models - {model}


def model_ids(payload: object) -> frozenset[str]:
    """The model names in an OpenAI /v1/models response."""
    data = payload.get("data") if isinstance(payload, dict) else None
    return frozenset(
        str(m["id"]) for m in data or [] if isinstance(m, dict) and isinstance(m.get("id"), str)
    )
