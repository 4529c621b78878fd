"""The OpenAI-compatible gateway: route -> adapter (sticky canary), proxy to an engine, log.

Clients call `POST /v1/chat/completions` or `/v1/completions` with `model` = a route name
(or the `X-Cft-Route` header) and `user` = their user id (or `X-Cft-User`). The router picks the
adapter with the same rule as `serve.assign_adapter`, rewrites `model` to that adapter's engine
name, proxies the call (streaming or not), answers with `X-Request-Id`, and queues the log
record for the batched writer, off the client's latency path.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from app.core.auth import IngestKey
from app.core.errors import BadRequest, NotFound, Unavailable
from app.routing.assign import Assignment, RouteState

router = APIRouter(tags=["router"])

UPSTREAM_TIMEOUT = httpx.Timeout(connect=5.0, read=300.0, write=30.0, pool=10.0)


class EnginePool:
    """The engines behind the router (round robin)."""

    def __init__(self, urls: list[str]):
        if not urls:
            raise ValueError("no engine URLs configured (CFT_ENGINE_URLS)")
        self.urls = [u.rstrip("/") for u in urls]
        self._next = itertools.cycle(self.urls)
        self.client = httpx.AsyncClient(timeout=UPSTREAM_TIMEOUT)

    def pick(self) -> str:
        """The engine for the next call."""
        return next(self._next)

    async def close(self) -> None:
        """Close the HTTP client."""
        await self.client.aclose()


def _route_name(request: Request, body: dict[str, Any]) -> str:
    name = request.headers.get("x-cft-route") or body.get("model")
    if not isinstance(name, str) or not name:
        raise BadRequest('name the route in `model` (e.g. "support-es") or the X-Cft-Route header')
    return name


def _user(request: Request, body: dict[str, Any]) -> str | None:
    user = request.headers.get("x-cft-user") or body.get("user")
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


async def proxy(request: Request, key: IngestKey, kind: str) -> Response:
    """Proxy one OpenAI call for the caller's tenant."""
    runtime = getattr(request.app.state, "router", None)
    if runtime is None:
        raise Unavailable("this server has no inference engine configured (set CFT_ENGINE_URLS)")
    body = _parse(await request.body())
    route_name = _route_name(request, body)
    state: RouteState | None = await asyncio.to_thread(runtime.table.get, route_name)
    if state is None or state.tenant_id != key.tenant_id:
        raise NotFound(f"no route named {route_name!r} for this tenant")
    user = _user(request, body)
    assignment: Assignment = state.assign(runtime.hash_user(user).hex() if user else "")
    engine_model = assignment.adapter_id or state.base_model
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("`messages` must be a non-empty list of chat messages")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise BadRequest("`prompt` must be a string")
        messages = [{"role": "user", "content": prompt}]

    request_id = (
        uuid.UUID(request.headers["x-request-id"])
        if _is_uuid(request.headers.get("x-request-id"))
        else uuid.uuid4()
    )
    upstream_body = dict(body)
    upstream_body["model"] = engine_model
    upstream_body.pop("user", None)
    stream = bool(body.get("stream"))
    if stream:
        upstream_body["stream_options"] = {"include_usage": True}
    engines: EnginePool = runtime.engines
    writer = runtime.writer
    url = f"{engines.pick()}/v1/{'chat/completions' if kind == 'chat' else 'completions'}"
    record: dict[str, Any] = {
        "_tenant_id": key.tenant_id,
        "request_id": str(request_id),
        "route": route_name,
        "adapter_id": engine_model,
        "model": state.base_model,
        "experiment": assignment.experiment if state.canaries else None,
        "variant": assignment.variant if state.canaries else None,
        "messages": messages,
        "user": user,
    }
    headers = {"X-Request-Id": str(request_id), "X-Cft-Adapter": engine_model}
    if assignment.variant:
        headers["X-Cft-Variant"] = assignment.variant
    started = time.perf_counter()
    if not stream:
        try:
            upstream = await engines.client.post(url, json=upstream_body)
        except httpx.HTTPError as exc:
            record |= {"status": "error", "completion": None}
            await writer.put(record)
            raise Unavailable(
                f"the inference engine is unreachable: {exc}", headers=headers
            ) from exc
        data = (
            upstream.json()
            if upstream.headers.get("content-type", "").startswith("application/json")
            else {}
        )
        if upstream.status_code == 200:
            record |= _completion_fields(data, kind)
            record["ttft_ms"] = int((time.perf_counter() - started) * 1000)
            record["status"] = "ok"
            data["model"] = route_name
        else:
            record["status"] = "error"
        await writer.put(record)
        return Response(orjson.dumps(data), upstream.status_code, headers, "application/json")

    async def relay() -> AsyncIterator[bytes]:
        text: list[str] = []
        usage: dict[str, Any] = {}
        ttft_ms: int | None = None
        status = "partial"
        buffer = b""
        try:
            async with engines.client.stream("POST", url, json=upstream_body) as upstream:
                if upstream.status_code != 200:
                    payload = await upstream.aread()
                    status = "error"
                    yield b"data: " + payload + b"\n\n"
                    return
                async for chunk in upstream.aiter_bytes():
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
                        if piece and ttft_ms is None:
                            ttft_ms = int((time.perf_counter() - started) * 1000)
                        if piece:
                            text.append(piece)
                        if obj.get("usage"):
                            usage = obj["usage"]
                        obj["model"] = route_name
                        yield b"data: " + orjson.dumps(obj) + b"\n\n"
        except httpx.HTTPError as exc:
            status = "partial" if text else "error"
            err = {
                "error": {
                    "message": f"the inference engine failed mid-stream: {exc}",
                    "type": "service_unavailable",
                    "code": "engine_error",
                }
            }
            yield b"data: " + orjson.dumps(err) + b"\n\n"
        finally:
            record.update(
                completion="".join(text) if text else None,
                ttft_ms=ttft_ms,
                tokens_in=usage.get("prompt_tokens"),
                tokens_out=usage.get("completion_tokens"),
                status=status,
            )
            await writer.put(record)

    return StreamingResponse(relay(), media_type="text/event-stream", headers=headers)


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
async def chat_completions(request: Request, key: IngestKey) -> Response:
    """OpenAI chat completions through the route's adapter."""
    return await proxy(request, key, "chat")


@router.post("/v1/completions")
async def completions(request: Request, key: IngestKey) -> Response:
    """OpenAI completions through the route's adapter."""
    return await proxy(request, key, "completions")
