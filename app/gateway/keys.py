"""The gateway's API-key check: a database lookup, cached by the router runtime for a while."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

from fastapi import Depends, Request

from app.core.auth import ApiKey, hash_key, limits_of, lookup
from app.core.db import Pool
from app.core.deps import get_pool
from app.core.errors import DB_UNAVAILABLE, DatabaseUnavailable, Forbidden, Unauthorized
from app.gateway.request import get_runtime, header
from app.gateway.service import RouterRuntime
from app.gateway.tasks import background

log = logging.getLogger("cft.gateway.keys")

CLIENT_ROLES = frozenset({"ingest", "client", "admin"})


def _bearer(request: Request) -> str:
    scheme, _, token = (header(request, b"authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized(
            "missing API key: send 'Authorization: Bearer <key>' (create one with `cft key create`)"
        )
    return token.strip()


def _lookup_key(pool: Pool, token: str) -> ApiKey | None:
    with pool.connection(timeout=2.0) as conn:
        return lookup(conn, token)


async def _recheck_key(runtime: RouterRuntime, pool: Pool, token: str, digest: bytes) -> None:
    """Look a cached key up again in the background (its cache entry expired)."""
    key: ApiKey | None = None
    failed = True
    try:
        key = await asyncio.to_thread(_lookup_key, pool, token)
        failed = False
    except DB_UNAVAILABLE:
        log.warning("API key re-check failed: the database is unavailable")
    finally:
        runtime.key_checked(digest, key, failed=failed)


async def client_key(request: Request) -> ApiKey:
    """The caller's key (role ingest or client), cached by the router for a few seconds.

    A lookup costs a database round trip and a thread hop; the router keeps verified keys for
    CFT_ROUTER_KEY_CACHE_TTL seconds and then re-checks them in the background while still
    accepting them (RouterRuntime.cached_key), which bounds how long a revoked key still
    works. While PostgreSQL is down a key verified earlier is still accepted (nobody can
    revoke meanwhile).
    """
    token = _bearer(request)
    runtime = get_runtime(request)
    limits = limits_of(request)
    key: ApiKey | None = None
    digest = b""
    if runtime is not None:
        digest, key, recheck = runtime.cached_key(token)
        if recheck:
            background(_recheck_key(runtime, get_pool(request), token, digest))
    if key is None:
        digest = digest or hash_key(token)
        client = request.client.host if request.client else None
        if limits is not None and limits.known_bad(digest):
            limits.failed(digest, client)
            raise Unauthorized("invalid or revoked API key")
        try:
            key = await asyncio.to_thread(_lookup_key, get_pool(request), token)
        except DB_UNAVAILABLE as exc:
            stale = runtime.stale_key(digest) if runtime is not None else None
            if stale is None:
                raise DatabaseUnavailable() from exc
            key = stale
        if key is None:
            if limits is not None:
                limits.failed(digest, client)
            raise Unauthorized("invalid or revoked API key")
        if runtime is not None:
            runtime.remember_key(digest, key)
    if limits is not None:
        limits.admit(key.id, key.tenant_id)
    if key.role not in CLIENT_ROLES:
        raise Forbidden(
            f"this endpoint needs a key with role client or ingest; yours has role {key.role}"
        )
    request.state.api_key = key
    return key


ClientKey = Annotated[ApiKey, Depends(client_key)]
