"""HTTP/1.1 to the engines over kept-alive connections, as both lean clients speak it: the
gateway's whole calls (app/gateway/client.py, asyncio) and the reconciler's control calls
(workers/reconciler/http.py, blocking sockets). The request, the responses (httptools parses)
and the idle connections kept per engine are defined here once.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Generic, Protocol, TypeVar

import httptools

# Idle connections are dropped before the engine's own keep-alive timeout (uvicorn's and
# vLLM's is 5 s), so no request goes out on a connection the engine is closing.
KEEPALIVE_S = 4.0

ParseError = httptools.HttpParserError  # bytes that are not a valid HTTP response


def request(method: bytes, target: bytes, authority: bytes, body: bytes | None) -> bytes:
    """One request's bytes: a JSON body, or none."""
    if body is None:
        return b"%s %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (method, target, authority)
    return (
        b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (method, target, authority, len(body), body)
    )


class Responses:
    """Parses the responses that arrive on one connection, one after another (feed what
    arrives to `parser.feed_data`; ParseError when it is not HTTP), and calls `complete` with
    each whole one."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.chunks: list[bytes] = []

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        body, self.chunks = b"".join(self.chunks), []
        # Read here: once the message is complete the parser resets, and says "close".
        self.complete(self.parser.get_status_code(), body, self.parser.should_keep_alive())

    def complete(self, status: int, body: bytes, keep_alive: bool) -> None:
        """A whole response; keep_alive: the engine keeps the connection open."""
        raise NotImplementedError


class Kept(Protocol):
    """A connection the pool keeps: when it went idle, whether it was lost (closed)."""

    idle_since: float
    lost: bool

    def close(self) -> None:
        """Close it."""


C = TypeVar("C", bound=Kept)


class IdlePool(Generic[C]):
    """Idle connections per engine (host, port), at most `limit` each: the most recently used
    is taken first (least likely to be closing); one idle KEEPALIVE_S or longer, or lost, is
    closed instead. Not thread-safe: a caller on several threads holds a lock around it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._idle: dict[tuple[str, int], deque[C]] = {}

    def take(self, key: tuple[str, int]) -> C | None:
        """An idle connection to reuse, or None."""
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.lost and now - conn.idle_since < KEEPALIVE_S:
                return conn
            conn.close()
        return None

    def give(self, key: tuple[str, int], conn: C) -> None:
        """Keep a connection whose response was read to its end (closed if enough are kept)."""
        conn.idle_since = time.monotonic()
        idle = self._idle.setdefault(key, deque())
        if len(idle) < self.limit:
            idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            while idle:
                idle.pop().close()
