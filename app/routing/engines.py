"""The engines behind the router and what each one has loaded.

`EngineState.models` is the set of names the engine serves, as last seen on its /v1/models
(refreshed by every reconciler pass, and trimmed at once when the engine answers 404 for one).
The gateway only sends an adapter name to an engine whose set contains it (invariant 8: never
route to an adapter that is not loaded); `None` means not probed yet.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import aiohttp
import orjson

# An engine that refused a connection or timed out is skipped for this long.
DOWN_FOR = 2.0


@dataclass
class EngineState:
    """One engine: its URL, the models it serves, and whether it looks down."""

    url: str
    models: frozenset[str] | None = None
    down_until: float = 0.0

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


# Errors of an engine call that mean "this engine failed" (not "the model failed").
ENGINE_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, TimeoutError)
# Idle upstream connections are dropped before the engine's own keep-alive timeout (uvicorn's
# and vLLM's is 5 s), so the router never sends on a connection the engine is closing.
KEEPALIVE_S = 4.0


class EnginePool:
    """The engines (round robin, preferring engines that are up and serve the wanted model).

    Calls go through one aiohttp session with a keep-alive pool (on the 2-core box httpx cost
    0.7-1.7 ms of CPU per call, aiohttp 0.2-0.5 ms; BENCHMARKS.md, Router).
    """

    def __init__(self, urls: list[str], *, timeout: float = 120.0):
        if not urls:
            raise ValueError("no engine URLs configured (CFT_ENGINE_URLS)")
        self.engines = [EngineState(u.rstrip("/")) for u in urls]
        self._turn = itertools.count()
        self.timeout = aiohttp.ClientTimeout(
            total=None, connect=10.0, sock_connect=2.0, sock_read=timeout
        )
        self._session: aiohttp.ClientSession | None = None

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
        """Read the engine's /v1/models now; False (and marked down) if it does not answer."""
        try:
            async with self.session.get(
                engine.url + "/v1/models", timeout=aiohttp.ClientTimeout(total=2.0)
            ) as resp:
                resp.raise_for_status()
                payload = orjson.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
            engine.mark_down()
            return False
        engine.models = model_ids(payload)
        return True

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
