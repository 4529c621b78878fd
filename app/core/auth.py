"""API keys and roles: `Authorization: Bearer <key>` resolves to a tenant and a role.

Keys are 256-bit random strings shown once; only their sha256 is stored (a slow hash adds
nothing for keys with this much entropy, and verification stays one index lookup).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request

from app.core.db import Connection, Pool, as_tenant
from app.core.deps import get_pool
from app.core.errors import Forbidden, Unauthorized, database_required

ROLES = ("ingest", "client", "trainer", "release", "reader", "admin")
KEY_PREFIX = "cft_"


@dataclass(frozen=True)
class ApiKey:
    """The authenticated caller."""

    id: int
    tenant_id: int
    role: str
    prefix: str


def hash_key(key: str) -> bytes:
    """The stored form of a key."""
    return hashlib.sha256(key.encode()).digest()


def generate_key() -> tuple[str, str]:
    """A new key and its display prefix."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, key[:12]


def create_key(conn: Connection, *, tenant_id: int, role: str, name: str | None = None) -> str:
    """Store a new key for a tenant and return it (the only time it is visible)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}: choose one of {', '.join(ROLES)}")
    key, prefix = generate_key()
    conn.execute(
        "INSERT INTO auth.api_key (tenant_id, role, prefix, key_hash, name)"
        " VALUES (%s, %s, %s, %s, %s)",
        (tenant_id, role, prefix, hash_key(key), name),
    )
    return key


def lookup(conn: Connection, key: str) -> ApiKey | None:
    """The live key matching key, or None (unknown or revoked)."""
    row = conn.execute(
        "SELECT id, tenant_id, role, prefix FROM auth.api_key"
        " WHERE key_hash = %s AND revoked_at IS NULL",
        (hash_key(key),),
    ).fetchone()
    return ApiKey(**row) if row else None


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized(
            "missing API key: send 'Authorization: Bearer <key>' (create one with `cft key create`)"
        )
    return token.strip()


def authenticate(request: Request, pool: Annotated[Pool, Depends(get_pool)]) -> ApiKey:
    """Resolve the bearer key of the request (401 if missing, unknown or revoked)."""
    token = _bearer(request)
    with database_required(), pool.connection() as conn:
        key = lookup(conn, token)
    if key is None:
        raise Unauthorized("invalid or revoked API key")
    request.state.api_key = key
    return key


def require(*roles: str) -> Callable[..., ApiKey]:
    """A dependency that admits keys with one of roles (admin is always admitted)."""
    allowed = frozenset(roles) | {"admin"}

    def dependency(key: Annotated[ApiKey, Depends(authenticate)]) -> ApiKey:
        if key.role not in allowed:
            raise Forbidden(
                f"this endpoint needs a key with role {' or '.join(sorted(allowed))};"
                f" yours has role {key.role}"
            )
        return key

    # Read by the role sweep (tests/integration/test_security.py): every endpoint's roles.
    dependency.roles = allowed  # type: ignore[attr-defined]
    return dependency


def tenant_conn(
    key: Annotated[ApiKey, Depends(authenticate)], pool: Annotated[Pool, Depends(get_pool)]
) -> Iterator[Connection]:
    """One transaction scoped to the caller's tenant by row-level security."""
    with database_required(), pool.connection() as conn, conn.transaction():
        as_tenant(conn, key.tenant_id)
        yield conn


IngestKey = Annotated[ApiKey, Depends(require("ingest", "client"))]
TrainerKey = Annotated[ApiKey, Depends(require("trainer"))]
ReleaseKey = Annotated[ApiKey, Depends(require("release"))]
ReaderKey = Annotated[ApiKey, Depends(require("reader", "trainer", "release"))]
AdminKey = Annotated[ApiKey, Depends(require())]
# scope="function": the transaction commits before the response is sent, so a 2xx is only
# ever sent for work that is committed (FastAPI's default tears down after sending).
TenantConn = Annotated[Connection, Depends(tenant_conn, scope="function")]

__all__: list[Any] = [
    "ROLES",
    "AdminKey",
    "ApiKey",
    "IngestKey",
    "ReaderKey",
    "ReleaseKey",
    "TenantConn",
    "TrainerKey",
    "create_key",
    "lookup",
    "require",
]
