"""The control plane and router: one FastAPI application."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app import __version__, health
from app.adapters import api as adapters_api
from app.core import errors
from app.core.config import Settings, get_settings
from app.core.db import api_database_url, database_url, make_pool
from app.core.limits import BodyLimitMiddleware
from app.core.metrics import MetricsMiddleware, serve_metrics
from app.core.ratelimit import RateLimits
from app.dashboard import api as dashboard_api
from app.dashboard.layout import DashboardHeaders
from app.datasets import api as datasets_api
from app.evals import api as evals_api
from app.experiments import api as experiments_api
from app.finetuning import api as finetuning_api
from app.gateway import api as gateway_api
from app.gateway import fastpath
from app.gateway import service as gateway
from app.gateway.service import ReconcilerFactory
from app.logs import api as logs_api
from app.loop import api as loop_api
from app.otel import api as otel_api
from app.privacy import api as privacy_api
from app.routes import api as routes_api
from app.tenants import api as tenants_api
from app.training import api as training_api


def create_app(
    settings: Settings | None = None,
    *,
    db_url: str | None = None,
    engine_urls: list[str] | None = None,
    reconciler: ReconcilerFactory | None = None,
) -> FastAPI:
    """Build the application; the pool (and the router, given engines) start with it.

    reconciler: what runs beside the router to load adapters into its engines; the API
    process passes workers.reconciler's (cft/serve.py). Without one, adapters are loaded by
    a `cft worker reconcile` elsewhere.
    """
    settings = settings or get_settings()
    engines = engine_urls if engine_urls is not None else settings.engine_url_list

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The whole API process logs in as cft_api, never as the schema's superuser.
        url = api_database_url(db_url or database_url(settings), settings)
        app.state.settings = settings
        app.state.db_url = url
        app.state.pool = make_pool(url, size=settings.db_pool_size)
        app.state.router = None
        stop_metrics = (
            serve_metrics(settings.metrics_host, settings.metrics_port)
            if settings.metrics_port
            else None
        )
        if engines:
            app.state.router = gateway.start(
                settings,
                db_url=url,
                pool=app.state.pool,
                engine_urls=engines,
                reconciler=reconciler,
            )
        try:
            yield
        finally:
            if app.state.router is not None:
                await gateway.stop(app.state.router)
            app.state.pool.close()
            if stop_metrics is not None:
                stop_metrics()

    app = FastAPI(
        title="cft",
        version=__version__,
        description="Continuous fine-tuning: traffic to datasets to adapters, gated in PostgreSQL.",
        lifespan=lifespan,
    )
    errors.install(app)
    app.state.limits = RateLimits(
        per_key=settings.rate_limit_per_key,
        per_tenant=settings.rate_limit_per_tenant,
        auth_failures=settings.rate_limit_auth_failures,
        bad_key_ttl=settings.router_key_cache_ttl,
    )
    # The gateway first: routes are matched in order, and its calls are the hot path.
    app.include_router(gateway_api.router)
    app.include_router(health.router)
    app.include_router(adapters_api.router)
    app.include_router(datasets_api.router)
    app.include_router(logs_api.router)
    app.include_router(otel_api.router)
    # Inside the gateway's fast path (added before = further in): its calls never pass here.
    app.add_middleware(DashboardHeaders)
    # Inside the body limit (added after = further out): the gateway's hot calls skip FastAPI's
    # per-request routing and dependency machinery, running the dependencies and handlers their
    # routes declare (fastpath.routes refuses, here, a declaration it would not honour).
    app.add_middleware(
        fastpath.GatewayFastPath, routes=fastpath.routes(app.routes, gateway_api.FAST_PATH)
    )
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        # Uploads, each with a limit of its own, streamed (app/core/limits.py).
        uploads={
            adapters_api.IMPORT_PATH: (
                settings.adapter_import_max_bytes,
                "CFT_ADAPTER_IMPORT_MAX_BYTES",
            ),
            # A fine-tuning file, and its multipart envelope.
            "/v1/files": (
                max(settings.max_body_bytes, settings.file_max_bytes + 64 * 1024),
                "CFT_FILE_MAX_BYTES",
            ),
        },
    )
    app.include_router(training_api.router)
    app.include_router(finetuning_api.router)
    app.include_router(evals_api.router)
    app.include_router(privacy_api.router)
    app.include_router(experiments_api.router)
    app.include_router(dashboard_api.router)
    app.include_router(routes_api.router)
    app.include_router(loop_api.router)
    app.include_router(tenants_api.router)
    app.add_middleware(MetricsMiddleware)  # added last = outermost: times everything inside
    return app
