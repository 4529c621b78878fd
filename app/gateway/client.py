"""The gateway's lean HTTP client for whole (non-streamed) calls to plain-HTTP engines.

The gateway's hot path: aiohttp costs ~0.2 ms of CPU per call here and this ~0.05 ms
(app/core/http1.py's request and httptools parsing; BENCHMARKS.md, Router). What it answers, a
Reply, is one kind of EngineResponse; app/gateway/pool.py sends streams and calls to https
engines through aiohttp.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from app.core import http1


class EngineResponse(Protocol):
    """An engine's answer, whole or streamed: what the gateway reads of it."""

    @property
    def status(self) -> int:
        """The HTTP status."""

    async def read(self) -> bytes:
        """The whole body."""

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""

    def finish(self) -> None:
        """Give the connection back when the body was read to its end, else close it (which
        also tells the engine to stop generating). Synchronous: safe in cancelled cleanup."""


class EngineError(Exception):
    """An engine call failed below HTTP: refused, reset, closed early, or not valid HTTP."""


CONNECT_TIMEOUT = 2.0
# Idle connections kept per engine (more are closed when they come back).
MAX_IDLE = 1000


@dataclass
class Reply:
    """A whole engine response, read before it is returned (an EngineResponse)."""

    status: int
    body: bytes

    async def read(self) -> bytes:
        """The body (already read)."""
        return self.body

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, in one piece."""
        yield self.body

    def finish(self) -> None:
        """Nothing to give back: the connection went back to the pool when the body was in."""


class _Connection(http1.Responses, asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to an engine; one request at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Reply] | None = None
        self.lost = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP connection's
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # bytes nobody asked for: the connection is not reusable
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except http1.ParseError as exc:
            self._fail(EngineError(f"invalid HTTP response: {exc}"))

    def complete(self, status: int, body: bytes, keep_alive: bool) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(Reply(status, body))
        if not keep_alive:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(EngineError(f"the engine closed the connection ({exc or 'EOF'})"))

    def _fail(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        """Close now (also tells the engine to stop generating for an unfinished call)."""
        self.lost = True
        if self.transport is not None:
            self.transport.close()


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    prefix: str  # the engine URL's path, if any
    authority: bytes  # the Host header


class EngineClient:
    """Plain-HTTP POSTs of whole JSON bodies to engines over a keep-alive pool.

    Streamed calls, probes and https engines stay on aiohttp (app/gateway/pool.py). Errors are
    EngineError or TimeoutError (in the pool's ENGINE_ERRORS), as aiohttp's are for the
    gateway: it fails over to the next engine.
    """

    def __init__(self, *, timeout: float) -> None:
        self.timeout = timeout
        self._idle: http1.IdlePool[_Connection] = http1.IdlePool(MAX_IDLE)
        self._targets: dict[str, _Target | None] = {}

    def target(self, base_url: str) -> _Target | None:
        """Where a plain-HTTP engine URL points, else None (https & co.: use aiohttp)."""
        if base_url not in self._targets:
            url = urlsplit(base_url)
            target = None
            if url.scheme == "http" and url.hostname and not url.query and not url.username:
                host, port = url.hostname, url.port or 80
                name = f"[{host}]" if ":" in host else host
                target = _Target(host, port, url.path.rstrip("/"), f"{name}:{port}".encode())
            self._targets[base_url] = target
        return self._targets[base_url]

    async def _connection(self, host: str, port: int) -> _Connection:
        conn = self._idle.take((host, port))
        if conn is not None:
            return conn
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                transport, conn = await loop.create_connection(_Connection, host, port)
        except OSError as exc:
            raise EngineError(f"cannot connect to {host}:{port}: {exc}") from exc
        # uvloop may call connection_made only on the next loop iteration.
        conn.transport = transport
        return conn

    async def post(self, base_url: str, path: str, body: bytes) -> Reply:
        """POST a JSON body to base_url + path; the whole response (any status)."""
        target = self.target(base_url)
        assert target is not None, "not a plain-HTTP engine URL"
        host, port = target.host, target.port
        conn = await self._connection(host, port)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Reply] = loop.create_future()
        conn.waiter = waiter
        assert conn.transport is not None
        conn.transport.write(
            http1.request(b"POST", (target.prefix + path).encode(), target.authority, body)
        )
        timer = loop.call_later(
            self.timeout, conn._fail, TimeoutError(f"no answer in {self.timeout:g} s")
        )
        try:
            reply = await waiter
        except BaseException:
            conn.close()  # cancelled (the client went away) or failed: never reuse it
            raise
        finally:
            timer.cancel()
        if not conn.lost:
            self._idle.give((host, port), conn)
        return reply

    def close(self) -> None:
        """Close every idle connection."""
        self._idle.close()
