"""A stub OpenAI-compatible chat backend for tests: a raw ASGI app with a fixed answer.

Non-streaming and streaming (SSE, with a final usage chunk when
`stream_options.include_usage` is set) /v1/chat/completions; it echoes the requested model
and counts the calls it answered (`app.calls`).
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson

ANSWER = "Hola, ¿en qué te ayudo?"
PROMPT_TOKENS = 12
COMPLETION_TOKENS = 7


class OpenAIStub:
    """ASGI callable; `calls` counts answered chat completions."""

    def __init__(self, answer: str = ANSWER) -> None:
        self.answer = answer
        self.calls = 0
        self._ids = itertools.count(1)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        more = True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        if scope["path"] == "/healthz":
            await self._send(send, 200, b"{}")
            return
        if scope["path"] != "/v1/chat/completions" or scope["method"] != "POST":
            await self._send(send, 404, b'{"error": {"message": "not found"}}')
            return
        req = orjson.loads(body)
        self.calls += 1
        cid = f"chatcmpl-stub-{next(self._ids)}"
        model = req.get("model", "stub")
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        }
        if not req.get("stream"):
            out = {
                "id": cid,
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": self.answer},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
            await self._send(send, 200, orjson.dumps(out))
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        head = {"id": cid, "object": "chat.completion.chunk", "created": 0, "model": model}
        words = self.answer.split(" ")
        for i, word in enumerate(words):
            piece = word if i == 0 else " " + word
            delta: dict[str, Any] = {"content": piece}
            if i == 0:
                delta["role"] = "assistant"
            chunk = head | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            await self._event(send, chunk)
        await self._event(
            send, head | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        )
        if (req.get("stream_options") or {}).get("include_usage"):
            await self._event(send, head | {"choices": [], "usage": usage})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    @staticmethod
    async def _event(send: Any, chunk: dict[str, Any]) -> None:
        data = b"data: " + orjson.dumps(chunk) + b"\n\n"
        await send({"type": "http.response.body", "body": data, "more_body": True})

    @staticmethod
    async def _send(send: Any, status: int, body: bytes) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})
