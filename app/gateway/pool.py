"""The engines behind the router: which to try first, and the HTTP calls to them.

Each engine is an EngineState (app/engines/state.py) driven by its kind (app/engines): the
pool probes it and posts to it; what a call's body says, and what its answer means, is the
kind's (app/gateway/upstream.py asks it).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import orjson

from app.engines.kinds import kind_of
from app.engines.state import EngineState, model_ids
from app.gateway.client import KEEPALIVE_S, EngineClient, EngineError, EngineResponse

# Errors of an engine call that mean "this engine failed" (not "the model failed").
ENGINE_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, TimeoutError, EngineError)
_JSON = {"content-type": "application/json"}


@dataclass(slots=True)
class SessionReply:
    """An answer through the aiohttp session (a stream, or an https engine's): an
    EngineResponse whose body is read after its status line and headers."""

    response: aiohttp.ClientResponse

    @property
    def status(self) -> int:
        """The HTTP status."""
        return self.response.status

    async def read(self) -> bytes:
        """The whole body."""
        return await self.response.read()

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        return self.response.content.iter_any()

    def finish(self) -> None:
        """Release the connection to the session's pool when the body was read to its end,
        else close it (the engine stops generating)."""
        if self.response.content.at_eof():
            self.response.release()
        else:
            self.response.close()


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
    ) -> EngineResponse:
        """POST a JSON body to an engine; returns once the status line and headers are in.

        Whole responses from plain-HTTP engines go through the lean client (the body is read
        too); streams and https engines through aiohttp (the body is read later).
        """
        if not stream and self.client.target(engine.url) is not None:
            return await self.client.post(engine.url, path, body)
        return SessionReply(await self.session.post(engine.url + path, data=body, headers=_JSON))

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
        """Read what the engine serves now (its kind's probe: /v1/models; a kind that lists no
        models, /health, and no adapter until the reconciler staged one); False (and marked
        down) if it does not answer."""
        kind = kind_of(engine.kind)
        try:
            async with self.session.get(
                engine.url + kind.probe_path, timeout=aiohttp.ClientTimeout(total=2.0)
            ) as resp:
                resp.raise_for_status()
                raw = await resp.read()
                payload = orjson.loads(raw) if kind.lists_models else None
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
            engine.mark_down()
            return False
        if kind.lists_models:
            engine.models = model_ids(payload)
        else:
            engine.models = engine.models or frozenset()
        return True

    async def close(self) -> None:
        """Close the HTTP clients."""
        self.client.close()
        if self._session is not None:
            await self._session.close()
