"""Which adapters the reconciler widens: by call rate (with hysteresis), a 429, another
reconciler's ask; and the router's order for a widened adapter (turn about, least busy)."""

from __future__ import annotations

import pytest

from app.engines.state import EngineState
from app.gateway.pool import EnginePool
from workers.reconciler import traffic as traffic_mod
from workers.reconciler.traffic import BUSY_KEEP_S, RATE_WINDOW_S, Traffic


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(traffic_mod.time, "monotonic", lambda: now[0])
    return now


def calls(engine: EngineState, adapter: str, n: int) -> None:
    for _ in range(n):
        engine.count_call(adapter)


def test_an_adapter_is_widened_by_its_call_rate_and_narrowed_below_half(
    clock: list[float],
) -> None:
    engine = EngineState("http://e0")
    seen = Traffic(widen_rate=1.0)
    # 5 s passes of 10 calls (2 calls/s) for "hot", 1 call for "cold".
    for _ in range(12):
        calls(engine, "hot", 10)
        calls(engine, "cold", 1)
        clock[0] += 5.0
        assert seen.take([engine])
    assert seen.rate("hot") == pytest.approx(2.0, rel=0.25)
    assert seen.widened == frozenset({"hot"})
    assert seen.calls["hot"] == 120 and seen.calls["cold"] == 12
    # 0.7 calls/s: below the rate, above half of it: still widened.
    for _ in range(24):
        calls(engine, "hot", 3)
        clock[0] += 4.0
        seen.take([engine])
    assert seen.widened == frozenset({"hot"})
    # Silence: the rate decays below half, and it is narrowed.
    clock[0] += RATE_WINDOW_S * 2
    assert not seen.take([engine])
    assert seen.widened == frozenset()


def test_a_429_or_an_ask_widens_an_adapter_for_a_while(clock: list[float]) -> None:
    engine = EngineState("http://e0")
    seen = Traffic(widen_rate=5.0)
    engine.note_busy("busy")
    seen.ask("asked")
    seen.take([engine])
    assert seen.widened == frozenset({"busy", "asked"})
    clock[0] += BUSY_KEEP_S + 1
    seen.take([engine])
    assert seen.widened == frozenset()
    # 0 turns widening off.
    off = Traffic(widen_rate=0.0)
    engine.note_busy("busy")
    off.take([engine])
    assert off.widened == frozenset()


def test_a_widened_adapter_goes_to_its_first_two_engines_turn_about_least_busy_first() -> None:
    pool = EnginePool(["http://a:1", "http://b:1", "http://c:1"])
    for engine in pool.engines:
        engine.models = {"x"}
    plain = [pool.order("x", adapter=True)[0].url for _ in range(4)]
    assert len(set(plain)) == 1  # not widened: always its first engine
    first, second, third = pool.order("x", adapter=True)
    third.models = set()  # held by its first two, as the reconciler widens it
    firsts = [pool.order("x", adapter=True, spread=True)[0] for _ in range(4)]
    assert firsts == [first, second, first, second] or firsts == [second, first, second, first]
    first.inflight = 3
    assert pool.order("x", adapter=True, spread=True)[0] is second  # the less busy one
    first.inflight = 0
    # Only its first holds it (the second's load not in yet): that one, every call.
    second.models = set()
    assert {pool.order("x", adapter=True, spread=True)[0].url for _ in range(4)} == {first.url}
