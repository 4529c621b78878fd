"""HTTP: `POST /v1/routes`, `GET /v1/routes`, `GET /v1/routes/{name}`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from app.core.auth import ReaderKey, TenantConn, TrainerKey
from app.core.config import Settings
from app.core.errors import NotFound
from app.routes import service as routes

router = APIRouter(tags=["routes"])


class RouteCreate(BaseModel):
    """A new route."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
    base_model: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="One of the served base models (CFT_BASE_MODELS); default: CFT_BASE_MODEL.",
    )
    experiment: str | None = Field(None, max_length=128, description="Canary split salt.")


class RouteOut(BaseModel):
    """A route."""

    name: str
    tenant_id: int
    base_model: str
    experiment: str | None
    created_at: datetime


@router.post("/v1/routes", status_code=201)
def create_route(
    body: RouteCreate, request: Request, conn: TenantConn, key: TrainerKey
) -> RouteOut:
    """Create a serving slot for the caller's tenant."""
    settings: Settings = request.app.state.settings
    row: dict[str, Any] = routes.create_route(
        conn,
        tenant_id=key.tenant_id,
        name=body.name,
        base_model=body.base_model or settings.base_model,
        experiment=body.experiment,
        served=settings.served_base_models,
    )
    return RouteOut(**row)


@router.get("/v1/routes")
def list_routes(conn: TenantConn, key: ReaderKey) -> list[RouteOut]:
    """The caller's routes."""
    return [RouteOut(**r) for r in routes.list_routes(conn)]


@router.get("/v1/routes/{name}")
def read_route(name: str, conn: TenantConn, key: ReaderKey) -> RouteOut:
    """One of the caller's routes."""
    row = routes.get_route(conn, name=name)
    if row is None:
        raise NotFound(f"no route named {name!r} for this tenant")
    return RouteOut(**row)
