"""The reconciler's HTTP client for the engines' control calls (load, unload, probe, describe).

The standard library's http.client over kept-alive connections, one per engine and call in
flight: ~0.3 ms of CPU per call where httpx spent ~1.5 ms (calls tens of milliseconds apart,
its caches cold; BENCHMARKS.md, "The fleet at 10,000 routes"). It answers what the engine
kinds read (app/engines/base.py Http) and fails with httpx's exceptions, so every caller's
`except httpx.HTTPError` holds; https engines go through httpx.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

# Idle connections are dropped before the engine's own keep-alive timeout (uvicorn's and
# vLLM's is 5 s), so no request goes out on a connection the engine is closing.
KEEPALIVE_S = 4.0
_MAX_IDLE = 4  # per engine: its load thread, the pass's probes, an unload
_JSON = {"content-type": "application/json"}


@dataclass
class Reply:
    """An engine's whole answer (app/engines/base.py HttpReply)."""

    status_code: int
    content: bytes
    method: str
    url: str
    headers: list[tuple[str, str]] = field(default_factory=list)

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


class LeanClient:
    """GET and POST to engines over kept-alive connections, safe across threads (each call
    takes an idle connection of its engine, or opens one, and gives it back)."""

    def __init__(self, *, connect_timeout: float = 10.0, read_timeout: float = 300.0):
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: dict[str, deque[tuple[float, http.client.HTTPConnection]]] = {}
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
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        read = timeout if timeout is not None else self.read_timeout
        for attempt in (0, 1):
            conn = self._take(parts.netloc)
            reused = conn is not None
            if conn is None:
                conn = http.client.HTTPConnection(
                    parts.hostname, parts.port, timeout=timeout or self.connect_timeout
                )
                try:
                    conn.connect()
                except TimeoutError as exc:
                    raise httpx.ConnectTimeout(f"connecting to {parts.netloc} timed out") from exc
                except OSError as exc:
                    raise httpx.ConnectError(f"cannot connect to {parts.netloc}: {exc}") from exc
            conn.sock.settimeout(read)
            try:
                conn.request(method, target, body, _JSON if body is not None else {})
                resp = conn.getresponse()
                content = resp.read()
            except TimeoutError as exc:
                conn.close()
                raise httpx.ReadTimeout(f"{method} {url} timed out after {read:g} s") from exc
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                # A kept connection the engine closed meanwhile (RemoteDisconnected, a reset,
                # a broken pipe): once more on a new one.
                if reused and attempt == 0 and isinstance(exc, ConnectionError):
                    continue
                raise httpx.ReadError(f"{method} {url}: {exc!r}") from exc
            if conn.sock is not None:  # http.client closed it when the engine said close
                self._give(parts.netloc, conn)
            return Reply(resp.status, content, method, url, resp.getheaders())
        raise AssertionError("unreachable")

    def _take(self, key: str) -> http.client.HTTPConnection | None:
        now = time.monotonic()
        with self._lock:
            idle = self._idle.get(key)
            while idle:
                since, conn = idle.pop()
                if now - since < KEEPALIVE_S:
                    return conn
                conn.close()
        return None

    def _give(self, key: str, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, deque())
            if len(idle) < _MAX_IDLE:
                idle.append((time.monotonic(), conn))
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
        headers = _JSON if body is not None else None
        if timeout is None:
            return client.request(method, url, content=body, headers=headers)
        return client.request(method, url, content=body, headers=headers, timeout=timeout)

    def close(self) -> None:
        """Close every kept connection (and httpx's, when an https engine used it)."""
        with self._lock:
            conns = [conn for idle in self._idle.values() for _, conn in idle]
            self._idle.clear()
            client, self._httpx = self._httpx, None
        for conn in conns:
            conn.close()
        if client is not None:
            client.close()
