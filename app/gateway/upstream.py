"""Sending a call upstream: pick the engine and model, fail over, fall back, give back."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson

from app.core.errors import TooManyRequests, Unavailable
from app.core.metrics import (
    ADAPTER_LOOKUPS,
    ENGINE_FAILURES,
    LOAD_WAIT,
    ROUTER_FALLBACKS,
    ROUTER_LATENCY,
    ROUTER_REQUESTS,
    child,
)
from app.engines.kinds import kind_of
from app.engines.state import EngineState
from app.gateway.assign import Assignment, RouteState
from app.gateway.client import EngineResponse
from app.gateway.pool import ENGINE_ERRORS
from app.gateway.service import RouterRuntime

log = logging.getLogger("cft.gateway.upstream")

RETRY_AFTER = "2"
_HIT = ADAPTER_LOOKUPS.labels("hit")
# How often a call waiting for an adapter's load looks at the engines again.
LOAD_POLL_S = 0.25


@dataclass(frozen=True, slots=True)
class Sent:
    """An engine's answer to a call: what answered, with which model, and why that model."""

    response: EngineResponse
    engine: EngineState
    model: str
    # None when the assigned model served the call, else the fallback reason.
    fallback: str | None
    started: float  # time.perf_counter() when the request went out
    kind: str = "lora"  # what answered: lora (an adapter) or base
    # time.perf_counter() when the call began to wait for its adapter's load (a cold start:
    # the router waited for the reconciler's load, or the engine did not hold it and loads
    # it for this call); None when it was held.
    cold_since: float | None = None


def engine_unavailable(message: str, headers: dict[str, str] | None = None) -> Unavailable:
    """The 503 for a call no engine could serve (the client retries after RETRY_AFTER)."""
    return Unavailable(
        message,
        code="engine_unavailable",
        headers=(headers or {}) | {"Retry-After": RETRY_AFTER},
    )


def _models(
    state: RouteState, assignment: Assignment, bases: frozenset[str]
) -> list[tuple[str, bool]]:
    """(model, is it a fallback) to try, in order: the assigned model, then what the route's
    fallback policy allows (prod for 'prod'; prod, then the base, for 'base').

    Only the route's own adapters (serve.route_state reads them by route) and a base the
    platform serves are ever sent: a route's base_model is never passed through unchecked,
    so it cannot name another tenant's adapter loaded on the same engine.
    """
    want = assignment.adapter_id or state.base_model
    out = [(want, False)]
    if assignment.adapter_id is not None and state.fallback in ("prod", "base"):
        if state.prod and state.prod != want:
            out.append((state.prod, True))
        if state.fallback == "base" and state.base_model in bases:
            out.append((state.base_model, True))
    return out


async def _loaded_somewhere(runtime: RouterRuntime, model: str, base: str) -> float | None:
    """None once an engine that is up and serves `base` may be sent `model` (at once: a cache
    hit); else waits up to CFT_ROUTER_LOAD_WAIT for its load, asking the reconciler for it,
    and returns when the wait began (time.perf_counter()) once it is there, or raises
    NotLoaded when it never came."""
    engines = runtime.engines

    def listed() -> bool:
        return any(e.up and e.has(model) and e.serves_base(base) for e in engines.engines)

    if listed():
        _HIT.inc()
        return None
    if any(e.models is None for e in engines.engines):
        await engines.refresh()
        if listed():
            _HIT.inc()
            return None
    began = time.perf_counter()
    reconciler = runtime.reconciler
    if reconciler is not None:
        reconciler.want(model)
    started = time.monotonic()
    deadline = started + runtime.load_wait
    found = False
    # A reconciler leading in this process adds what it loads to the engines' lists itself:
    # look often, probe nothing. One elsewhere is seen only through the engines' own lists.
    here = reconciler is not None and reconciler.leader
    poll = LOAD_POLL_S / 5 if here else LOAD_POLL_S
    while not found and time.monotonic() < deadline:
        await asyncio.sleep(min(poll, max(0.0, deadline - time.monotonic())))
        if not here:
            await engines.refresh()
        found = listed()
    LOAD_WAIT.observe(time.monotonic() - started)
    ADAPTER_LOOKUPS.labels("loaded" if found else "missing").inc()
    if not found:
        raise NotLoaded
    return began


class NotLoaded(Exception):
    """No engine had the adapter within CFT_ROUTER_LOAD_WAIT."""


def adapter_not_loaded(state: RouteState, model: str, why: str) -> Unavailable:
    """The 503 for an adapter the fleet cannot serve now, when the route allows no fallback."""
    return Unavailable(
        f"adapter {model!r} of route {state.name!r} {why}; the route's fallback policy is"
        f" {state.fallback!r}, so no other model answers in its place: retry shortly",
        code="adapter_not_loaded",
        headers={"Retry-After": RETRY_AFTER},
    )


async def _adapter_failed(
    runtime: RouterRuntime,
    engine: EngineState,
    state: RouteState,
    model: str,
    resp: EngineResponse,
) -> None:
    """Note an adapter that answered 404 or 5xx: drop it from the engine's list, reconcile."""
    try:
        detail = (await resp.read())[:300]
    except ENGINE_ERRORS as exc:
        detail = repr(exc).encode()
    finally:
        resp.finish()
    child(ROUTER_REQUESTS, "lora", "error").inc()
    log.warning(
        "adapter %s failed on %s (%s %s): trying the next engine",
        model,
        engine.url,
        resp.status,
        detail,
    )
    if resp.status < 500:
        engine.forget(model)  # the engine says it does not hold it (restarted, refused)
    if runtime.reconciler is not None:
        runtime.reconciler.want(model)


async def _refused(engine: EngineState, resp: EngineResponse) -> bool:
    """True when the engine's answer says the adapter is not available there (by its kind)."""
    if resp.status in (200, 201):
        return False
    kind = kind_of(engine.kind)
    if kind.adapter_refused(resp.status, b""):
        return True  # the status says it: no body to wait for
    try:
        body = await resp.read()  # an error body, never a stream; kept for _adapter_failed
    except ENGINE_ERRORS:
        return True
    return kind.adapter_refused(resp.status, body)


async def send(
    runtime: RouterRuntime,
    state: RouteState,
    assignment: Assignment,
    body: dict[str, Any],
    path: str,
    stream: bool,
) -> Sent:
    """Send to the first engine that answers with the assigned model; another model only as
    the route's fallback policy allows; 503 when nothing may answer.

    An adapter goes to its engines in rendezvous order (EnginePool.order), among those serving
    the route's base (a widened one to the less busy of its first two); an engine that refuses
    it (404, or its kind's "not loaded") or answers 429 passes the call to the next engine that
    lists it before any fallback (a 429 also widens the adapter). An adapter no
    engine lists yet, or that every engine listing it lost, is asked of the reconciler and
    waited for (CFT_ROUTER_LOAD_WAIT)."""
    engines = runtime.engines
    want = assignment.adapter_id or state.base_model
    if want == state.base_model and state.base_model not in runtime.bases:
        raise Unavailable(
            f"route {state.name!r} names base model {state.base_model!r}, which this platform"
            f" does not serve (CFT_BASE_MODELS: {', '.join(sorted(runtime.bases))}); an operator"
            " must serve it or the route be recreated on a served base",
            code="base_model_not_served",
        )
    missing = False
    waited: float | None = None
    if assignment.adapter_id is not None:
        try:
            waited = await _loaded_somewhere(runtime, assignment.adapter_id, state.base_model)
        except NotLoaded:
            missing = True
    failed_adapter = False
    busy = False  # an engine answered 429: the call goes on to the next
    reached = False
    for model, fallback in _models(state, assignment, runtime.bases):
        is_adapter = model != state.base_model
        if model == want and missing:
            continue
        # The assigned adapter gets a second round when every engine that listed it said it
        # does not hold it (restarted): after waiting for the reconciler to load it again.
        rounds = 2 if is_adapter and model == want else 1
        reconciler = runtime.reconciler
        spread = is_adapter and reconciler is not None and model in reconciler.widened
        for round_ in range(rounds):
            lost = False
            order = engines.order(model, adapter=is_adapter, base=state.base_model, spread=spread)
            for engine in order:
                if engine.models is None and not await engines.probe(engine):
                    ENGINE_FAILURES.labels(engine.url, "probe").inc()
                    continue
                if not engine.up and reached:
                    continue
                if is_adapter and not engine.has(model):
                    continue  # never route to an adapter the engine does not list
                # The engine's kind names the model (SGLang base:adapter, LoRAX its path).
                body.pop("adapter_source", None)
                body |= kind_of(engine.kind).model_fields(
                    model, base_model=state.base_model, adapter_path=engine.adapter_paths.get(model)
                )
                started = time.perf_counter()
                cold = waited if model == want else None
                if is_adapter:
                    engine.count_call(model)
                    resident = engine.resident
                    if resident is not None and model not in resident:
                        cold = cold or started  # the engine loads it for this call
                        resident.add(model)
                try:
                    resp = await engines.post(engine, path, orjson.dumps(body), stream=stream)
                except ENGINE_ERRORS as exc:
                    engine.mark_down()
                    ENGINE_FAILURES.labels(engine.url, type(exc).__name__).inc()
                    log.warning("engine %s failed (%r): trying the next one", engine.url, exc)
                    continue
                reached = True
                child(ROUTER_LATENCY, "lora" if is_adapter else "base").observe(
                    time.perf_counter() - started
                )
                if is_adapter and await _refused(engine, resp):
                    lost = lost or resp.status < 500
                    await _adapter_failed(runtime, engine, state, model, resp)
                    failed_adapter = True
                    continue
                why = None
                if fallback:
                    why = "adapter_error" if failed_adapter else "not_loaded"
                if resp.status == 429:
                    resp.finish()
                    busy = True  # another engine may take it
                    if is_adapter:
                        engine.note_busy(model)  # the reconciler widens it
                    continue
                if why is not None:
                    child(ROUTER_FALLBACKS, why).inc()
                kind = "lora" if is_adapter else "base"
                return Sent(resp, engine, model, why, started, kind, cold if is_adapter else None)
            if round_ + 1 == rounds or not lost or busy:
                break
            try:
                waited = await _loaded_somewhere(runtime, model, state.base_model)
            except NotLoaded:
                break
            waited = waited or time.perf_counter()
        if busy:
            raise TooManyRequests(
                f"every engine serving {model!r} is busy (429); retry shortly",
                code="engine_busy",
                headers={"Retry-After": RETRY_AFTER},
            )
    if assignment.adapter_id is not None and (missing or failed_adapter):
        why = (
            "failed on every engine that has it"
            if failed_adapter
            else (f"is not loaded on any engine (waited {runtime.load_wait:g} s for its load)")
        )
        raise adapter_not_loaded(state, assignment.adapter_id, why)
    raise engine_unavailable("no inference engine is reachable; retry shortly")
