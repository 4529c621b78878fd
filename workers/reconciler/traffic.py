"""What the router's calls tell the reconciler: each adapter's recent calls (the order of the
hot set each engine loads ahead), its call rate, and the 429s its replicas answered, which
together say which adapters are widened (held by the first two replicas of their rendezvous
order, their calls spread over both: app/engines/placement.py).

An adapter is widened while its calls, as the router counted them over about the last
RATE_WINDOW_S, come faster than CFT_ENGINE_WIDEN_RATE per second (it stays widened until
they fall below half of that), or for BUSY_KEEP_S after one of its replicas answered it 429,
or for WIDEN_ASK_KEEP_S after another API replica's reconciler asked for it (its own router's
traffic made it hot there).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from app.engines.state import EngineState

# The call rate is a count decayed with this time constant, divided by the time it covers:
# calls per second over about the last RATE_WINDOW_S (or since the adapter's first call, at
# least a third of that, so a hot adapter shows as hot at the first pass that counts it).
RATE_WINDOW_S = 30.0
# Recent calls per adapter (the hot set's order) halve this often.
HALF_LIFE_S = 300.0
# An adapter one of whose replicas answered 429 stays widened this long after.
BUSY_KEEP_S = 300.0
# A widening asked for by another reconciler holds this long after the ask (it asks again
# every WIDEN_ASK_EVERY_S while its router keeps the adapter hot).
WIDEN_ASK_KEEP_S = 120.0
WIDEN_ASK_EVERY_S = 60.0
# Rates that decayed below this (calls per second) are forgotten.
_FORGET_RATE = 0.001


class Traffic:
    """Calls and 429s per adapter, taken from the engines' counts once per pass."""

    def __init__(self, widen_rate: float):
        self.widen_rate = widen_rate
        # Recent calls per adapter, halved every HALF_LIFE_S.
        self.calls: dict[str, float] = {}
        self._halved_at = time.monotonic()
        # Adapter -> (calls decayed by RATE_WINDOW_S, when, first counted); when each last had
        # a 429, and when another reconciler last asked to widen it.
        self._decayed: dict[str, tuple[float, float, float]] = {}
        self._busy_at: dict[str, float] = {}
        self._asked_at: dict[str, float] = {}
        self._forgot_at = time.monotonic()
        # The adapters widened now (a new set whenever it changes: the router reads it).
        self.widened: frozenset[str] = frozenset()

    def rate(self, adapter_id: str, now: float | None = None) -> float:
        """The adapter's calls per second over about the last RATE_WINDOW_S."""
        value, at, since = self._decayed.get(adapter_id, (0.0, 0.0, 0.0))
        if value == 0.0:
            return 0.0
        now = time.monotonic() if now is None else now
        covered = max(now - since, RATE_WINDOW_S / 3)
        span = RATE_WINDOW_S * -math.expm1(-covered / RATE_WINDOW_S)
        return value * math.exp(-(now - at) / RATE_WINDOW_S) / span

    def ask(self, adapter_id: str) -> None:
        """Another reconciler asked for this adapter to be widened."""
        self._asked_at[adapter_id] = time.monotonic()

    def take(self, engines: Iterable[EngineState]) -> bool:
        """Take the calls and 429s the router counted since the last take; whether there were
        calls. Updates `calls` and `widened`."""
        now = time.monotonic()
        if now - self._halved_at >= HALF_LIFE_S:
            self.calls = {a: n / 2 for a, n in self.calls.items() if n >= 1}
            self._halved_at = now
        calls, decayed = self.calls, self._decayed
        touched: set[str] = set()
        for engine in engines:
            for adapter_id, n in engine.take_calls().items():
                calls[adapter_id] = calls.get(adapter_id, 0.0) + n
                value, at, since = decayed.get(adapter_id, (0.0, now, now))
                value = value * math.exp(-(now - at) / RATE_WINDOW_S) + n
                decayed[adapter_id] = (value, now, since)
                touched.add(adapter_id)
            for adapter_id in engine.take_busy():
                self._busy_at[adapter_id] = now
        self._widen(now, touched)
        return bool(touched)

    def _widen(self, now: float, touched: set[str]) -> None:
        if self.widen_rate <= 0:
            self.widened = frozenset()
            return
        self._busy_at = {a: t for a, t in self._busy_at.items() if now - t < BUSY_KEEP_S}
        self._asked_at = {a: t for a, t in self._asked_at.items() if now - t < WIDEN_ASK_KEEP_S}
        hot = set(self._busy_at) | set(self._asked_at)
        for adapter_id in touched | self.widened:
            rate = self.rate(adapter_id, now)
            keep = adapter_id in self.widened and rate >= self.widen_rate / 2
            if rate >= self.widen_rate or keep:
                hot.add(adapter_id)
        if hot != self.widened:
            self.widened = frozenset(hot)
        if now - self._forgot_at >= RATE_WINDOW_S:
            self._forgot_at = now
            self._decayed = {
                a: v for a, v in self._decayed.items() if self.rate(a, now) >= _FORGET_RATE
            }
