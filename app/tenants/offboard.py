"""Offboarding a tenant: its rows in the database, its adapters' artefacts in the store.

The database part is SQL (sql/auth/tenant_offboarding.sql); this module runs its steps, each
in a transaction of its own, and deletes the artefacts the database listed:

1. auth.offboard_tenant_prepare: keys revoked, loop disabled, runs cancelled, canary and prod
   adapters retired. Committed, so the reconciler (NOTIFY cft_adapter) unloads them.
2. Wait until no engine has one of the tenant's adapters loaded (serve.adapter_deployment, as
   the reconciler records it), at most unload_timeout seconds; else Conflict (409), unless
   force (the operator knows the engines are gone).
3. auth.offboard_tenant: every row deleted, counts and pending artefact URIs recorded, the
   tenant deleted, in one transaction.
4. Each pending artefact is deleted from its store and ticked off, one commit each.

Every step is idempotent: calling again after a crash, or after a store error left artefacts
pending, finishes the job (the tenant's name then finds the open audit row).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from app.core import artefacts
from app.core.config import Settings
from app.core.db import Connection
from app.core.errors import Conflict, NotFound, Unprocessable
from app.tenants.schemas import ArtefactsOut, OffboardingOut

# How often the unload wait looks at serve.adapter_deployment.
POLL_S = 0.2


@contextmanager
def _step(conn: Connection) -> Iterator[Connection]:
    """One committed transaction (the connection must not be inside one already)."""
    with conn.transaction():
        yield conn


def _find_open(conn: Connection, ref: str) -> dict[str, Any] | None:
    """The latest offboarding of a tenant that no longer exists, by its name or id."""
    row: dict[str, Any] | None = conn.execute(
        "SELECT * FROM auth.tenant_offboarding WHERE tenant_name = %s OR tenant_id::text = %s"
        " ORDER BY id DESC LIMIT 1",
        (ref, ref),
    ).fetchone()
    return row


def loaded(conn: Connection, tenant_id: int) -> list[dict[str, Any]]:
    """The tenant's adapters that an engine still has loaded."""
    return conn.execute(
        "SELECT adapter_id, engine_url FROM auth.offboard_tenant_loaded(%s)", (tenant_id,)
    ).fetchall()


def delete_artefact(uri: str, settings: Settings) -> None:
    """Delete one stored artefact version by its URI (a missing one is already deleted)."""
    store: artefacts.LocalStore | artefacts.S3Store
    if uri.startswith("file://"):
        store = artefacts.LocalStore(settings.artefact_path)
        try:
            route, version = Path(uri[len("file://") :]).resolve().relative_to(store.root).parts
        except ValueError:
            raise artefacts.ArtefactError(
                f"{uri} is not a version of the local store at {store.root} (CFT_ARTEFACT_DIR):"
                " delete it by hand"
            ) from None
        stored_uri = (store.root / route / version).as_uri()
    elif uri.startswith("s3://"):
        store = artefacts.S3Store.from_settings(settings)
        bucket, _, rest = uri[len("s3://") :].partition("/")
        parts = [p for p in rest.split("/") if p]
        if bucket != store.bucket or len(parts) != 2:
            raise artefacts.ArtefactError(
                f"{uri} is not a version of s3://{store.bucket}/ (CFT_S3_BUCKET): delete it by hand"
            )
        route, version = parts
        stored_uri = f"s3://{bucket}/{route}/{version}/"
    else:
        raise artefacts.ArtefactError(f"unsupported artefact URI {uri!r}: delete it by hand")
    store.delete(artefacts.StoredVersion(route, version, stored_uri, datetime.now(UTC)))


def offboard(
    conn: Connection,
    *,
    tenant: str,
    actor: str,
    settings: Settings,
    force: bool = False,
    unload_timeout: float = 30.0,
) -> OffboardingOut:
    """Offboard a tenant (by name or id), or finish an offboarding begun earlier; the report.

    conn must be outside a transaction: each step commits on its own (the retirement must be
    seen by the reconciler before the rows go). NotFound when no such tenant exists nor ever
    was offboarded; Conflict when its adapters stay loaded past unload_timeout.
    """
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError(
            "offboard() commits its own steps: pass a connection outside a transaction"
        )
    with _step(conn):
        t: dict[str, Any] | None = conn.execute(
            "SELECT id, name FROM tenant WHERE name = %s OR id::text = %s", (tenant, tenant)
        ).fetchone()
        row = None if t is not None else _find_open(conn, tenant)
    if t is None and row is None:
        raise NotFound(f"no tenant {tenant!r} (see GET /v1/tenants or `cft tenant list`)")
    if t is not None:
        with _step(conn):
            conn.execute(
                "SELECT * FROM auth.offboard_tenant_prepare(%s, %s)", (t["id"], actor)
            ).fetchone()
        deadline = time.monotonic() + max(0.0, unload_timeout)
        while True:
            with _step(conn):
                still = loaded(conn, t["id"])
            if not still or force or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        if still and not force:
            where = ", ".join(f"{r['adapter_id']} on {r['engine_url']}" for r in still)
            raise Conflict(
                f"tenant {t['name']!r}: its adapters are retired but still loaded ({where})"
                f" after {unload_timeout:g} s. The reconciler unloads retired adapters on its"
                " next pass (on NOTIFY, and every CFT_RECONCILE_INTERVAL seconds): call again"
                " when it has, or pass force=true if those engines are gone for good. Its keys"
                " are already revoked.",
                code="adapters_still_loaded",
            )
        try:
            with _step(conn):
                row = conn.execute(
                    "SELECT * FROM auth.offboard_tenant(%s, %s, %s)", (t["id"], actor, force)
                ).fetchone()
        except pg_errors.ObjectNotInPrerequisiteState as exc:
            raise Conflict(f"tenant {t['name']!r}: {exc.diag.message_primary}") from exc
    assert row is not None
    errors: list[str] = []
    for uri in list(row["artefacts_pending"]):
        try:
            delete_artefact(uri, settings)
        except artefacts.ArtefactError as exc:
            errors.append(str(exc))
            continue
        with _step(conn):
            row = conn.execute(
                "SELECT * FROM auth.offboard_artefact_deleted(%s, %s)", (row["id"], uri)
            ).fetchone()
        assert row is not None
    return report(row, errors)


def report(row: dict[str, Any], errors: list[str] | None = None) -> OffboardingOut:
    """The API's view of an auth.tenant_offboarding row."""
    return OffboardingOut(
        id=row["id"],
        tenant=row["tenant_name"],
        tenant_id=row["tenant_id"],
        status=row["status"],
        requested_by=row["requested_by"],
        retired_adapters=list(row["retired_adapters"]),
        forced=row["forced"],
        counts=dict(row["counts"]),
        artefacts=ArtefactsOut(
            deleted=list(row["artefacts_deleted"]),
            pending=list(row["artefacts_pending"]),
            errors=errors or [],
        ),
        started_at=row["started_at"],
        data_deleted_at=row["data_deleted_at"],
        finished_at=row["finished_at"],
    )


def check_confirmation(tenant: str, confirm: str | None) -> None:
    """Unprocessable unless confirm repeats the tenant exactly (a guard against a slip)."""
    if confirm != tenant:
        raise Unprocessable(
            f"offboarding deletes every row and artefact of tenant {tenant!r}: repeat its name"
            f" as ?confirm={tenant} to confirm",
            param="confirm",
        )
