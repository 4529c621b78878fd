"""API keys and roles: `Authorization: Bearer <key>` resolves to a tenant and a role.

Keys are 256-bit random strings shown once; only their sha256 is stored (a slow hash adds
nothing for keys with this much entropy, and verification stays one index lookup).
Tenant keys have one of ROLES and act for their tenant; an operator key (role OPERATOR, no
tenant) administers tenants (/v1/tenants) and nothing else, and a tenant key never does that.
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
from app.core.ratelimit import RateLimits

ROLES = ("ingest", "client", "trainer", "release", "reader", "admin")
OPERATOR = "operator"  # platform-wide; not one of a tenant's ROLES
KEY_PREFIX = "cft_"


@dataclass(frozen=True)
class ApiKey:
    """The authenticated caller."""

    id: int
    tenant_id: int
    role: str
    prefix: str


@dataclass(frozen=True)
class OperatorKey:
    """An authenticated operator (platform-wide, no tenant)."""

    id: int
    prefix: str
    name: str | None

    @property
    def actor(self) -> str:
        """How the audit names this operator."""
        return f"operator key {self.prefix}" + (f" ({self.name})" if self.name else "")


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


def create_operator_key(conn: Connection, *, name: str | None = None) -> str:
    """Store a new operator key and return it (the only time it is visible)."""
    key, prefix = generate_key()
    conn.execute(
        "INSERT INTO auth.api_key (tenant_id, role, prefix, key_hash, name)"
        " VALUES (NULL, %s, %s, %s, %s)",
        (OPERATOR, prefix, hash_key(key), name),
    )
    return key


# The live key of a hash, and its last use recorded in the same round trip: last_used_at moves
# at most once a minute per key (a write per request would make every key lookup a row update),
# so it says "used in this minute", which is what finding idle keys to revoke needs.
_FIND_AND_TOUCH = """
WITH k AS (
  SELECT id, tenant_id, role, prefix, name, last_used_at FROM auth.api_key
   WHERE key_hash = %s AND revoked_at IS NULL{only_tenant}
), touched AS (
  UPDATE auth.api_key a SET last_used_at = now()
    FROM k
   WHERE a.id = k.id AND (k.last_used_at IS NULL OR k.last_used_at < now() - interval '1 minute')
)
SELECT id, tenant_id, role, prefix, name FROM k
"""
_FIND = _FIND_AND_TOUCH.format(only_tenant="")
_LOOKUP = _FIND_AND_TOUCH.format(only_tenant=" AND tenant_id IS NOT NULL")


def _find(conn: Connection, key: str) -> dict[str, Any] | None:
    row: dict[str, Any] | None = conn.execute(_FIND, (hash_key(key),)).fetchone()
    return row


def lookup(conn: Connection, key: str) -> ApiKey | None:
    """The live tenant key matching key, or None (unknown, revoked or an operator key); notes
    its use (auth.api_key.last_used_at, to the minute)."""
    row = conn.execute(_LOOKUP, (hash_key(key),)).fetchone()
    if row is None:
        return None
    return ApiKey(id=row["id"], tenant_id=row["tenant_id"], role=row["role"], prefix=row["prefix"])


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized(
            "missing API key: send 'Authorization: Bearer <key>' (create one with `cft key create`)"
        )
    return token.strip()


def limits_of(request: Request) -> RateLimits | None:
    """The app's rate limits (None in an app built without them)."""
    return getattr(request.app.state, "limits", None)


def _checked(request: Request, pool: Pool) -> dict[str, Any]:
    """The live key row of the request's bearer key: 401 unknown or revoked, 429 over a rate
    (failed checks per client address, then requests per key and tenant)."""
    token = _bearer(request)
    limits = limits_of(request)
    digest = hash_key(token)
    client = request.client.host if request.client else None
    if limits is not None and limits.known_bad(digest):
        limits.failed(digest, client)
        raise Unauthorized("invalid or revoked API key")
    with database_required(), pool.connection() as conn:
        row = _find(conn, token)
    if row is None:
        if limits is not None:
            limits.failed(digest, client)
        raise Unauthorized("invalid or revoked API key")
    if limits is not None:
        limits.admit(row["id"], row["tenant_id"])
    return row


def authenticate(request: Request, pool: Annotated[Pool, Depends(get_pool)]) -> ApiKey:
    """Resolve the bearer key of the request (401 if missing, unknown or revoked; 429 over a
    rate limit)."""
    row = _checked(request, pool)
    if row["tenant_id"] is None:
        raise Forbidden(
            "this is an operator key: it administers tenants (/v1/tenants) and cannot act for"
            " a tenant; use a key of the tenant (POST /v1/tenants/{name}/keys)"
        )
    key = ApiKey(id=row["id"], tenant_id=row["tenant_id"], role=row["role"], prefix=row["prefix"])
    request.state.api_key = key
    return key


def operator_key(request: Request, pool: Annotated[Pool, Depends(get_pool)]) -> OperatorKey:
    """Admit operator keys only (401 if missing, unknown or revoked; 403 for a tenant key)."""
    row = _checked(request, pool)
    if row["role"] != OPERATOR:
        raise Forbidden(
            f"this endpoint needs an operator key (`cft operator key create`); yours is a key"
            f" of a tenant with role {row['role']}"
        )
    return OperatorKey(id=row["id"], prefix=row["prefix"], name=row["name"])


# Read by the role sweep (tests/integration/test_security.py), as require()'s are.
operator_key.roles = frozenset({OPERATOR})  # type: ignore[attr-defined]


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
OperatorAuth = Annotated[OperatorKey, Depends(operator_key)]
# scope="function": the transaction commits before the response is sent, so a 2xx is only
# ever sent for work that is committed (FastAPI's default tears down after sending).
TenantConn = Annotated[Connection, Depends(tenant_conn, scope="function")]

__all__: list[Any] = [
    "OPERATOR",
    "ROLES",
    "AdminKey",
    "ApiKey",
    "IngestKey",
    "OperatorAuth",
    "OperatorKey",
    "ReaderKey",
    "ReleaseKey",
    "TenantConn",
    "TrainerKey",
    "create_key",
    "create_operator_key",
    "lookup",
    "require",
]
