"""The reconciler's HTTP client for the engines' control calls (load, unload, probe, describe).

A load's engine call was its largest CPU cost. Per call, calls tens of milliseconds apart:
httpx ~1.6 ms of CPU, the standard library's http.client ~0.7 ms, this ~0.35 ms (a socket per
engine kept alive, app/core/http1.py's request and httptools parsing, nothing built that is not
read; BENCHMARKS.md, "The fleet at 10,000 routes"). It answers what the engine kinds read
(app/engines/base.py Http) and fails with httpx's exceptions, so every caller's
`except httpx.HTTPError` holds; https engines go through httpx.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from app.core import http1

_MAX_IDLE = 4  # per engine: its load thread, the pass's probes, an unload


@dataclass
class Reply:
    """An engine's whole answer (app/engines/base.py HttpReply)."""

    status_code: int
    content: bytes
    method: str
    url: str

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
        response = httpx.Response(self.status_code, content=self.content, request=request)
        kind = "Client" if self.status_code < 500 else "Server"
        raise httpx.HTTPStatusError(
            f"{kind} error '{self.status_code}' for url '{self.url}'",
            request=request,
            response=response,
        )


class _Conn(http1.Responses):
    """One keep-alive connection to an engine; one request at a time."""

    idle_since = 0.0
    lost = False

    def __init__(self, host: str, port: int, connect_timeout: float):
        super().__init__()
        try:
            self.sock = socket.create_connection((host, port), timeout=connect_timeout)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.answer: tuple[int, bytes, bool] | None = None

    def complete(self, status: int, body: bytes, keep_alive: bool) -> None:
        self.answer = (status, body, keep_alive)

    def exchange(self, request: bytes, timeout: float) -> tuple[int, bytes, bool]:
        """Send one request, read its whole response: (status, body, keep alive)."""
        self.sock.settimeout(timeout)
        self.sock.sendall(request)
        self.answer = None
        while self.answer is None:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionResetError("the engine closed the connection")
            self.parser.feed_data(data)
        return self.answer

    def close(self) -> None:
        self.lost = True
        with contextlib.suppress(OSError):
            self.sock.close()


class LeanClient:
    """GET and POST to engines over kept-alive sockets, safe across threads (each call takes
    an idle connection of its engine, or opens one, and gives it back)."""

    def __init__(self, *, connect_timeout: float = 10.0, read_timeout: float = 300.0):
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: http1.IdlePool[_Conn] = http1.IdlePool(_MAX_IDLE)
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
        key = (parts.hostname, parts.port or 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        request = http1.request(method.encode(), target.encode(), parts.netloc.encode(), body)
        read = timeout if timeout is not None else self.read_timeout
        for attempt in (0, 1):
            with self._lock:
                conn = self._idle.take(key)
            reused = conn is not None
            if conn is None:
                conn = _Conn(*key, timeout or self.connect_timeout)
            try:
                status, content, keep_alive = conn.exchange(request, read)
            except TimeoutError as exc:
                conn.close()
                raise httpx.ReadTimeout(f"{method} {url} timed out after {read:g} s") from exc
            except (OSError, http1.ParseError) as exc:
                conn.close()
                # A kept connection the engine closed meanwhile: once more on a new one.
                if reused and attempt == 0 and isinstance(exc, OSError):
                    continue
                raise httpx.ReadError(f"{method} {url}: {exc}") from exc
            if keep_alive:
                with self._lock:
                    self._idle.give(key, conn)
            else:
                conn.close()
            return Reply(status, content, method, url)
        raise AssertionError("unreachable")

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
            self._idle.close()
            client, self._httpx = self._httpx, None
        if client is not None:
            client.close()
