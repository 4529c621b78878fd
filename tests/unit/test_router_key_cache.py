"""The router's API-key cache: fresh for key_ttl, then served while one background re-check
runs (stale-while-revalidate); a revoked key is dropped when its re-check returns."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.auth import ApiKey, hash_key
from app.gateway import service
from app.gateway.service import RouterRuntime

KEY = ApiKey(id=1, tenant_id=7, role="client", prefix="cft_abc")
TOKEN = "cft_secret-token"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(service.time, "monotonic", c)
    return c


def runtime(ttl: float = 5.0) -> RouterRuntime:
    none: Any = None
    return RouterRuntime(none, none, none, b"s" * 32, key_ttl=ttl)


def test_unknown_key_is_a_miss(clock: Clock) -> None:
    assert runtime().cached_key(TOKEN) == (hash_key(TOKEN), None, False)


def test_fresh_key_is_served_without_a_recheck(clock: Clock) -> None:
    rt = runtime()
    rt.remember_key(hash_key(TOKEN), KEY)
    clock.now += 4.9
    assert rt.cached_key(TOKEN) == (hash_key(TOKEN), KEY, False)


def test_expired_key_is_served_while_exactly_one_recheck_runs(clock: Clock) -> None:
    rt = runtime()
    digest = hash_key(TOKEN)
    rt.remember_key(digest, KEY)
    clock.now += 5.1
    assert rt.cached_key(TOKEN) == (digest, KEY, True)  # this caller starts the re-check
    assert rt.cached_key(TOKEN) == (digest, KEY, False)  # the others are served meanwhile
    rt.key_checked(digest, KEY)  # still live: fresh for another ttl
    clock.now += 4.9
    assert rt.cached_key(TOKEN) == (digest, KEY, False)


def test_revoked_key_stops_when_its_recheck_returns(clock: Clock) -> None:
    rt = runtime()
    digest = hash_key(TOKEN)
    rt.remember_key(digest, KEY)
    clock.now += 5.1
    assert rt.cached_key(TOKEN)[2] is True
    rt.key_checked(digest, None)  # the lookup found it revoked
    assert rt.cached_key(TOKEN) == (digest, None, False)  # the next call looks it up: 401
    assert rt.stale_key(digest) is None


def test_key_unused_for_two_ttls_is_looked_up_on_the_call(clock: Clock) -> None:
    rt = runtime()
    digest = hash_key(TOKEN)
    rt.remember_key(digest, KEY)
    clock.now += 10.0
    assert rt.cached_key(TOKEN) == (digest, None, False)
    assert rt.stale_key(digest) == KEY  # still there for when PostgreSQL is down


def test_failed_recheck_keeps_the_key_and_waits_a_second(clock: Clock) -> None:
    rt = runtime()
    digest = hash_key(TOKEN)
    rt.remember_key(digest, KEY)
    clock.now += 5.1
    assert rt.cached_key(TOKEN)[2] is True
    rt.key_checked(digest, None, failed=True)  # PostgreSQL unavailable
    assert rt.cached_key(TOKEN) == (digest, KEY, False)
    clock.now += 1.0
    assert rt.cached_key(TOKEN) == (digest, KEY, True)
