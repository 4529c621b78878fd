"""Create and read routes (serve.route) for a tenant."""

from __future__ import annotations

import psycopg

from app.core.db import Connection, owning_tenant
from app.core.errors import BadRequest, Conflict, Unprocessable
from app.routes.schemas import RouteOut

COLUMNS = "name, tenant_id, base_model, experiment, fallback, created_at"


def check_base_model(base_model: str, served: frozenset[str]) -> None:
    """422 unless base_model is one the platform's engines serve (CFT_BASE_MODELS)."""
    if base_model not in served:
        raise Unprocessable(
            f"base model {base_model!r} is not served here: choose one of"
            f" {', '.join(sorted(served))} (an operator adds bases with CFT_BASE_MODELS)",
            code="base_model_not_served",
            param="base_model",
        )


def create_route(
    conn: Connection,
    *,
    tenant_id: int,
    name: str,
    base_model: str,
    experiment: str | None,
    served: frozenset[str],
    fallback: str = "none",
) -> RouteOut:
    """Insert a route on a served base model; 409 if the name is taken."""
    check_base_model(base_model, served)
    if name.startswith("ft:"):
        # The router reads such a `model` as a fine-tuned model's name (app/gateway/finetuned.py).
        raise BadRequest(
            "route names may not start with 'ft:': that prefix names fine-tuned models",
            code="invalid_route_name",
        )
    try:
        with conn.transaction():
            row = conn.execute(
                f"INSERT INTO serve.route (name, tenant_id, base_model, experiment, fallback)"
                f" VALUES (%s, %s, %s, %s, %s) RETURNING {COLUMNS}",
                (name, tenant_id, base_model, experiment, fallback),
            ).fetchone()
    except psycopg.errors.UniqueViolation as exc:
        raise Conflict(f"a route named {name!r} already exists", code="route_exists") from exc
    except psycopg.errors.CheckViolation as exc:
        raise BadRequest(
            "route names are 1-128 letters, digits, '_', '.', ':' or '-', starting with a"
            " letter or digit",
            code="invalid_route_name",
        ) from exc
    assert row is not None
    return RouteOut(**row)


def get_route(conn: Connection, *, name: str) -> RouteOut | None:
    """One route visible to the connection's tenant, or None."""
    row = conn.execute(f"SELECT {COLUMNS} FROM serve.route WHERE name = %s", (name,)).fetchone()
    return RouteOut(**row) if row else None


def route_tenant(conn: Connection, *, name: str, tenant: str | None = None) -> int:
    """The tenant of the route called name (app.core.db.owning_tenant)."""
    return owning_tenant(
        conn,
        table="serve.route",
        column="name",
        value=name,
        tenant=tenant,
        missing=f"no route named {name!r}",
        shared=f"a route named {name!r}",
        code="route_not_found",
    )


def list_routes(conn: Connection) -> list[RouteOut]:
    """The routes visible to the connection's tenant."""
    rows = conn.execute(f"SELECT {COLUMNS} FROM serve.route ORDER BY name").fetchall()
    return [RouteOut(**r) for r in rows]


def set_fallback(conn: Connection, *, name: str, fallback: str) -> RouteOut | None:
    """Set a route's fallback policy (routers apply it at commit: NOTIFY cft_route); None if
    the connection's tenant has no such route."""
    row = conn.execute(
        f"UPDATE serve.route SET fallback = %s WHERE name = %s RETURNING {COLUMNS}",
        (fallback, name),
    ).fetchone()
    return RouteOut(**row) if row else None
