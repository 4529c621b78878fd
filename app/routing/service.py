"""The router's runtime: route table, engine pool and log writer, started with the app."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from app.core.config import Settings
from app.core.db import Pool, as_tenant
from app.core.pseudonym import user_hash, user_secret
from app.logs import service as logs
from app.routing.gateway import EnginePool
from app.routing.logwriter import LogWriter
from app.routing.table import RouteTable

TENANT_KEY = "_tenant_id"


@dataclass
class RouterRuntime:
    """Everything the gateway needs at request time."""

    table: RouteTable
    engines: EnginePool
    writer: LogWriter
    secret: bytes

    def hash_user(self, user: str) -> bytes:
        """The user's pseudonym (also the key of the canary split)."""
        return user_hash(user, self.secret)


def write_batch_for(pool: Pool, settings: Settings) -> Any:
    """A LogWriter sink: one transaction per tenant, idempotent by request_id."""

    def write(batch: list[dict[str, Any]]) -> None:
        by_tenant: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for record in batch:
            rec = dict(record)
            by_tenant[int(rec.pop(TENANT_KEY))].append(rec)
        with pool.connection() as conn:
            for tenant_id, records in by_tenant.items():
                with conn.transaction():
                    as_tenant(conn, tenant_id)
                    logs.log_records(conn, tenant_id=tenant_id, records=records, settings=settings)

    return write


def start(settings: Settings, *, db_url: str, pool: Pool, engine_urls: list[str]) -> RouterRuntime:
    """Start the route listener and the log writer (call inside the running event loop)."""
    table = RouteTable(db_url, ttl=settings.route_cache_ttl)
    table.start()
    writer = LogWriter(write_batch_for(pool, settings))
    writer.start()
    return RouterRuntime(table, EnginePool(engine_urls), writer, user_secret(settings))


async def stop(runtime: RouterRuntime) -> None:
    """Flush the logs, stop listening, close the engine client."""
    await runtime.writer.close()
    runtime.table.stop()
    await runtime.engines.close()
