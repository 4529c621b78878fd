"""The OpenAI-compatible gateway: route -> adapter (sticky canary), proxy to an engine, log.

Clients call `POST /v1/chat/completions` or `/v1/completions` with `model` = a route name
(or the `X-Cft-Route` header) and `user` = their user id (or `X-Cft-User`). The router picks the
adapter with the same rule as `serve.assign_adapter`, rewrites `model` to that adapter's engine
name, proxies the call (streaming or not), answers with `X-Request-Id`, and queues the log
record for the batched writer, off the client's latency path.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

import aiohttp
import orjson
import psycopg
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute
from psycopg_pool import PoolTimeout
from starlette.types import ASGIApp, Receive, Scope, Send

from app.core.auth import ApiKey, IngestKey, TenantConn, lookup
from app.core.db import Pool
from app.core.errors import BadRequest, Forbidden, NotFound, Unauthorized, Unavailable
from app.core.metrics import (
    ENGINE_FAILURES,
    ROUTER_FALLBACKS,
    ROUTER_LATENCY,
    ROUTER_REQUESTS,
    ROUTING_DECISIONS,
    child,
)
from app.gateway.assign import Assignment, RouteState
from app.gateway.engines import ENGINE_ERRORS, EnginePool, EngineState, Reply

log = logging.getLogger("cft.gateway")

router = APIRouter(tags=["router"])

CLIENT_ROLES = frozenset({"ingest", "client", "admin"})
RETRY_AFTER = "2"
# Background tasks (relays closed after a client went away, key re-checks), kept referenced
# until done.
_tasks: set[asyncio.Task[None]] = set()
# Request headers the gateway reads, found in one pass over the raw list.
_WANTED = frozenset({b"authorization", b"x-cft-route", b"x-cft-user", b"x-request-id"})
_HEADERS_KEY = "cft.headers"


class _RequestIds:
    """Random (version 4) request ids cut from a 4 KiB os.urandom buffer: one system call per
    256 ids instead of one per call (each is a chance for the kernel to preempt the loop)."""

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0
        # A forked child must not replay the parent's buffer.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._buf, self._pos = b"", 0

    def next(self) -> uuid.UUID:
        """A fresh random UUID."""
        if self._pos >= len(self._buf):
            self._buf, self._pos = os.urandom(4096), 0
        raw = self._buf[self._pos : self._pos + 16]
        self._pos += 16
        return uuid.UUID(bytes=raw, version=4)


_ids = _RequestIds()


def _headers(request: Request) -> dict[bytes, bytes]:
    """The gateway's request headers (first value of each), parsed once per request."""
    scope = request.scope
    found: dict[bytes, bytes] | None = scope.get(_HEADERS_KEY)
    if found is None:
        found = {}
        for name, value in scope["headers"]:
            if name in _WANTED and name not in found:
                found[name] = value
        scope[_HEADERS_KEY] = found
    return found


def _header(request: Request, name: bytes) -> str | None:
    value = _headers(request).get(name)
    return value.decode("latin-1") if value is not None else None


def _bearer(request: Request) -> str:
    scheme, _, token = (_header(request, b"authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized(
            "missing API key: send 'Authorization: Bearer <key>' (create one with `cft key create`)"
        )
    return token.strip()


def _lookup_key(pool: Pool, token: str) -> ApiKey | None:
    with pool.connection(timeout=2.0) as conn:
        return lookup(conn, token)


async def _recheck_key(runtime: Any, pool: Pool, token: str, digest: bytes) -> None:
    """Look a cached key up again in the background (its cache entry expired)."""
    key: ApiKey | None = None
    failed = True
    try:
        key = await asyncio.to_thread(_lookup_key, pool, token)
        failed = False
    except (PoolTimeout, psycopg.OperationalError):
        log.warning("API key re-check failed: the database is unavailable")
    finally:
        runtime.key_checked(digest, key, failed=failed)


def _background(coro: Any) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def client_key(request: Request) -> ApiKey:
    """The caller's key (role ingest or client), cached by the router for a few seconds.

    A lookup costs a database round trip and a thread hop; the router keeps verified keys for
    CFT_ROUTER_KEY_CACHE_TTL seconds and then re-checks them in the background while still
    accepting them (RouterRuntime.cached_key), which bounds how long a revoked key still
    works. While PostgreSQL is down a key verified earlier is still accepted (nobody can
    revoke meanwhile).
    """
    token = _bearer(request)
    runtime = getattr(request.app.state, "router", None)
    key: ApiKey | None = None
    digest = b""
    if runtime is not None:
        digest, key, recheck = runtime.cached_key(token)
        if recheck:
            _background(_recheck_key(runtime, request.app.state.pool, token, digest))
    if key is None:
        pool = request.app.state.pool
        try:
            key = await asyncio.to_thread(_lookup_key, pool, token)
        except (PoolTimeout, psycopg.OperationalError) as exc:
            stale = runtime.stale_key(digest) if runtime is not None else None
            if stale is None:
                raise Unavailable(
                    "the database is unavailable", headers={"Retry-After": "1"}
                ) from exc
            key = stale
        if key is None:
            raise Unauthorized("invalid or revoked API key")
        if runtime is not None:
            runtime.remember_key(digest, key)
    if key.role not in CLIENT_ROLES:
        raise Forbidden(
            f"this endpoint needs a key with role client or ingest; yours has role {key.role}"
        )
    request.state.api_key = key
    return key


ClientKey = Annotated[ApiKey, Depends(client_key)]


def _route_name(request: Request, body: dict[str, Any]) -> str:
    name = _header(request, b"x-cft-route") or body.get("model")
    if not isinstance(name, str) or not name:
        raise BadRequest('name the route in `model` (e.g. "support-es") or the X-Cft-Route header')
    return name


def _user(request: Request, body: dict[str, Any]) -> str | None:
    user = _header(request, b"x-cft-user") or body.get("user")
    return str(user) if user not in (None, "") else None


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _sse_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    *events, rest = buffer.split(b"\n\n")
    return events, rest


class _Stream(StreamingResponse):
    """A StreamingResponse that always closes its iterator (so a disconnect still logs)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                _background(aclose())


def _done(resp: aiohttp.ClientResponse | Reply) -> None:
    """Give the connection back to the pool when the body was read to its end, else close it
    (which also tells the engine to stop generating). Synchronous: safe in cancelled cleanup."""
    if isinstance(resp, Reply):  # read whole; its connection went back to the pool then
        return
    if resp.content.at_eof():
        resp.release()
    else:
        resp.close()


def _candidates(engine: EngineState, state: RouteState, assignment: Assignment) -> list[str]:
    """Models to try on an engine, best first: the assigned adapter, prod, the base model."""
    out = [m for m in (assignment.adapter_id, state.prod) if m and engine.has(m)]
    out.append(state.base_model)
    return list(dict.fromkeys(out))


async def _send(
    runtime: Any,
    state: RouteState,
    assignment: Assignment,
    body: dict[str, Any],
    path: str,
    stream: bool,
) -> tuple[aiohttp.ClientResponse | Reply, EngineState, str, str | None, float]:
    """Send to the first engine and model that answer; (response, engine, model, why, t0).

    `why` is None when the assigned model served the call, else the fallback reason.
    """
    engines: EnginePool = runtime.engines
    want = assignment.adapter_id or state.base_model
    failed_adapter = False
    order = engines.order(assignment.adapter_id)
    up = [e for e in order if e.up] or order
    for engine in up:
        if engine.models is None and not await engines.probe(engine):
            ENGINE_FAILURES.labels(engine.url, "probe").inc()
            continue
        for model in _candidates(engine, state, assignment):
            body["model"] = model
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
            if is_adapter and (resp.status == 404 or resp.status >= 500):
                try:
                    detail = (await resp.read())[:300]
                except ENGINE_ERRORS as exc:
                    detail = repr(exc).encode()
                finally:
                    _done(resp)
                failed_adapter = True
                child(ROUTER_REQUESTS, state.name, model, "error").inc()
                log.warning(
                    "adapter %s failed on %s (%s %s): falling back",
                    model,
                    engine.url,
                    resp.status,
                    detail,
                )
                if resp.status == 404:
                    engine.forget(model)
                if runtime.reconciler is not None:
                    runtime.reconciler.kick()
                continue
            why = None
            if model != want:
                why = "adapter_error" if failed_adapter else "not_loaded"
                child(ROUTER_FALLBACKS, why).inc()
            return resp, engine, model, why, started
    raise Unavailable(
        "no inference engine is reachable; retry shortly",
        code="engine_unavailable",
        headers={"Retry-After": RETRY_AFTER},
    )


async def proxy(request: Request, key: ApiKey, kind: str) -> Response:
    """Proxy one OpenAI call for the caller's tenant."""
    runtime = getattr(request.app.state, "router", None)
    if runtime is None:
        raise Unavailable("this server has no inference engine configured (set CFT_ENGINE_URLS)")
    body = _parse(await request.body())
    route_name = _route_name(request, body)
    fresh, state = runtime.table.lookup(route_name)
    if not fresh:
        try:
            state = await asyncio.to_thread(runtime.table.get, route_name)
        except psycopg.Error as exc:
            raise Unavailable(
                "the route table is unavailable", headers={"Retry-After": "1"}
            ) from exc
    if state is None or state.tenant_id != key.tenant_id:
        raise NotFound(f"no route named {route_name!r} for this tenant")
    user = _user(request, body)
    assignment: Assignment = state.assign(runtime.user_key(user) if user else "")
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("`messages` must be a non-empty list of chat messages")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise BadRequest("`prompt` must be a string")
        messages = [{"role": "user", "content": prompt}]

    rid_header = _header(request, b"x-request-id")
    request_id = str(uuid.UUID(rid_header) if _is_uuid(rid_header) else _ids.next())
    upstream_body = dict(body)
    upstream_body.pop("user", None)
    stream = bool(body.get("stream"))
    if stream:
        upstream_body["stream_options"] = {"include_usage": True}
    writer = runtime.writer
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    record: dict[str, Any] = {
        "_tenant_id": key.tenant_id,
        "request_id": request_id,
        "route": route_name,
        "model": state.base_model,
        "messages": messages,
        "user": user,
    }
    try:
        upstream, _engine, model, why, started = await _send(
            runtime, state, assignment, upstream_body, path, stream
        )
    except Unavailable as exc:
        record |= {"status": "error", "completion": None, "adapter_id": assignment.adapter_id}
        writer.submit(record)
        child(ROUTER_REQUESTS, route_name, assignment.adapter_id or state.base_model, "error").inc()
        exc.headers["X-Request-Id"] = request_id
        raise
    # A call that fell back did not get its arm's model: it belongs to no arm of the experiment.
    variant = assignment.variant if why is None else None
    decision = variant or "base"
    child(ROUTING_DECISIONS, "fallback" if why else decision).inc()
    record |= {
        "adapter_id": model,
        "experiment": assignment.experiment if state.canaries else None,
        "variant": variant if state.canaries else None,
    }
    headers = {"X-Request-Id": request_id, "X-Cft-Adapter": model}
    if variant:
        headers["X-Cft-Variant"] = variant
    if why:
        headers["X-Cft-Fallback"] = why

    if not stream:
        try:
            raw = await upstream.read()
        except ENGINE_ERRORS as exc:
            record |= {"status": "error", "completion": None}
            writer.submit(record)
            raise Unavailable(
                f"the inference engine failed: {exc!r}",
                code="engine_unavailable",
                headers=headers | {"Retry-After": RETRY_AFTER},
            ) from exc
        finally:
            _done(upstream)
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
            record["ttft_ms"] = int((time.perf_counter() - started) * 1000)
            record["status"] = "ok"
            data["model"] = route_name
        else:
            record["status"] = "error"
        child(ROUTER_REQUESTS, route_name, model, record["status"]).inc()
        writer.submit(record)
        return Response(orjson.dumps(data), upstream.status, headers, "application/json")

    assert isinstance(upstream, aiohttp.ClientResponse)  # streams go through aiohttp
    if upstream.status != 200:
        try:
            payload = await upstream.read()
        except ENGINE_ERRORS as exc:
            payload = orjson.dumps(
                {
                    "error": {
                        "message": f"the inference engine failed: {exc!r}",
                        "type": "service_unavailable",
                        "code": "engine_error",
                    }
                }
            )
        finally:
            _done(upstream)
        record |= {"status": "error", "completion": None}
        child(ROUTER_REQUESTS, route_name, model, "error").inc()
        writer.submit(record)
        return Response(payload, upstream.status, headers, "application/json")

    async def relay() -> AsyncIterator[bytes]:
        text: list[str] = []
        usage: dict[str, Any] = {}
        ttft_ms: int | None = None
        status = "partial"
        buffer = b""
        try:
            async for chunk in upstream.content.iter_any():
                buffer += chunk
                events, buffer = _sse_events(buffer)
                for event in events:
                    line = event.strip()
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        status = "ok"
                        yield b"data: [DONE]\n\n"
                        continue
                    try:
                        obj = orjson.loads(payload)
                    except orjson.JSONDecodeError:
                        continue
                    piece = _delta_text(obj, kind)
                    if piece:
                        if ttft_ms is None:
                            ttft_ms = int((time.perf_counter() - started) * 1000)
                        text.append(piece)
                    if obj.get("usage"):
                        usage = obj["usage"]
                    if "error" in obj:
                        status = "error"
                    obj["model"] = route_name
                    yield b"data: " + orjson.dumps(obj) + b"\n\n"
        except ENGINE_ERRORS as exc:
            status = "partial" if text else "error"
            err = {
                "error": {
                    "message": f"the inference engine failed mid-stream: {exc!r}",
                    "type": "service_unavailable",
                    "code": "engine_error",
                }
            }
            yield b"data: " + orjson.dumps(err) + b"\n\n"
        finally:
            # Runs on success, engine failure and client disconnect (status stays partial).
            record.update(
                completion="".join(text) if text else None,
                ttft_ms=ttft_ms,
                tokens_in=usage.get("prompt_tokens"),
                tokens_out=usage.get("completion_tokens") or (len(text) if text else None),
                status=status,
            )
            child(ROUTER_REQUESTS, route_name, model, status).inc()
            writer.submit(record)
            _done(upstream)

    return _Stream(relay(), media_type="text/event-stream", headers=headers)


def _is_uuid(value: str | None) -> bool:
    if not value:
        return False
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _completion_fields(data: dict[str, Any], kind: str) -> dict[str, Any]:
    choice = (data.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") if kind == "chat" else choice.get("text")
    usage = data.get("usage") or {}
    return {
        "completion": text,
        "tokens_in": usage.get("prompt_tokens"),
        "tokens_out": usage.get("completion_tokens"),
    }


def _delta_text(obj: dict[str, Any], kind: str) -> str | None:
    choices = obj.get("choices") or []
    if not choices:
        return None
    if kind == "chat":
        content = (choices[0].get("delta") or {}).get("content")
        return content if isinstance(content, str) else None
    text = choices[0].get("text")
    return text if isinstance(text, str) else None


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, key: ClientKey) -> Response:
    """OpenAI chat completions through the route's adapter."""
    return await proxy(request, key, "chat")


@router.post("/v1/completions")
async def completions(request: Request, key: ClientKey) -> Response:
    """OpenAI completions through the route's adapter."""
    return await proxy(request, key, "completions")


@router.get("/v1/models")
def list_models(key: IngestKey, conn: TenantConn) -> dict[str, Any]:
    """The caller tenant's routes, as OpenAI models (call them by this id)."""
    rows = conn.execute(
        "SELECT name, base_model, created_at FROM serve.route WHERE tenant_id = %s ORDER BY name",
        (key.tenant_id,),
    ).fetchall()
    data = [
        {
            "id": r["name"],
            "object": "model",
            "created": int(r["created_at"].timestamp()),
            "owned_by": "cft",
            "root": r["base_model"],
            "parent": None,
        }
        for r in rows
    ]
    return {"object": "list", "data": data}


# The two hot routes, by path: (kind, the declared route).
_FAST = {
    route.path: ("chat" if route.endpoint is chat_completions else "completions", route)
    for route in router.routes
    if isinstance(route, APIRoute) and route.endpoint in (chat_completions, completions)
}


class GatewayFastPath:
    """Dispatch POST /v1/chat/completions and /v1/completions straight to their handler.

    FastAPI's per-call routing, dependency solving and exception wrapping cost about as much
    CPU as the gateway itself (BENCHMARKS.md, Router). This runs the same two steps as the
    declared routes, `client_key` (their dependency) and then `proxy`, and maps errors through
    the app's own exception handlers. The routes stay declared on `router` (OpenAPI, the role
    sweep); every other request goes on to the app unchanged.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fast = (
            _FAST.get(_route_path(scope))
            if scope["type"] == "http" and scope["method"] == "POST"
            else None
        )
        if fast is None:
            await self.app(scope, receive, send)
            return
        kind, route = fast
        scope["route"] = route  # as FastAPI sets it (the metrics middleware reads its path)
        request = Request(scope, receive)
        try:
            response = await proxy(request, await client_key(request), kind)
        except Exception as exc:
            handler = _exception_handler(scope["app"], exc)
            if handler is None:
                raise
            response = handler(request, exc)
            if inspect.isawaitable(response):
                response = await response
        await response(scope, receive, send)


def _route_path(scope: Scope) -> str:
    """The path routes are matched on: scope["path"] without the root_path prefix when the
    server put it there (`uvicorn --root-path`), as Starlette's router does."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] == "/":
        return path[len(root) :]
    return path


def _exception_handler(app: Any, exc: Exception) -> Any:
    """The app's handler for exc (by its class's MRO, as Starlette looks it up), or None."""
    handlers = app.exception_handlers
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None
