"""Sending a call upstream: pick the engine and model, fail over, fall back, give back."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson

from app.core.errors import Unavailable
from app.core.metrics import (
    ENGINE_FAILURES,
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


@dataclass(frozen=True, slots=True)
class Sent:
    """An engine's answer to a call: what answered, with which model, and why that model."""

    response: EngineResponse
    engine: EngineState
    model: str
    # None when the assigned model served the call, else the fallback reason.
    fallback: str | None
    started: float  # time.perf_counter() when the request went out


def engine_unavailable(message: str, headers: dict[str, str] | None = None) -> Unavailable:
    """The 503 for a call no engine could serve (the client retries after RETRY_AFTER)."""
    return Unavailable(
        message,
        code="engine_unavailable",
        headers=(headers or {}) | {"Retry-After": RETRY_AFTER},
    )


def _candidates(
    engine: EngineState, state: RouteState, assignment: Assignment, bases: frozenset[str]
) -> list[str]:
    """Models to try on an engine, best first: the assigned adapter, prod, the base model.

    Only the route's own adapters (serve.route_state reads them by route) and a base the
    platform serves are ever sent: a route's base_model is never passed through unchecked,
    so it cannot name another tenant's adapter loaded on the same engine.
    """
    out = [m for m in (assignment.adapter_id, state.prod) if m and engine.has(m)]
    if state.base_model in bases:
        out.append(state.base_model)
    return list(dict.fromkeys(out))


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
    child(ROUTER_REQUESTS, str(state.tenant_id), state.name, model, "error").inc()
    log.warning(
        "adapter %s failed on %s (%s %s): falling back", model, engine.url, resp.status, detail
    )
    if resp.status == 404:
        engine.forget(model)
    if runtime.reconciler is not None:
        runtime.reconciler.kick()


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
    """Send to the first engine and model that answer (503 when none does)."""
    engines = runtime.engines
    want = assignment.adapter_id or state.base_model
    if want == state.base_model and state.base_model not in runtime.bases:
        raise Unavailable(
            f"route {state.name!r} names base model {state.base_model!r}, which this platform"
            f" does not serve (CFT_BASE_MODELS: {', '.join(sorted(runtime.bases))}); an operator"
            " must serve it or the route be recreated on a served base",
            code="base_model_not_served",
        )
    failed_adapter = False
    order = engines.order(assignment.adapter_id)
    up = [e for e in order if e.up] or order
    for engine in up:
        if engine.models is None and not await engines.probe(engine):
            ENGINE_FAILURES.labels(engine.url, "probe").inc()
            continue
        for model in _candidates(engine, state, assignment, runtime.bases):
            # The engine's kind decides how a model is named (SGLang base:adapter, LoRAX path).
            body.pop("adapter_source", None)
            body |= kind_of(engine.kind).model_fields(
                model, base_model=state.base_model, adapter_path=engine.adapter_paths.get(model)
            )
            started = time.perf_counter()
            try:
                resp = await engines.post(engine, path, orjson.dumps(body), stream=stream)
            except ENGINE_ERRORS as exc:
                engine.mark_down()
                ENGINE_FAILURES.labels(engine.url, type(exc).__name__).inc()
                log.warning("engine %s failed (%r): trying the next one", engine.url, exc)
                break
            is_adapter = model != state.base_model
            child(ROUTER_LATENCY, "lora" if is_adapter else "base").observe(
                time.perf_counter() - started
            )
            if is_adapter and await _refused(engine, resp):
                await _adapter_failed(runtime, engine, state, model, resp)
                failed_adapter = True
                continue
            why = None
            if model != want:
                why = "adapter_error" if failed_adapter else "not_loaded"
                child(ROUTER_FALLBACKS, why).inc()
            return Sent(resp, engine, model, why, started)
    raise engine_unavailable("no inference engine is reachable; retry shortly")
