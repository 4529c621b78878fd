"""The engines behind the router and what each one has loaded.

`EngineState.models` is the set of names the engine serves, as last seen on its /v1/models
(refreshed by every reconciler pass, and trimmed at once when the engine refuses one). The
gateway only sends an adapter name to an engine whose set contains it (invariant 8: never
route to an adapter that is not loaded); `None` means not probed yet. Each engine has a kind
(app/gateway/engine_kinds.py): a LoRAX engine has no /v1/models and loads adapters on first
use, so its set is what the reconciler verified and staged for it.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
import httptools
import orjson

from app.gateway.engine_kinds import EngineKind, parse_engine_url

# An engine that refused a connection or timed out is skipped for this long.
DOWN_FOR = 2.0


@dataclass
class EngineState:
    """One engine: its URL and kind, the models it serves, and whether it looks down."""

    url: str
    models: frozenset[str] | None = None
    down_until: float = 0.0
    kind: EngineKind = "vllm"
    # lorax: adapter id -> the directory the engine reads it from (set by the reconciler).
    adapter_paths: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: str) -> EngineState:
        """An engine from a CFT_ENGINE_URLS entry (`KIND+URL` or a bare vLLM URL)."""
        spec = parse_engine_url(raw)
        return cls(spec.url, kind=spec.kind)

    @property
    def up(self) -> bool:
        """False for DOWN_FOR seconds after a failure."""
        return time.monotonic() >= self.down_until

    def mark_down(self) -> None:
        """Skip this engine for a while."""
        self.down_until = time.monotonic() + DOWN_FOR

    def has(self, model: str) -> bool:
        """True when the engine serves this model name."""
        models = self.models
        return models is not None and model in models

    def forget(self, model: str) -> None:
        """Drop a name the engine said it does not have."""
        models = self.models
        if models is not None and model in models:
            self.models = models - {model}


def model_ids(payload: object) -> frozenset[str]:
    """The model names in an OpenAI /v1/models response."""
    data = payload.get("data") if isinstance(payload, dict) else None
    return frozenset(
        str(m["id"]) for m in data or [] if isinstance(m, dict) and isinstance(m.get("id"), str)
    )


class EngineError(Exception):
    """An engine call failed below HTTP: refused, reset, closed early, or not valid HTTP."""


# Errors of an engine call that mean "this engine failed" (not "the model failed").
ENGINE_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, TimeoutError, EngineError)
# Idle upstream connections are dropped before the engine's own keep-alive timeout (uvicorn's
# and vLLM's is 5 s), so the router never sends on a connection the engine is closing.
KEEPALIVE_S = 4.0
_JSON = {"content-type": "application/json"}
CONNECT_TIMEOUT = 2.0
# Idle connections kept per engine (more are closed when they come back).
MAX_IDLE = 1000


@dataclass
class Reply:
    """A whole (non-streamed) engine response: what the gateway reads of an aiohttp one."""

    status: int
    body: bytes

    async def read(self) -> bytes:
        """The body (already read)."""
        return self.body


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to an engine; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Reply] | None = None
        self.chunks: list[bytes] = []
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
        except httptools.HttpParserError as exc:
            self._fail(EngineError(f"invalid HTTP response: {exc}"))

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(Reply(self.parser.get_status_code(), b"".join(self.chunks)))
        self.chunks = []
        if not self.parser.should_keep_alive():
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

    The non-streamed calls, the gateway's hot path: aiohttp costs ~0.2 ms of CPU per call
    here and this ~0.05 ms (httptools parses; BENCHMARKS.md, Router). Streamed calls, probes
    and https engines stay on aiohttp. Errors are EngineError or TimeoutError (in
    ENGINE_ERRORS), as aiohttp's are for the gateway: it fails over to the next engine.
    """

    def __init__(self, *, timeout: float) -> None:
        self.timeout = timeout
        self._idle: dict[tuple[str, int], deque[_Connection]] = {}
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
        idle = self._idle.get((host, port))
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: least likely to be closing
            if not conn.lost and now - conn.idle_since < KEEPALIVE_S:
                return conn
            conn.close()
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
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s"
            % ((target.prefix + path).encode(), target.authority, len(body), body)
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
            conn.idle_since = time.monotonic()
            idle = self._idle.setdefault((host, port), deque())
            if len(idle) < MAX_IDLE:
                idle.append(conn)
            else:
                conn.close()
        return reply

    def close(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            while idle:
                idle.pop().close()


class EnginePool:
    """The engines (round robin, preferring engines that are up and serve the wanted model).

    Whole (non-streamed) calls to plain-HTTP engines go through EngineClient, streams and
    probes through one aiohttp session; both keep connections alive (on the 2-core box httpx
    cost 0.7-1.7 ms of CPU per call, aiohttp 0.2-0.5 ms, EngineClient 0.05 ms; BENCHMARKS.md,
    Router).
    """

    def __init__(self, urls: list[str], *, timeout: float = 120.0):
        if not urls:
            raise ValueError("no engine URLs configured (CFT_ENGINE_URLS)")
        self.engines = [EngineState.parse(u) for u in urls]
        self._turn = itertools.count()
        self.timeout = aiohttp.ClientTimeout(
            total=None, connect=10.0, sock_connect=2.0, sock_read=timeout
        )
        self._session: aiohttp.ClientSession | None = None
        self.client = EngineClient(timeout=timeout)

    async def post(
        self, engine: EngineState, path: str, body: bytes, *, stream: bool
    ) -> aiohttp.ClientResponse | Reply:
        """POST a JSON body to an engine; returns once the status line and headers are in.

        Whole responses from plain-HTTP engines go through the lean client (the body is read
        too); streams and https engines through aiohttp (the body is read later).
        """
        if not stream and self.client.target(engine.url) is not None:
            return await self.client.post(engine.url, path, body)
        return await self.session.post(engine.url + path, data=body, headers=_JSON)

    @property
    def session(self) -> aiohttp.ClientSession:
        """The HTTP session (created on first use, inside the running event loop)."""
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=1000, limit_per_host=0, keepalive_timeout=KEEPALIVE_S, ttl_dns_cache=60
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self.timeout,
                # A proxy for many tenants must never replay one caller's cookies to the next.
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    @property
    def urls(self) -> list[str]:
        """The engine base URLs."""
        return [e.url for e in self.engines]

    def order(self, model: str | None) -> list[EngineState]:
        """Engines to try, best first: up before down, serving `model` before not."""
        n = len(self.engines)
        start = next(self._turn) % n
        rotated = self.engines[start:] + self.engines[:start]
        if n == 1:
            return rotated
        return sorted(rotated, key=lambda e: (not e.up, model is not None and not e.has(model)))

    async def probe(self, engine: EngineState) -> bool:
        """Read the engine's /v1/models now (a LoRAX engine: its /health, and no adapter until
        the reconciler staged one); False (and marked down) if it does not answer."""
        path = "/health" if engine.kind == "lorax" else "/v1/models"
        try:
            async with self.session.get(
                engine.url + path, timeout=aiohttp.ClientTimeout(total=2.0)
            ) as resp:
                resp.raise_for_status()
                raw = await resp.read()
                payload = orjson.loads(raw) if engine.kind != "lorax" else None
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
            engine.mark_down()
            return False
        if engine.kind == "lorax":
            engine.models = engine.models or frozenset()
        else:
            engine.models = model_ids(payload)
        return True

    async def close(self) -> None:
        """Close the HTTP clients."""
        self.client.close()
        if self._session is not None:
            await self._session.close()
