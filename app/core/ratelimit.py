"""Request rates per API key, per tenant, and of failed key checks per client address.

Token buckets in the process (each API replica limits on its own: a fleet of N replicas admits
up to N times the rate). A call over a rate is a 429 with Retry-After; a key that is unknown or
revoked is remembered for a few seconds, so repeating it costs no database lookup.
"""

from __future__ import annotations

import math
import threading
import time

from app.core.errors import TooManyRequests

# Buckets kept before the table is cleared (an attacker rotating addresses cannot grow it).
MAX_BUCKETS = 100_000


class Buckets:
    """Token buckets of `rate` per second holding up to `burst` tokens, by name."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        self._state: dict[object, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, name: object) -> float:
        """Take one token: 0.0 when there was one, else the seconds until there is."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        with self._lock:
            tokens, at = self._state.get(name, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                if len(self._state) >= MAX_BUCKETS:
                    self._state.clear()
                self._state[name] = (tokens - 1.0, now)
                return 0.0
            self._state[name] = (tokens, now)
            return (1.0 - tokens) / self.rate


def _refuse(wait: float, what: str) -> TooManyRequests:
    seconds = max(1, math.ceil(wait))
    return TooManyRequests(
        f"too many requests {what}: retry after {seconds} s", headers={"Retry-After": str(seconds)}
    )


class RateLimits:
    """The limits one API process applies (CFT_RATE_LIMIT_* settings; 0 turns one off)."""

    def __init__(
        self, *, per_key: float, per_tenant: float, auth_failures: float, bad_key_ttl: float = 5.0
    ) -> None:
        self.keys = Buckets(per_key, per_key * 2)
        self.tenants = Buckets(per_tenant, per_tenant * 2)
        self.failures = Buckets(auth_failures, auth_failures * 2)
        self.bad_key_ttl = bad_key_ttl
        self._bad: dict[bytes, float] = {}
        self._lock = threading.Lock()

    def admit(self, key_id: int, tenant_id: int | None) -> None:
        """429 when the key or its tenant is over its rate."""
        wait = self.keys.take(key_id)
        if wait:
            raise _refuse(wait, "for this API key")
        if tenant_id is not None:
            wait = self.tenants.take(tenant_id)
            if wait:
                raise _refuse(wait, "for this tenant")

    def known_bad(self, digest: bytes) -> bool:
        """Whether this key hash was found unknown or revoked in the last few seconds."""
        with self._lock:
            until = self._bad.get(digest)
            return until is not None and until > time.monotonic()

    def failed(self, digest: bytes, client: str | None) -> None:
        """Remember a bad key; 429 when its client address fails too often."""
        with self._lock:
            if len(self._bad) >= MAX_BUCKETS:
                self._bad.clear()
            self._bad[digest] = time.monotonic() + self.bad_key_ttl
        wait = self.failures.take(client or "?")
        if wait:
            raise _refuse(wait, "with invalid API keys from this address")
