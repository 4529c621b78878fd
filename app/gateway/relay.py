"""Relaying an engine's server-sent events to the client, and logging the call when it ends."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from app.core.metrics import FIRST_TOKEN_COLD, ROUTER_REQUESTS, child
from app.gateway.client import EngineResponse
from app.gateway.logwriter import LogWriter
from app.gateway.pool import ENGINE_ERRORS
from app.gateway.tasks import background


class Stream(StreamingResponse):
    """A StreamingResponse that always closes its iterator (so a disconnect still logs)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                background(aclose())


def engine_error(message: str) -> dict[str, Any]:
    """The OpenAI-shaped error the gateway writes when the engine failed under a call."""
    return {"error": {"message": message, "type": "service_unavailable", "code": "engine_error"}}


def _sse_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    *events, rest = buffer.split(b"\n\n")
    return events, rest


def _delta_text(obj: dict[str, Any], kind: str) -> str | None:
    choices = obj.get("choices") or []
    if not choices:
        return None
    if kind == "chat":
        content = (choices[0].get("delta") or {}).get("content")
        return content if isinstance(content, str) else None
    text = choices[0].get("text")
    return text if isinstance(text, str) else None


async def relay(
    upstream: EngineResponse,
    *,
    kind: str,
    route_name: str,
    answered: str,
    started: float,
    record: dict[str, Any],
    writer: LogWriter,
    cold_since: float | None = None,
) -> AsyncIterator[bytes]:
    """The engine's events with `model` set to the route; logs the call however it ends.
    `answered`: lora or base (the requests metric's kind); `cold_since`: when the call began
    to wait for its adapter's load (its first token is a cold start's), None if it did not."""
    text: list[str] = []
    usage: dict[str, Any] = {}
    ttft_ms: int | None = None
    status = "partial"
    buffer = b""
    try:
        async for chunk in upstream.chunks():
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
                        now = time.perf_counter()
                        ttft_ms = int((now - started) * 1000)
                        if cold_since is not None:
                            FIRST_TOKEN_COLD.observe(now - cold_since)
                    text.append(piece)
                if obj.get("usage"):
                    usage = obj["usage"]
                if "error" in obj:
                    status = "error"
                obj["model"] = route_name
                yield b"data: " + orjson.dumps(obj) + b"\n\n"
    except ENGINE_ERRORS as exc:
        status = "partial" if text else "error"
        err = engine_error(f"the inference engine failed mid-stream: {exc!r}")
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
        child(ROUTER_REQUESTS, answered, status).inc()
        writer.submit(record)
        upstream.finish()
