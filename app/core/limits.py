"""Request size limits (body and headers), enforced before anything parses the request."""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.errors import error_body

# uvicorn's default HTTP parser (httptools) accepts request headers of any size (a 20 MB header
# reached the app in a test): bound them here. 32 KiB is far above what any client sends.
MAX_HEADER_BYTES = 32 * 1024


class BodyLimitMiddleware:
    """Answer 413 (OpenAI error shape) when a body is over max_bytes, declared or streamed,
    and 431 when the request headers together are over max_header_bytes."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        max_header_bytes: int = MAX_HEADER_BYTES,
        paths: dict[str, int] | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_header_bytes = max_header_bytes
        # Paths with a limit of their own (a file upload), exact match.
        self.paths = paths or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header_bytes = sum(len(name) + len(value) + 4 for name, value in scope["headers"])
        if header_bytes > self.max_header_bytes:
            await self._reject(
                send,
                431,
                f"request headers are larger than {self.max_header_bytes} bytes",
                code="headers_too_large",
            )
            return
        if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        limit = self.paths.get(scope["path"], self.max_bytes)
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._reject(send, 400, "Content-Length is not a number")
                    return
                if declared > limit:
                    await self._too_large(send, limit)
                    return
        # Read the body here (chunked bodies have no Content-Length) and replay it.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._too_large(send, limit)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send, limit: int) -> None:
        fix = (
            "(CFT_MAX_BODY_BYTES): send smaller batches"
            if limit == self.max_bytes
            else "(CFT_FILE_MAX_BYTES): split the file"
        )
        await self._reject(
            send,
            413,
            f"request body is larger than {limit} bytes {fix}",
            code="payload_too_large",
        )

    @staticmethod
    async def _reject(send: Send, status: int, message: str, code: str = "bad_request") -> None:
        body = orjson.dumps(error_body(message, "invalid_request_error", code))
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
