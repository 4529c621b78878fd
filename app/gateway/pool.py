"""The engines behind the router: which to try first, and the HTTP calls to them.

Each engine is an EngineState (app/engines/state.py) driven by its kind (app/engines): the
pool probes it and posts to it; what a call's body says, and what its answer means, is the
kind's (app/gateway/upstream.py asks it).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import orjson

from app.core.http1 import KEEPALIVE_S
from app.engines.base import base_ids
from app.engines.kinds import kind_of
from app.engines.placement import affinity
from app.engines.state import EngineState, model_ids
from app.gateway.client import EngineClient, EngineError, EngineResponse

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


@dataclass(slots=True)
class Counted:
    """An engine's answer that holds one of its engine's in-flight slots until finished."""

    inner: EngineResponse
    engine: EngineState
    done: bool = False

    @property
    def status(self) -> int:
        """The HTTP status."""
        return self.inner.status

    async def read(self) -> bytes:
        """The whole body."""
        return await self.inner.read()

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        return self.inner.chunks()

    def finish(self) -> None:
        """Finish the inner answer and free the slot (once)."""
        try:
            self.inner.finish()
        finally:
            if not self.done:
                self.done = True
                self.engine.inflight -= 1


class EnginePool:
    """The engines: for an adapter, by rendezvous hashing (a hot one spread over its first two
    engines, least busy first); for the base model, round robin; always preferring engines that
    are up and serve the wanted model.

    Whole (non-streamed) calls to plain-HTTP engines go through EngineClient, streams and
    probes through one aiohttp session; both keep connections alive (on the 2-core box httpx
    cost 0.7-1.7 ms of CPU per call, aiohttp 0.2-0.5 ms, EngineClient 0.05 ms; BENCHMARKS.md,
    Router).
    """

    def __init__(self, urls: list[str], *, timeout: float = 120.0, slack: int = 8):
        if not urls:
            raise ValueError("no engine URLs configured (CFT_ENGINE_URLS)")
        self.engines = [EngineState.parse(u) for u in urls]
        self._turn = itertools.count()
        self.slack = slack
        self._refreshing: asyncio.Future[list[bool]] | None = None
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
        engine.inflight += 1
        try:
            if not stream and self.client.target(engine.url) is not None:
                reply: EngineResponse = await self.client.post(engine.url, path, body)
            else:
                reply = SessionReply(
                    await self.session.post(engine.url + path, data=body, headers=_JSON)
                )
        except BaseException:
            engine.inflight -= 1
            raise
        return Counted(reply, engine)

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

    def order(
        self,
        model: str | None,
        *,
        adapter: bool = False,
        base: str | None = None,
        spread: bool = False,
    ) -> list[EngineState]:
        """Engines to try, best first, among those serving `base` (all when None or when an
        engine does not say its base): up before down, serving `model` before not; then, for
        an adapter, its rendezvous order (app/engines/placement.py, the order the reconciler
        places it by; the second engine first when the first has more than `slack` more calls
        in flight, or, for an adapter `spread` over its first two (widened), when it has fewer
        calls in flight, turn about when they have as many), else round robin."""
        engines = self.engines
        if base is not None:
            engines = [e for e in engines if e.serves_base(base)]
        n = len(engines)
        if n <= 1:
            return list(engines)
        if not adapter or model is None:
            start = next(self._turn) % n
            rotated = engines[start:] + engines[:start]
            return sorted(rotated, key=lambda e: (not e.up, model is not None and not e.has(model)))
        ranked = sorted(
            engines, key=lambda e: (not e.up, not e.has(model), -affinity(e.url, model))
        )
        first, second = ranked[0], ranked[1]
        same_footing = (first.up, first.has(model)) == (second.up, second.has(model))
        if not same_footing:
            return ranked
        if spread and first.up and first.has(model):
            if first.inflight == second.inflight:
                swap = next(self._turn) % 2 == 1
            else:
                swap = second.inflight < first.inflight
        else:
            swap = first.inflight > second.inflight + self.slack
        if swap:
            ranked[0], ranked[1] = second, first
        return ranked

    async def refresh(self) -> None:
        """Probe every engine that is up, once for all callers waiting at the same time."""
        task = self._refreshing
        if task is None or task.done():
            up = [e for e in self.engines if e.up]
            task = asyncio.ensure_future(asyncio.gather(*(self.probe(e) for e in up)))
            self._refreshing = task
        await asyncio.shield(task)

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
            listed = model_ids(payload)
            engine.bases = base_ids(payload) or engine.bases
            engine.resident = listed
            if kind.keeps_evicted and engine.models is not None:
                engine.models |= listed  # what it evicted stays callable
            else:
                engine.models = set(listed)
        elif engine.models is None:
            engine.models = set()
        return True

    async def close(self) -> None:
        """Close the HTTP clients."""
        self.client.close()
        if self._session is not None:
            await self._session.close()
