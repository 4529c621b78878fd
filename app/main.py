"""The control plane and router: one FastAPI application."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response

from app import __version__, health
from app.core import errors
from app.core.config import Settings, get_settings
from app.core.db import database_url, make_pool
from app.core.metrics import HTTP_LATENCY, HTTP_REQUESTS


def create_app(settings: Settings | None = None, *, db_url: str | None = None) -> FastAPI:
    """Build the application; the pool opens on startup and closes on shutdown."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = db_url or database_url(settings)
        app.state.settings = settings
        app.state.db_url = url
        app.state.pool = make_pool(url, size=settings.db_pool_size)
        try:
            yield
        finally:
            app.state.pool.close()

    app = FastAPI(
        title="cft",
        version=__version__,
        description="Continuous fine-tuning: traffic to datasets to adapters, gated in PostgreSQL.",
        lifespan=lifespan,
    )
    errors.install(app)
    app.include_router(health.router)

    @app.middleware("http")
    async def _measure(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        HTTP_LATENCY.labels(request.method, path).observe(time.perf_counter() - start)
        HTTP_REQUESTS.labels(request.method, path, str(response.status_code)).inc()
        return response

    return app
