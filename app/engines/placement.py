"""Which engine holds which adapter: one rendezvous order, shared by the router (which engine
a call goes to first) and the reconciler (which engine loads it), and the hot set each engine
loads ahead within its capacity.

Each adapter goes to the first engine of its rendezvous order among the engines that are up
and serve its base, so each engine's cache holds a stable share of the adapters, and adding
or removing an engine moves only the adapters whose first engine it is. A widened adapter
(hot: its calls come faster than CFT_ENGINE_WIDEN_RATE, or its engine answered 429) goes to
the next engine of its order too, within that engine's capacity like the rest of its share,
and the router spreads its calls over both. An engine loads ahead
only its share's hottest adapters, up to its capacity: canaries first (they are new, and the
experiment needs them answering), then prods by recent calls, then each route's previous prod
(kept for an instant rollback). The rest is loaded on the first call that needs it (the router
asks the reconciler for it) or, for a kind that loads on first use, read by the engine then.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from app.engines.kinds import kind_of
from app.engines.state import EngineState

# The hot set's classes, in the order they are loaded ahead.
CANARY, PROD, PREVIOUS = 0, 1, 2


def affinity(url: str, model: str) -> int:
    """The rendezvous score of an engine for a model: the engine with the highest serves it
    first."""
    digest = hashlib.blake2b(f"{url}\0{model}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(frozen=True, slots=True)
class Candidate:
    """An adapter the fleet serves: its id, base, and class (CANARY, PROD or PREVIOUS)."""

    id: str
    base_model: str
    rank: int


@dataclass
class Share:
    """One engine's share: the adapters it should load ahead, hottest first, and which of
    them to pin (where the kind pins)."""

    ahead: list[str]
    pinned: set[str]


class Placement:
    """Rendezvous orders of the engines, remembered per adapter (each is hashed once)."""

    def __init__(self, engines: Sequence[EngineState]):
        self.engines = list(engines)
        self._orders: dict[str, tuple[EngineState, ...]] = {}

    def order(self, model: str) -> tuple[EngineState, ...]:
        """Every engine, in the model's rendezvous order (whatever their state)."""
        found = self._orders.get(model)
        if found is None:
            found = tuple(sorted(self.engines, key=lambda e: -affinity(e.url, model)))
            if len(self._orders) > 200_000:  # retired adapters' orders: drop them all
                self._orders.clear()
            self._orders[model] = found
        return found

    def home(self, model: str, base_model: str, up: set[str]) -> EngineState | None:
        """The engine that holds `model`: the first of its order that is up (URL in `up`) and
        serves `base_model`; None when no engine does."""
        for engine in self.order(model):
            if engine.url in up and engine.serves_base(base_model):
                return engine
        return None

    def holders(
        self, model: str, base_model: str, up: set[str], *, widened: bool = False
    ) -> list[EngineState]:
        """The engines that hold `model`: its home, and for a widened adapter the next engine
        of its order that is up and serves `base_model` too (where there is one)."""
        out: list[EngineState] = []
        want = 2 if widened else 1
        for engine in self.order(model):
            if engine.url in up and engine.serves_base(base_model):
                out.append(engine)
                if len(out) == want:
                    break
        return out

    def shares(
        self, candidates: Iterable[Candidate], up: set[str], calls: Mapping[str, float]
    ) -> dict[str, Share]:
        """Each up engine's share, by URL: the adapters it is home to, hottest first, cut at
        its capacity; on a kind that pins, its hottest prods up to its pin limit are pinned."""
        homes: dict[str, list[Candidate]] = {url: [] for url in up}
        for cand in candidates:
            engine = self.home(cand.id, cand.base_model, up)
            if engine is not None:
                homes[engine.url].append(cand)
        by_url = {e.url: e for e in self.engines}
        out: dict[str, Share] = {}
        for url, mine in homes.items():
            engine = by_url[url]
            mine.sort(key=lambda c: (c.rank, -calls.get(c.id, 0.0), c.id))
            ahead = mine if engine.capacity is None else mine[: engine.capacity]
            pinned: set[str] = set()
            if kind_of(engine.kind).pins and engine.pin_limit > 0:
                prods = (c.id for c in ahead if c.rank == PROD)
                for adapter_id in prods:
                    if len(pinned) >= engine.pin_limit:
                        break
                    pinned.add(adapter_id)
            out[url] = Share([c.id for c in ahead], pinned)
        return out

    def widen(
        self,
        shares: Mapping[str, Share],
        widened: Iterable[Candidate],
        up: set[str],
        calls: Mapping[str, float],
    ) -> dict[str, Share]:
        """`shares` with each widened adapter on its second engine too: first in that engine's
        share (the hottest first), which is cut at its capacity again; never pinned there.
        Costs what the widened adapters do, not the whole fleet (their set changes often)."""
        extra: dict[str, list[Candidate]] = {}
        for cand in widened:
            held = self.holders(cand.id, cand.base_model, up, widened=True)
            if len(held) == 2:
                extra.setdefault(held[1].url, []).append(cand)
        if not extra:
            return dict(shares)
        by_url = {e.url: e for e in self.engines}
        out = dict(shares)
        for url, cands in extra.items():
            cands.sort(key=lambda c: (-calls.get(c.id, 0.0), c.id))
            first = [c.id for c in cands]
            share = shares.get(url, Share([], set()))
            taken = set(first)
            ahead = first + [a for a in share.ahead if a not in taken]
            capacity = by_url[url].capacity
            if capacity is not None:
                ahead = ahead[:capacity]
            out[url] = Share(ahead, share.pinned & set(ahead))
        return out
