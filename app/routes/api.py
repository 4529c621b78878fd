"""HTTP: `POST /v1/routes`, `GET /v1/routes`, `GET /v1/routes/{name}`, `PATCH /v1/routes/{name}`."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from app.core.auth import ReaderKey, ReleaseKey, TenantConn, TrainerKey
from app.core.config import Settings
from app.core.errors import NotFound
from app.routes import service as routes

router = APIRouter(tags=["routes"])


Fallback = Literal["none", "prod", "base"]
FALLBACK = (
    "What answers a call whose assigned adapter cannot (not loaded on any engine after the"
    " router's wait, or failed on each): none (a 503 adapter_not_loaded with Retry-After), prod"
    " (the route's prod), base (prod, then the base model). A fallback answer belongs to no arm"
    " of an experiment."
)


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
    fallback: Fallback = Field("none", description=FALLBACK)


class RouteUpdate(BaseModel):
    """What a release manager may change on a route."""

    model_config = ConfigDict(extra="forbid")

    fallback: Fallback = Field(description=FALLBACK)


class RouteOut(BaseModel):
    """A route."""

    name: str
    tenant_id: int
    base_model: str
    experiment: str | None
    fallback: Fallback
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
        fallback=body.fallback,
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


@router.patch("/v1/routes/{name}")
def update_route(name: str, body: RouteUpdate, conn: TenantConn, key: ReleaseKey) -> RouteOut:
    """Change what answers when a route's adapter cannot (release key: it decides what the
    route's users are served)."""
    row = routes.set_fallback(conn, name=name, fallback=body.fallback)
    if row is None:
        raise NotFound(f"no route named {name!r} for this tenant")
    return RouteOut(**row)
