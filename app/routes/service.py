"""Create and read routes (serve.route) for a tenant."""

from __future__ import annotations

from typing import Any

import psycopg

from app.core.db import Connection
from app.core.errors import BadRequest, Conflict

COLUMNS = "name, tenant_id, base_model, experiment, created_at"


def create_route(
    conn: Connection, *, tenant_id: int, name: str, base_model: str, experiment: str | None
) -> dict[str, Any]:
    """Insert a route; 409 if the name is taken (route names are global)."""
    try:
        with conn.transaction():
            row: dict[str, Any] | None = conn.execute(
                f"INSERT INTO serve.route (name, tenant_id, base_model, experiment)"
                f" VALUES (%s, %s, %s, %s) RETURNING {COLUMNS}",
                (name, tenant_id, base_model, experiment),
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
    return row


def get_route(conn: Connection, *, name: str) -> dict[str, Any] | None:
    """One route visible to the connection's tenant, or None."""
    row: dict[str, Any] | None = conn.execute(
        f"SELECT {COLUMNS} FROM serve.route WHERE name = %s", (name,)
    ).fetchone()
    return row


def list_routes(conn: Connection) -> list[dict[str, Any]]:
    """The routes visible to the connection's tenant."""
    return conn.execute(f"SELECT {COLUMNS} FROM serve.route ORDER BY name").fetchall()
