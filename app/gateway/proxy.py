"""One OpenAI call through the gateway: route -> adapter (sticky canary) -> engine -> log.

Clients call `POST /v1/chat/completions` or `/v1/completions` with `model` = a route name
(or the `X-Cft-Route` header), or a fine-tuned model's name (`app/gateway/finetuned.py`), and
`user` = their user id (or `X-Cft-User`). The router picks the
adapter with the same rule as `serve.assign_adapter`, rewrites `model` to that adapter's engine
name, proxies the call (streaming or not), answers with `X-Request-Id`, and queues the log
record for the batched writer, off the client's latency path.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import psycopg
from fastapi import Request, Response

from app.core.auth import ApiKey
from app.core.deps import get_pool
from app.core.errors import BadRequest, DatabaseUnavailable, NotFound, Unavailable
from app.core.metrics import FIRST_TOKEN_COLD, ROUTER_REQUESTS, ROUTING_DECISIONS, child
from app.gateway import finetuned
from app.gateway import request as call
from app.gateway.assign import Assignment, RouteState
from app.gateway.logsink import TENANT_KEY
from app.gateway.logwriter import LogWriter
from app.gateway.pool import ENGINE_ERRORS
from app.gateway.relay import Stream, engine_error, relay
from app.gateway.service import RouterRuntime
from app.gateway.upstream import Sent, engine_unavailable, send
from app.logs.validation import InvalidRecord, check_call

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


async def proxy(request: Request, key: ApiKey, kind: str) -> Response:
    """Proxy one OpenAI call for the caller's tenant."""
    runtime = call.get_runtime_or_raise(request)
    body = call.parse_body(await request.body())
    call.check_fields(body, kind)
    route_name = call.route_name(request, body)
    user = call.user(request, body)
    if finetuned.is_finetuned(route_name):
        state, assignment = await runtime.finetuned.resolve(get_pool(request), key, route_name)
    else:
        state = await _route_state(runtime, route_name, key)
        assignment = state.assign(runtime.user_key(user) if user else "")
    messages = _messages(body, kind)
    try:
        check_call(messages, user)
    except InvalidRecord as exc:
        raise BadRequest(str(exc), param=exc.param) from exc
    request_id = call.request_id(request)
    stream = bool(body.get("stream"))
    record: dict[str, Any] = {
        TENANT_KEY: key.tenant_id,
        "request_id": request_id,
        "route": state.name,
        "model": state.base_model,
        "messages": messages,
        "user": user,
    }
    upstream_body = _upstream_body(body, stream)
    sent = await _send_or_log(
        runtime, state, assignment, upstream_body, PATHS[kind], stream, record
    )
    headers = _decide(state, assignment, sent, record, request_id)
    if not stream:
        return await _whole(sent, kind, route_name, headers, record, runtime.writer)
    return await _streamed(sent, kind, route_name, headers, record, runtime.writer)


async def _route_state(runtime: RouterRuntime, route_name: str, key: ApiKey) -> RouteState:
    """The route's serving state (cached; read when stale), 404 unless it is the tenant's."""
    fresh, state = runtime.table.lookup(key.tenant_id, route_name)
    if not fresh:
        try:
            state = await asyncio.to_thread(runtime.table.get, key.tenant_id, route_name)
        except psycopg.Error as exc:
            raise DatabaseUnavailable("the route table is unavailable") from exc
    if state is None or state.tenant_id != key.tenant_id:
        raise NotFound(f"no route named {route_name!r} for this tenant")
    return state


def _messages(body: dict[str, Any], kind: str) -> list[Any]:
    """The call's messages as logged (a completion's prompt becomes one user message)."""
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("`messages` must be a non-empty list of chat messages")
        return messages
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise BadRequest("`prompt` must be a string")
    return [{"role": "user", "content": prompt}]


def _upstream_body(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """The body the engine gets: without `user`; a stream asks for its usage."""
    upstream = dict(body)
    upstream.pop("user", None)
    if stream:
        upstream["stream_options"] = {"include_usage": True}
    return upstream


async def _send_or_log(
    runtime: RouterRuntime,
    state: RouteState,
    assignment: Assignment,
    body: dict[str, Any],
    path: str,
    stream: bool,
    record: dict[str, Any],
) -> Sent:
    """Send upstream; when no engine answers, log the failed call and re-raise its 503."""
    try:
        return await send(runtime, state, assignment, body, path, stream)
    except Unavailable as exc:
        record |= {"status": "error", "completion": None, "adapter_id": assignment.adapter_id}
        runtime.writer.submit(record)
        child(ROUTER_REQUESTS, "lora" if assignment.adapter_id else "base", "error").inc()
        exc.headers["X-Request-Id"] = record["request_id"]
        raise


def _decide(
    state: RouteState, assignment: Assignment, sent: Sent, record: dict[str, Any], request_id: str
) -> dict[str, str]:
    """Count the routing decision, note it in the log record; the response's headers."""
    # A call that fell back did not get its arm's model: it belongs to no arm of the experiment.
    variant = assignment.variant if sent.fallback is None else None
    child(ROUTING_DECISIONS, "fallback" if sent.fallback else (variant or "base")).inc()
    record |= {
        "adapter_id": sent.model,
        "experiment": assignment.experiment if state.canaries else None,
        "variant": variant if state.canaries else None,
    }
    headers = {"X-Request-Id": request_id, "X-Cft-Adapter": sent.model}
    if variant:
        headers["X-Cft-Variant"] = variant
    if sent.fallback:
        headers["X-Cft-Fallback"] = sent.fallback
    return headers


async def _whole(
    sent: Sent,
    kind: str,
    route_name: str,
    headers: dict[str, str],
    record: dict[str, Any],
    writer: LogWriter,
) -> Response:
    """Answer a non-streamed call with the engine's body (`model` set to the route)."""
    upstream = sent.response
    try:
        raw = await upstream.read()
    except ENGINE_ERRORS as exc:
        record |= {"status": "error", "completion": None}
        writer.submit(record)
        raise engine_unavailable(f"the inference engine failed: {exc!r}", headers) from exc
    finally:
        upstream.finish()
    try:
        data = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        data = {
            "error": {
                "message": raw[:500].decode(errors="replace"),
                "type": "engine_error",
                "code": "engine_error",
            }
        }
    if upstream.status == 200 and isinstance(data, dict):
        record |= _completion_fields(data, kind)
        now = time.perf_counter()
        record["ttft_ms"] = int((now - sent.started) * 1000)
        if sent.cold_since is not None:
            FIRST_TOKEN_COLD.observe(now - sent.cold_since)
        record["status"] = "ok"
        data["model"] = route_name
    else:
        record["status"] = "error"
    child(ROUTER_REQUESTS, sent.kind, record["status"]).inc()
    writer.submit(record)
    return Response(orjson.dumps(data), upstream.status, headers, "application/json")


async def _streamed(
    sent: Sent,
    kind: str,
    route_name: str,
    headers: dict[str, str],
    record: dict[str, Any],
    writer: LogWriter,
) -> Response:
    """Answer a streamed call: the relayed events, or the engine's error as a whole body."""
    upstream = sent.response
    if upstream.status != 200:
        try:
            payload = await upstream.read()
        except ENGINE_ERRORS as exc:
            payload = orjson.dumps(engine_error(f"the inference engine failed: {exc!r}"))
        finally:
            upstream.finish()
        record |= {"status": "error", "completion": None}
        child(ROUTER_REQUESTS, sent.kind, "error").inc()
        writer.submit(record)
        return Response(payload, upstream.status, headers, "application/json")
    events = relay(
        upstream,
        kind=kind,
        route_name=route_name,
        answered=sent.kind,
        started=sent.started,
        cold_since=sent.cold_since,
        record=record,
        writer=writer,
    )
    return Stream(events, media_type="text/event-stream", headers=headers)


def _completion_fields(data: dict[str, Any], kind: str) -> dict[str, Any]:
    choice = (data.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") if kind == "chat" else choice.get("text")
    usage = data.get("usage") or {}
    return {
        "completion": text,
        "tokens_in": usage.get("prompt_tokens"),
        "tokens_out": usage.get("completion_tokens"),
    }
