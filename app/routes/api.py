"""HTTP: `POST /v1/routes`, `GET /v1/routes`, `GET /v1/routes/{name}`, `PATCH /v1/routes/{name}`."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.core.auth import ReaderKey, ReleaseKey, TenantConn, TrainerKey
from app.core.config import Settings
from app.core.errors import NotFound
from app.routes import service as routes
from app.routes.schemas import RouteCreate, RouteOut, RouteUpdate

router = APIRouter(tags=["routes"])


@router.post("/v1/routes", status_code=201)
def create_route(
    body: RouteCreate, request: Request, conn: TenantConn, key: TrainerKey
) -> RouteOut:
    """Create a serving slot for the caller's tenant."""
    settings: Settings = request.app.state.settings
    return routes.create_route(
        conn,
        tenant_id=key.tenant_id,
        name=body.name,
        base_model=body.base_model or settings.base_model,
        experiment=body.experiment,
        fallback=body.fallback,
        served=settings.served_base_models,
    )


@router.get("/v1/routes")
def list_routes(conn: TenantConn, key: ReaderKey) -> list[RouteOut]:
    """The caller's routes."""
    return routes.list_routes(conn)


@router.get("/v1/routes/{name}")
def read_route(name: str, conn: TenantConn, key: ReaderKey) -> RouteOut:
    """One of the caller's routes."""
    row = routes.get_route(conn, name=name)
    if row is None:
        raise NotFound(f"no route named {name!r} for this tenant")
    return row


@router.patch("/v1/routes/{name}")
def update_route(name: str, body: RouteUpdate, conn: TenantConn, key: ReleaseKey) -> RouteOut:
    """Change what answers when a route's adapter cannot (release key: it decides what the
    route's users are served)."""
    row = routes.set_fallback(conn, name=name, fallback=body.fallback)
    if row is None:
        raise NotFound(f"no route named {name!r} for this tenant")
    return row
