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
    and 431 when the request headers together are over max_header_bytes.

    `uploads` maps a path (an upload: an adapter archive, a fine-tuning file) to its own limit,
    with the setting that raises it: such a body is passed on as it arrives instead of read
    whole first (an adapter may be hundreds of MB), and when it goes over, the app sees the
    client leave and the caller gets the 413.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        max_header_bytes: int = MAX_HEADER_BYTES,
        uploads: dict[str, tuple[int, str]] | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_header_bytes = max_header_bytes
        self.uploads = uploads or {}

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
        upload = self.uploads.get(scope["path"])
        if upload is not None:
            await self._stream(scope, receive, send, *upload)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._reject(send, 400, "Content-Length is not a number")
                    return
                if declared > self.max_bytes:
                    await self._too_large(send)
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
            if size > self.max_bytes:
                await self._too_large(send)
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

    async def _stream(
        self, scope: Scope, receive: Receive, send: Send, limit: int, setting: str
    ) -> None:
        """Pass an upload's body on as it arrives, counted; over `limit`, answer 413 instead."""
        message = f"the upload is larger than {limit} bytes ({setting})"
        for name, value in scope["headers"]:
            if name == b"content-length":
                if not value.isdigit():
                    await self._reject(send, 400, "Content-Length is not a number")
                    return
                if int(value) > limit:
                    await self._reject(send, 413, message, code="payload_too_large")
                    return
        size = 0
        over = False
        started = False

        async def counted() -> Message:
            nonlocal size, over
            if over:
                return {"type": "http.disconnect"}
            msg = await receive()
            if msg["type"] == "http.request":
                size += len(msg.get("body", b""))
                if size > limit:
                    over = True
                    return {"type": "http.disconnect"}
            return msg

        async def guarded(msg: Message) -> None:
            nonlocal started
            if over:  # what the app answers to the disconnect is replaced by the 413
                if not started:
                    started = True
                    await self._reject(send, 413, message, code="payload_too_large")
                return
            started = True
            await send(msg)

        try:
            await self.app(scope, counted, guarded)
        except Exception:
            if not over:
                raise
        if over and not started:
            await self._reject(send, 413, message, code="payload_too_large")

    async def _too_large(self, send: Send) -> None:
        await self._reject(
            send,
            413,
            f"request body is larger than {self.max_bytes} bytes (CFT_MAX_BODY_BYTES):"
            " send smaller batches",
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
