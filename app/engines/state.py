"""One engine as the router and the reconciler see it: its kind and URL, what it serves.

`EngineState.models` is the set of adapter names a call may name on the engine (never route
to an adapter that is not there); `None` means not probed yet. For a kind that lists what it
holds (vLLM, SGLang), it comes from the engine's /v1/models, trimmed at once when the engine
refuses a name; SGLang also keeps callable what it evicted (it loads it again on the call that
names it), so its set is what it lists plus what it evicted. For a kind that loads on first use
(LoRAX, `vllm-lazy`), it is what the reconciler verified and staged for it.

The sets are changed in place (add, discard) by one thread while another reads them: a
membership test is atomic in CPython, and no reader iterates them.
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
    models: set[str] | None = None
    down_until: float = 0.0
    kind: EngineKind = "vllm"
    # lorax: adapter id -> the directory the engine reads it from (set by the reconciler).
    adapter_paths: dict[str, str] = field(default_factory=dict)
    # Calls sent to it whose answer is not finished yet (the router's own count).
    inflight: int = 0
    # What the engine says about itself (None: it does not say). bases: the base models it
    # serves (its /v1/models entries without a parent); revision: the base's weights version
    # where the engine reports one; capacity: adapters it keeps loaded (SGLang's
    # --max-loaded-loras, else CFT_ENGINE_ADAPTER_SLOTS); pin_limit: adapters cft may pin.
    bases: frozenset[str] | None = None
    revision: str | None = None
    capacity: int | None = None
    pin_limit: int = 0
    # Adapters the engine holds now, as it last listed them (None: it does not list them).
    resident: set[str] | None = None
    # Calls the router sent per adapter since the reconciler last read them (its hot set and
    # which adapters it widens), and the adapters this engine answered 429 for meanwhile.
    calls: dict[str, int] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)

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
        """True when a call may name this model on the engine."""
        models = self.models
        return models is not None and model in models

    def serves_base(self, base_model: str) -> bool:
        """False only when the engine said which bases it serves and this is not one."""
        bases = self.bases
        return bases is None or base_model in bases

    def forget(self, model: str) -> None:
        """Drop a name the engine said it does not have."""
        if self.models is not None:
            self.models.discard(model)
        if self.resident is not None:
            self.resident.discard(model)

    def count_call(self, model: str) -> None:
        """Note one call for an adapter (the reconciler ranks its hot set by these)."""
        calls = self.calls
        calls[model] = calls.get(model, 0) + 1

    def take_calls(self) -> dict[str, int]:
        """The calls counted since the last take (and start counting afresh)."""
        taken, self.calls = self.calls, {}
        return taken

    def note_busy(self, model: str) -> None:
        """Note a 429 for an adapter (the reconciler widens it)."""
        self.busy.add(model)

    def take_busy(self) -> set[str]:
        """The adapters answered 429 since the last take."""
        taken, self.busy = self.busy, set()
        return taken


def model_ids(payload: object) -> set[str]:
    """The model names in an OpenAI /v1/models response."""
    data = payload.get("data") if isinstance(payload, dict) else None
    return {
        str(m["id"]) for m in data or [] if isinstance(m, dict) and isinstance(m.get("id"), str)
    }
