"""HTTP of the privacy API: POST /v1/users/forget."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.core.auth import AdminKey, TenantConn
from app.core.pseudonym import user_secret
from app.privacy import schemas, service

router = APIRouter(tags=["privacy"])


@router.post("/v1/users/forget", summary="Forget a user (right to be forgotten)")
def forget_user(
    body: schemas.ForgetIn, request: Request, key: AdminKey, conn: TenantConn
) -> schemas.ForgetOut:
    """Delete the user's logs and taint the snapshots and adapters built from them."""
    # POST, not DELETE /v1/users/{id}: the raw id stays out of URLs and access logs.
    return service.forget_user(conn, user=body.user, secret=user_secret(request.app.state.settings))
