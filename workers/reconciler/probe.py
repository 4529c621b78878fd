"""What the reconciler learns from each engine: what it holds, and what it says about itself.

One probe per engine per pass, the same for the leading reconciler and the others (the
router's EnginePool probes on its own when no reconciler runs beside it): the kind's probe
path (/v1/models for a kind that lists what it holds), what the engine says about itself once
per contact (its base, revision, capacity and pin limit: Kind.describe), and vLLM's own LoRA
numbers from its /metrics.
"""

from __future__ import annotations

import logging

import httpx

from app.core.config import Settings
from app.core.metrics import ENGINE_LORA_ADAPTERS
from app.engines.base import Http
from app.engines.kinds import kind_of
from app.engines.lora_metrics import vllm_lora_state
from app.engines.state import EngineState, model_ids

log = logging.getLogger("cft.reconciler")


class Prober:
    """Probes engines over one HTTP client; `pinned` is what the reconciler pinned per engine
    URL (a pinned adapter gone from an engine's list means the engine restarted)."""

    def __init__(self, client: Http, settings: Settings, *, pinned: dict[str, set[str]]):
        self.client = client
        self.settings = settings
        self.pinned = pinned
        self._described: set[str] = set()

    def probe(self, engine: EngineState, recorded: dict[str, set[str]] | None) -> bool:
        """Ask the engine what it holds and (once per contact) about itself; set what the
        router may send it (`recorded`: the adapters recorded loaded per engine, when leading).
        False (and marked down) when it does not answer."""
        kind = kind_of(engine.kind)
        try:
            resp = self.client.get(engine.url + kind.probe_path, timeout=5.0)
            resp.raise_for_status()
            payload = resp.json() if kind.lists_models else None
        except (httpx.HTTPError, ValueError) as exc:
            if engine.up:
                log.warning("engine %s does not answer %s: %s", engine.url, kind.probe_path, exc)
            engine.mark_down()
            self._described.discard(engine.url)
            return False
        if engine.url not in self._described:
            self.describe(engine)
        if payload is not None:
            self.observe(engine, model_ids(payload), recorded)
        self.scrape(engine)
        return True

    def describe(self, engine: EngineState) -> None:
        """What the engine says about itself: its base, revision, capacity and pin limit (the
        capacity CFT_ENGINE_ADAPTER_SLOTS where it does not say)."""
        self._described.add(engine.url)
        slots = self.settings.engine_adapter_slots or None
        try:
            said = kind_of(engine.kind).describe(self.client, engine.url)
        except (httpx.HTTPError, ValueError) as exc:
            log.info("engine %s does not describe itself (%s)", engine.url, exc)
            engine.capacity = engine.capacity or slots
            return
        engine.bases, engine.revision = said.bases, said.revision
        engine.capacity = said.capacity if said.capacity is not None else slots
        engine.pin_limit = said.pin_limit
        if engine.capacity is not None:
            ENGINE_LORA_ADAPTERS.labels(engine.url, "capacity").set(engine.capacity)
        log.info(
            "engine %s (%s) serves %s%s; loads ahead %s adapters",
            engine.url,
            engine.kind,
            ", ".join(sorted(said.bases or [])) or "a base it does not name",
            f" (revision {said.revision})" if said.revision else "",
            engine.capacity if engine.capacity is not None else "all its",
        )

    def observe(
        self, engine: EngineState, listed: set[str], recorded: dict[str, set[str]] | None
    ) -> None:
        """Set what a listing engine holds (resident) and what a call may name on it (models):
        what it lists, plus, for a kind that keeps evicted adapters callable, what it held
        before (at first, what was recorded loaded there), unless it lost a pinned one (it
        restarted: it holds nothing it does not list)."""
        kind = kind_of(engine.kind)
        engine.resident = listed
        if not kind.keeps_evicted:
            engine.models = set(listed)
            return
        if engine.models is None:
            engine.models = listed | (recorded or {}).get(engine.url, set())
            return
        pinned = self.pinned[engine.url]
        lost = pinned - listed
        if lost:
            log.warning(
                "engine %s lost pinned adapter(s) %s (restarted?): it holds only what it lists",
                engine.url,
                ", ".join(sorted(lost)[:5]),
            )
            pinned.clear()
            engine.models = set(listed)
            return
        engine.models = engine.models | listed

    def scrape(self, engine: EngineState) -> None:
        """The engine's own LoRA numbers (vLLM's /metrics), as gauges; nothing for other kinds
        or when it does not answer."""
        if not engine.kind.startswith("vllm"):
            return
        try:
            resp = self.client.get(engine.url + "/metrics", timeout=2.0)
            resp.raise_for_status()
            state = vllm_lora_state(resp.text)
        except (httpx.HTTPError, ValueError):
            return
        if state is None:
            return
        ENGINE_LORA_ADAPTERS.labels(engine.url, "running").set(len(state.running))
        ENGINE_LORA_ADAPTERS.labels(engine.url, "waiting").set(len(state.waiting))
        if state.max_loras is not None:
            ENGINE_LORA_ADAPTERS.labels(engine.url, "max").set(state.max_loras)
