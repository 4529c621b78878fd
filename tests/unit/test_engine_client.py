"""The router's lean engine client (whole, non-streamed calls) against a raw local server:
keep-alive reuse, chunked bodies, Connection: close, refused, timed out and dropped calls."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from app.core import http1
from app.gateway.client import EngineClient, EngineError, EngineResponse, Reply
from app.gateway.pool import ENGINE_ERRORS

Answer = Callable[[bytes], Awaitable[bytes | None]]  # request bytes -> raw response (None: drop)


def ok(body: bytes, *extra: bytes) -> bytes:
    head = [b"HTTP/1.1 200 OK", b"content-type: application/json", *extra]
    return b"\r\n".join([*head, b"content-length: %d" % len(body), b"", b""]) + body


async def serve(answer: Answer) -> tuple[asyncio.Server, str, list[int]]:
    """A raw HTTP server; the list counts the connections it accepted."""
    accepted: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                request = head + await reader.readexactly(length)
                response = await answer(request)
                if response is None:
                    break
                writer.write(response)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", accepted


async def stop(client: EngineClient, server: asyncio.Server) -> None:
    client.close()
    await asyncio.sleep(0.05)  # the server's handlers see EOF and end
    server.close()
    await server.wait_closed()


def run(test: Callable[[], Awaitable[Any]]) -> None:
    """On asyncio's loop and on uvloop's (the server's)."""
    asyncio.run(test())  # type: ignore[arg-type]
    uvloop.run(test())  # type: ignore[arg-type]


def test_whole_calls_reuse_one_keep_alive_connection() -> None:
    seen: list[bytes] = []

    async def answer(request: bytes) -> bytes:
        seen.append(request)
        return ok(b'{"n": %d}' % len(seen))

    async def test() -> None:
        seen.clear()
        server, url, accepted = await serve(answer)
        client = EngineClient(timeout=5)
        for n in (1, 2, 3):
            reply = await client.post(url + "/base", "/v1/chat/completions", b'{"a": 1}')
            assert (reply.status, await reply.read()) == (200, b'{"n": %d}' % n)
        assert len(accepted) == 1
        assert seen[0].startswith(b"POST /base/v1/chat/completions HTTP/1.1\r\n")
        assert b"\r\nContent-Length: 8\r\n" in seen[0] and seen[0].endswith(b'\r\n\r\n{"a": 1}')
        await stop(client, server)

    run(test)


def test_chunked_bodies_errors_and_connection_close() -> None:
    async def answer(request: bytes) -> bytes:
        if b"/chunked" in request:
            return (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                b'3\r\n{"a\r\n5\r\n": 1}\r\n0\r\n\r\n'
            )
        if b"/close" in request:
            return ok(b"{}", b"connection: close")
        return b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\nno"

    async def test() -> None:
        server, url, accepted = await serve(answer)
        client = EngineClient(timeout=5)
        reply = await client.post(url, "/chunked", b"{}")
        assert (reply.status, reply.body) == (200, b'{"a": 1}')
        reply = await client.post(url, "/missing", b"{}")
        assert (reply.status, reply.body) == (404, b"no")  # any status is an answer
        assert len(accepted) == 1
        await client.post(url, "/close", b"{}")
        await client.post(url, "/close", b"{}")
        await client.post(url, "/missing", b"{}")
        assert len(accepted) == 3  # a connection the engine closes is not reused
        await stop(client, server)

    run(test)


def test_refused_dropped_and_timed_out_calls_are_engine_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def slow(request: bytes) -> bytes | None:
        if b"/drop" in request:
            return None
        await asyncio.sleep(5)
        return ok(b"{}")

    async def test() -> None:
        server, url, accepted = await serve(slow)
        client = EngineClient(timeout=0.2)
        with pytest.raises(EngineError, match="closed the connection"):
            await client.post(url, "/drop", b"{}")
        with pytest.raises(TimeoutError):
            await client.post(url, "/slow", b"{}")
        with pytest.raises(ENGINE_ERRORS):
            await client.post(url, "/drop", b"{}")
        assert len(accepted) == 3  # a failed connection is never reused
        server.close()
        await server.wait_closed()
        with pytest.raises(EngineError, match="cannot connect"):
            await client.post(url, "/x", b"{}")

    run(test)


def test_idle_connections_expire_before_the_engines_keep_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def answer(request: bytes) -> bytes:
        return ok(b"{}")

    async def test() -> None:
        server, url, accepted = await serve(answer)
        client = EngineClient(timeout=5)
        await client.post(url, "/a", b"{}")
        monkeypatch.setattr(http1, "KEEPALIVE_S", 0.0)
        await client.post(url, "/a", b"{}")
        assert len(accepted) == 2
        await stop(client, server)

    run(test)


def test_only_plain_http_urls_use_the_lean_client() -> None:
    client = EngineClient(timeout=1)
    assert client.target("https://engine:8000") is None
    target = client.target("http://[::1]:8001/v")
    assert target is not None
    assert (target.host, target.port, target.prefix, target.authority) == (
        "::1",
        8001,
        "/v",
        b"[::1]:8001",
    )


def test_a_whole_reply_reads_as_any_engine_response() -> None:
    """The pool's one answer type: a Reply streams its body in one piece, finishes at once."""

    async def test() -> None:
        reply: EngineResponse = Reply(200, b'data: {"a": 1}\n\n')
        assert (reply.status, await reply.read()) == (200, b'data: {"a": 1}\n\n')
        assert [chunk async for chunk in reply.chunks()] == [b'data: {"a": 1}\n\n']
        reply.finish()

    asyncio.run(test())
