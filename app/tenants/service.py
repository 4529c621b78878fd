"""Rules for tenants and API keys; callers pass an owner connection (no tenant scope)."""

from __future__ import annotations

from psycopg import errors as pg_errors

from app.core import auth
from app.core.db import Connection
from app.core.errors import Conflict, NotFound, Unprocessable
from app.tenants.schemas import KeyOut, TenantOut


def create_tenant(conn: Connection, *, name: str, consent_training: bool = False) -> TenantOut:
    """Create a tenant; Conflict if the name is taken, Unprocessable if it is malformed."""
    try:
        with conn.transaction():
            row = conn.execute(
                "INSERT INTO tenant (name, consent_training) VALUES (%s, %s) RETURNING *",
                (name, consent_training),
            ).fetchone()
    except pg_errors.UniqueViolation:
        raise Conflict(f"a tenant named {name!r} exists already") from None
    except pg_errors.CheckViolation:
        raise Unprocessable(
            f"tenant name {name!r} must be lower-case letters, digits, '_', '.' or '-'"
            " (up to 63, starting with a letter or digit)"
        ) from None
    assert row is not None
    return TenantOut.model_validate(row)  # no key yet: live_keys 0


_TENANT_COLUMNS = (
    "SELECT t.id, t.name, t.consent_training, t.created_at, t.updated_at,"
    " (SELECT count(*) FROM auth.api_key k WHERE k.tenant_id = t.id AND k.revoked_at IS NULL)"
    " AS live_keys FROM tenant t"
)


def list_tenants(conn: Connection) -> list[TenantOut]:
    """Every tenant with its number of live keys."""
    rows = conn.execute(_TENANT_COLUMNS + " ORDER BY t.id").fetchall()
    return [TenantOut.model_validate(r) for r in rows]


def describe_tenant(conn: Connection, ref: str) -> TenantOut:
    """One tenant (by name or id) with its number of live keys; NotFound if there is none."""
    row = conn.execute(
        _TENANT_COLUMNS + " WHERE t.name = %s OR t.id::text = %s", (ref, ref)
    ).fetchone()
    if row is None:
        raise NotFound(f"no tenant {ref!r} (see GET /v1/tenants or `cft tenant list`)")
    return TenantOut.model_validate(row)


def set_consent(conn: Connection, ref: str, *, consent_training: bool) -> TenantOut:
    """Give or withdraw a tenant's consent to training on its traffic.

    Snapshots and the loop's triggers read the consent when they run (train.create_snapshot),
    so a withdrawal holds for every snapshot taken after this commits.
    """
    t = get_tenant_or_raise(conn, ref)
    conn.execute(
        "UPDATE tenant SET consent_training = %s, updated_at = now() WHERE id = %s",
        (consent_training, t.id),
    )
    return describe_tenant(conn, str(t.id))


def get_tenant_or_raise(conn: Connection, ref: str) -> TenantOut:
    """A tenant by name or numeric id."""
    row = conn.execute(
        _TENANT_COLUMNS + " WHERE t.name = %s OR t.id::text = %s", (ref, ref)
    ).fetchone()
    if row is None:
        raise NotFound(f"no tenant {ref!r} (see `cft tenant list`)")
    return TenantOut.model_validate(row)


_KEY_COLUMNS = "id, role, prefix, name, created_at, revoked_at, last_used_at"


def create_key(
    conn: Connection, *, tenant: str, role: str, name: str | None = None
) -> tuple[KeyOut, str]:
    """A new key for a tenant: its row and the key itself (shown once)."""
    if role not in auth.ROLES:
        raise Unprocessable(f"unknown role {role!r}: choose one of {', '.join(auth.ROLES)}")
    t = get_tenant_or_raise(conn, tenant)
    key = auth.create_key(conn, tenant_id=t.id, role=role, name=name)
    row = conn.execute(
        "SELECT id, role, prefix, name, created_at FROM auth.api_key WHERE key_hash = %s",
        (auth.hash_key(key),),
    ).fetchone()
    assert row is not None
    return KeyOut.model_validate(row), key


def revoke_key(conn: Connection, ref: str) -> KeyOut:
    """Revoke a key by prefix or id; NotFound if no live key matches."""
    row = conn.execute(
        "UPDATE auth.api_key SET revoked_at = now()"
        " WHERE (prefix = %s OR id::text = %s) AND revoked_at IS NULL"
        f" RETURNING {_KEY_COLUMNS}",
        (ref, ref),
    ).fetchone()
    if row is None:
        raise NotFound(f"no live key with prefix or id {ref!r} (see `cft key list`)")
    return KeyOut.model_validate(row)


def revoke_tenant_key(conn: Connection, *, tenant: str, ref: str) -> KeyOut:
    """Revoke one key of a tenant by prefix or id; NotFound if the tenant has no such key."""
    t = get_tenant_or_raise(conn, tenant)
    row = conn.execute(
        "UPDATE auth.api_key SET revoked_at = coalesce(revoked_at, now())"
        " WHERE (prefix = %s OR id::text = %s) AND tenant_id = %s"
        " RETURNING id, role, prefix, name, created_at, revoked_at",
        (ref, ref, t.id),
    ).fetchone()
    if row is None:
        raise NotFound(f"tenant {t.name!r} has no key with prefix or id {ref!r}")
    return KeyOut.model_validate(row)


def create_operator_key(conn: Connection, *, name: str | None = None) -> tuple[KeyOut, str]:
    """A new operator key (platform-wide): its row and the key itself (shown once)."""
    key = auth.create_operator_key(conn, name=name)
    row = conn.execute(
        "SELECT id, role, prefix, name, created_at FROM auth.api_key WHERE key_hash = %s",
        (auth.hash_key(key),),
    ).fetchone()
    assert row is not None
    return KeyOut.model_validate(row), key


def list_operator_keys(conn: Connection) -> list[KeyOut]:
    """Every operator key (prefixes only)."""
    rows = conn.execute(
        f"SELECT {_KEY_COLUMNS} FROM auth.api_key WHERE tenant_id IS NULL ORDER BY id"
    ).fetchall()
    return [KeyOut.model_validate(r) for r in rows]


def list_keys(conn: Connection, *, tenant: str) -> list[KeyOut]:
    """A tenant's keys (never the key itself: only its prefix)."""
    t = get_tenant_or_raise(conn, tenant)
    rows = conn.execute(
        f"SELECT {_KEY_COLUMNS} FROM auth.api_key WHERE tenant_id = %s ORDER BY id", (t.id,)
    ).fetchall()
    return [KeyOut.model_validate(r) for r in rows]
