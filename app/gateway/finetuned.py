"""Fine-tuned models called by name: `model` = `ft:<base>:<tenant>:<suffix>:<id>`.

A fine-tuning job's adapter (app/finetuning) answers to the job's model name, for the keys of
its tenant only, as OpenAI's fine-tuned models do; another tenant's key gets the 404 an unknown
model gets. It is a candidate of its route, so no canary split and no fallback apply: the call
goes to that adapter. The reconciler loads canaries and prods ahead; a fine-tuned model is
loaded on demand: the router records that it was asked for (serve.demand_adapter, at most once
a minute per adapter while it is called), which wakes the reconcilers, and waits for the load
like any call for an adapter no engine has yet (CFT_ROUTER_LOAD_WAIT). It stays loaded
CFT_ROUTER_DEMAND_TTL seconds after its last call. Calls are logged on the adapter's route.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import psycopg

from app.core.auth import ApiKey
from app.core.db import Pool
from app.core.errors import DatabaseUnavailable, NotFound
from app.gateway.assign import Assignment, RouteState

PREFIX = "ft:"
# How often a router renews the demand of an adapter it is being called for.
DEMAND_EVERY_S = 60.0

_LOOKUP = (
    "SELECT j.tenant_id, a.id AS adapter_id, a.route, a.base_model"
    " FROM train.fine_tuning_job j"
    " JOIN train.training_run r ON r.id = j.training_run_id AND r.status = 'succeeded'"
    " JOIN serve.adapter a ON a.id = r.adapter_id"
    " WHERE j.fine_tuned_model = %s AND a.status IN ('candidate', 'canary', 'prod')"
    " AND a.tainted_at IS NULL"
)


def is_finetuned(name: str) -> bool:
    """True when a call's model names a fine-tuned model rather than a route."""
    return name.startswith(PREFIX)


@dataclass(frozen=True)
class FineTuned:
    """What a fine-tuned model's name stands for."""

    tenant_id: int
    adapter_id: str
    route: str
    base_model: str


class FineTunedModels:
    """Names looked up (cached for ttl seconds, unknown ones too) and their demand renewed."""

    def __init__(self, *, ttl: float, demand_ttl: float) -> None:
        self.ttl = ttl
        self.demand_ttl = demand_ttl
        self._cache: dict[str, tuple[float, FineTuned | None]] = {}
        self._asked: dict[str, float] = {}
        self._lock = threading.Lock()

    def _load(self, pool: Pool, name: str) -> FineTuned | None:
        with pool.connection(timeout=2.0) as conn:
            row = conn.execute(_LOOKUP, (name,)).fetchone()
        found = FineTuned(**row) if row else None
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[name] = (time.monotonic() + self.ttl, found)
        return found

    def _demand(self, pool: Pool, adapter_id: str) -> None:
        with pool.connection(timeout=2.0) as conn:
            conn.execute(
                "SELECT serve.demand_adapter(%s, make_interval(secs => %s))",
                (adapter_id, self.demand_ttl),
            )

    def _due(self, adapter_id: str) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._asked.get(adapter_id, -1e9) < DEMAND_EVERY_S:
                return False
            self._asked[adapter_id] = now
            return True

    async def resolve(self, pool: Pool, key: ApiKey, name: str) -> tuple[RouteState, Assignment]:
        """The route state and assignment of a call for a fine-tuned model (404 unless it
        is the caller tenant's), its demand recorded before the call waits for the load."""
        hit = self._cache.get(name)
        try:
            if hit is not None and time.monotonic() < hit[0]:
                found = hit[1]
            else:
                found = await asyncio.to_thread(self._load, pool, name)
            if found is None or found.tenant_id != key.tenant_id:
                raise NotFound(
                    f"the model {name!r} does not exist or you do not have access to it",
                    code="model_not_found",
                    param="model",
                )
            if self._due(found.adapter_id):
                try:
                    await asyncio.to_thread(self._demand, pool, found.adapter_id)
                except BaseException:
                    with self._lock:
                        self._asked.pop(found.adapter_id, None)
                    raise
        except psycopg.Error as exc:
            raise DatabaseUnavailable("the fine-tuned models are unavailable") from exc
        state = RouteState(
            name=found.route,
            tenant_id=found.tenant_id,
            base_model=found.base_model,
            experiment=None,
            prod=None,
        )
        return state, Assignment(found.adapter_id, found.route, None)
