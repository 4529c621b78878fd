"""HTTP of the operator API: tenants, their consent and keys, and offboarding (/v1/tenants)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from app.core.auth import OperatorAuth
from app.core.db import Connection, Pool
from app.core.deps import get_pool
from app.core.errors import database_required
from app.tenants import offboard, schemas, service

router = APIRouter(tags=["tenants (operator)"])


def operator_conn(pool: Annotated[Pool, Depends(get_pool)]) -> Iterator[Connection]:
    """One transaction with no tenant scope (the operator acts on the platform)."""
    with database_required(), pool.connection() as conn, conn.transaction():
        yield conn


OperatorConn = Annotated[Connection, Depends(operator_conn, scope="function")]


@router.post("/v1/tenants", status_code=201, summary="Create a tenant")
def create_tenant(
    body: schemas.TenantIn, key: OperatorAuth, conn: OperatorConn
) -> schemas.TenantOut:
    """Create a tenant (409 if the name is taken)."""
    return service.create_tenant(conn, name=body.name, consent_training=body.consent_training)


@router.get("/v1/tenants", summary="List tenants")
def list_tenants(key: OperatorAuth, conn: OperatorConn) -> schemas.TenantList:
    """Every tenant with its number of live keys."""
    return schemas.TenantList(data=service.list_tenants(conn))


@router.get("/v1/tenants/{name}", summary="Read a tenant")
def read_tenant(name: str, key: OperatorAuth, conn: OperatorConn) -> schemas.TenantOut:
    """One tenant, by name or id."""
    return service.describe_tenant(conn, name)


@router.patch("/v1/tenants/{name}", summary="Set a tenant's consent to training")
def patch_tenant(
    name: str, body: schemas.TenantPatch, key: OperatorAuth, conn: OperatorConn
) -> schemas.TenantOut:
    """Give or withdraw consent_training; snapshots taken afterwards follow it."""
    return service.set_consent(conn, name, consent_training=body.consent_training)


@router.post("/v1/tenants/{name}/keys", status_code=201, summary="Create a key of a tenant")
def create_key(
    name: str, body: schemas.KeyIn, key: OperatorAuth, conn: OperatorConn
) -> schemas.KeyCreated:
    """A new key; the response holds the key itself, this once (only its sha256 is stored)."""
    row, secret = service.create_key(conn, tenant=name, role=body.role, name=body.name)
    tenant = service.get_tenant_or_raise(conn, name)
    return schemas.KeyCreated(**row.model_dump(), key=secret, tenant=tenant.name)


@router.get("/v1/tenants/{name}/keys", summary="List a tenant's keys")
def list_keys(name: str, key: OperatorAuth, conn: OperatorConn) -> schemas.KeyList:
    """The tenant's keys, live and revoked (prefixes only)."""
    return schemas.KeyList(data=service.list_keys(conn, tenant=name))


@router.delete("/v1/tenants/{name}/keys/{key_id}", summary="Revoke a key of a tenant")
def revoke_key(name: str, key_id: str, key: OperatorAuth, conn: OperatorConn) -> schemas.KeyOut:
    """Revoke a key by its prefix or id (revoking a revoked key changes nothing)."""
    return service.revoke_tenant_key(conn, tenant=name, ref=key_id)


@router.delete(
    "/v1/tenants/{name}",
    summary="Offboard a tenant: delete all its data and artefacts",
    response_model=schemas.OffboardingOut,
    responses={
        202: {"model": schemas.OffboardingOut, "description": "artefacts pending: call again"}
    },
)
def offboard_tenant(
    name: str,
    request: Request,
    key: OperatorAuth,
    pool: Annotated[Pool, Depends(get_pool)],
    confirm: Annotated[str | None, Query(description="the tenant's name again")] = None,
    force: Annotated[
        bool, Query(description="delete even if an engine still has its adapters loaded")
    ] = False,
    unload_timeout: Annotated[
        float, Query(ge=0, le=300, description="seconds to wait for engines to unload")
    ] = 30.0,
) -> JSONResponse:
    """Retire and unload its adapters, delete its rows and artefacts, keep an audit row.

    200 when everything is gone; 202 when some artefacts could not be deleted yet (the report
    lists them): call again to finish. Calling again after it is done returns the same report.
    """
    offboard.check_confirmation(name, confirm)
    with database_required(), pool.connection() as conn:
        out = offboard.offboard(
            conn,
            tenant=name,
            actor=key.actor,
            settings=request.app.state.settings,
            force=force,
            unload_timeout=unload_timeout,
        )
    return JSONResponse(jsonable_encoder(out), status_code=200 if out.status == "done" else 202)
