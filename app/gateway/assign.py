"""The sticky canary split, computed exactly as `serve.assign_adapter` does in SQL.

A user's bucket in [0, 10000) is the first 32 bits of md5("<experiment>:<user_key>") modulo
10000. Canaries of a route take consecutive bucket ranges (ordered by created_at, id) sized by
traffic_pct in hundredths of a percent; every other bucket goes to the route's prod adapter.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

BUCKETS = 10_000


def bucket(experiment: str, user_key: str) -> int:
    """The user's bucket for an experiment (same as serve.bucket)."""
    digest = hashlib.md5(f"{experiment}:{user_key}".encode(), usedforsecurity=False).hexdigest()
    return int(digest[:8], 16) % BUCKETS


@dataclass(frozen=True)
class Canary:
    """One canary adapter and its share of traffic."""

    adapter_id: str
    traffic_pct: Decimal
    created_at: datetime


@dataclass(frozen=True)
class Assignment:
    """What a user gets: the adapter, the experiment and the variant letter ('A' = prod)."""

    adapter_id: str | None
    experiment: str
    variant: str | None


@dataclass
class RouteState:
    """A route's serving state, as read from serve.route and serve.adapter."""

    name: str
    tenant_id: int
    base_model: str
    experiment: str | None
    prod: str | None
    canaries: list[Canary] = field(default_factory=list)
    # When the assigned adapter cannot answer: 'none' (a 503 that says so), 'prod' (the
    # route's prod), 'base' (prod, then the base model). serve.route.fallback.
    fallback: str = "none"

    def assign(self, user_key: str) -> Assignment:
        """The adapter this user gets now."""
        experiment = self.experiment or self.name
        active = [c for c in self.canaries if c.traffic_pct > 0]
        if not active:
            return Assignment(self.prod, experiment, "A" if self.prod else None)
        b = bucket(experiment, user_key)
        upper = 0
        for i, canary in enumerate(active):
            upper += int(canary.traffic_pct * 100)
            if b < upper:
                return Assignment(canary.adapter_id, experiment, chr(ord("B") + i))
        # The control arm is whatever everyone else gets: prod, or the bare base without one.
        return Assignment(self.prod, experiment, "A")
