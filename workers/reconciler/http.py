"""The reconciler's HTTP client for the engines' control calls (load, unload, probe, describe).

A load's engine call was its largest CPU cost: httpx spent ~1.5 ms of CPU per call here when
calls come tens of milliseconds apart (its caches cold), this client ~0.3 ms (one socket per
engine kept alive, httptools parses, nothing built that is not read; BENCHMARKS.md, "The fleet
at 10,000 routes"). It answers what the engine kinds read (app/engines/base.py Http) and fails
with httpx's exceptions, so every caller's `except httpx.HTTPError` holds; https engines go
through httpx.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httptools
import httpx
import orjson

# Idle connections are dropped before the engine's own keep-alive timeout (uvicorn's and
# vLLM's is 5 s), so no request goes out on a connection the engine is closing.
KEEPALIVE_S = 4.0
_MAX_IDLE = 4  # per engine: its load thread, the pass's probes, an unload


@dataclass
class Reply:
    """An engine's whole answer (app/engines/base.py HttpReply)."""

    status_code: int
    content: bytes
    method: str
    url: str
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The body as text (UTF-8, as the engines send it)."""
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not."""
        return orjson.loads(self.content)

    def raise_for_status(self) -> Reply:
        """Raise httpx.HTTPStatusError for a 4xx or 5xx answer."""
        if self.status_code < 400:
            return self
        request = httpx.Request(self.method, self.url)
        response = httpx.Response(
            self.status_code, headers=self.headers, content=self.content, request=request
        )
        kind = "Client" if self.status_code < 500 else "Server"
        raise httpx.HTTPStatusError(
            f"{kind} error '{self.status_code}' for url '{self.url}'",
            request=request,
            response=response,
        )


class _Parsed:
    """httptools' callbacks for one response."""

    __slots__ = ("body", "done", "headers", "keep", "parser")

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.headers: list[tuple[bytes, bytes]] = []
        self.done = False
        self.keep = False
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done = True
        # Read here: once the message is complete the parser resets, and says "close".
        self.keep = self.parser.should_keep_alive()


class _Conn:
    """One keep-alive connection to an engine; one request at a time."""

    def __init__(self, host: str, port: int, connect_timeout: float):
        try:
            self.sock = socket.create_connection((host, port), timeout=connect_timeout)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.idle_since = time.monotonic()

    def exchange(
        self, request: bytes, timeout: float, sent: list[bool]
    ) -> tuple[int, _Parsed, bool]:
        """Send one request, read its whole response: (status, parsed, keep alive)."""
        self.sock.settimeout(timeout)
        self.sock.sendall(request)
        sent[0] = True
        parsed = _Parsed()
        parser = parsed.parser
        while not parsed.done:
            data = self.sock.recv(65536)
            if not data:
                parser.feed_data(b"")  # a body delimited by the close ends here
                if not parsed.done:
                    raise ConnectionResetError("the engine closed the connection")
                break
            parser.feed_data(data)
        return parser.get_status_code(), parsed, parsed.keep

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class LeanClient:
    """GET and POST to engines over kept-alive sockets, safe across threads (each call takes
    an idle connection of its engine, or opens one, and gives it back)."""

    def __init__(self, *, connect_timeout: float = 10.0, read_timeout: float = 300.0):
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: dict[tuple[str, int], deque[_Conn]] = {}
        self._lock = threading.Lock()
        self._httpx: httpx.Client | None = None

    def get(self, url: str, *, timeout: float | None = None) -> Reply | httpx.Response:
        """GET url."""
        return self._request("GET", url, None, timeout)

    def post(
        self, url: str, *, json: Any = None, timeout: float | None = None
    ) -> Reply | httpx.Response:
        """POST a JSON body to url."""
        return self._request("POST", url, orjson.dumps(json), timeout)

    def _request(
        self, method: str, url: str, body: bytes | None, timeout: float | None
    ) -> Reply | httpx.Response:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            return self._fallback(method, url, body, timeout)
        host, port = parts.hostname, parts.port or 80
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = f"{method} {target} HTTP/1.1\r\nhost: {parts.netloc}\r\naccept: */*\r\n"
        if body is not None:
            head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        request = head.encode("latin-1") + b"\r\n" + (body or b"")
        read = timeout if timeout is not None else self.read_timeout
        key = (host, port)
        for attempt in (0, 1):
            conn, reused = self._take(key)
            if conn is None:
                conn = _Conn(host, port, timeout or self.connect_timeout)
            sent = [False]
            try:
                status, parsed, keep = conn.exchange(request, read, sent)
            except TimeoutError as exc:
                conn.close()
                raise httpx.ReadTimeout(f"{method} {url} timed out after {read:g} s") from exc
            except (OSError, httptools.HttpParserError) as exc:
                conn.close()
                # A kept connection the engine closed meanwhile: once more on a new one.
                if reused and attempt == 0 and isinstance(exc, OSError):
                    continue
                what = "send" if not sent[0] else "read"
                raise httpx.ReadError(f"{method} {url}: cannot {what} ({exc})") from exc
            if keep:
                self._give(key, conn)
            else:
                conn.close()
            return Reply(status, b"".join(parsed.body), method, url, parsed.headers)
        raise AssertionError("unreachable")

    def _take(self, key: tuple[str, int]) -> tuple[_Conn | None, bool]:
        now = time.monotonic()
        with self._lock:
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()
                if now - conn.idle_since < KEEPALIVE_S:
                    return conn, True
                conn.close()
        return None, False

    def _give(self, key: tuple[str, int], conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        with self._lock:
            idle = self._idle.setdefault(key, deque())
            if len(idle) < _MAX_IDLE:
                idle.append(conn)
                return
        conn.close()

    def _fallback(
        self, method: str, url: str, body: bytes | None, timeout: float | None
    ) -> httpx.Response:
        """An https engine: through httpx."""
        with self._lock:
            if self._httpx is None:
                self._httpx = httpx.Client(
                    timeout=httpx.Timeout(self.connect_timeout, read=self.read_timeout)
                )
            client = self._httpx
        headers = {"content-type": "application/json"} if body is not None else None
        if timeout is None:
            return client.request(method, url, content=body, headers=headers)
        return client.request(method, url, content=body, headers=headers, timeout=timeout)

    def close(self) -> None:
        """Close every kept connection (and httpx's, when an https engine used it)."""
        with self._lock:
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
            client, self._httpx = self._httpx, None
        for conn in conns:
            conn.close()
        if client is not None:
            client.close()
