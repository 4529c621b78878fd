"""Plain factory functions that insert rows as the database owner."""

from __future__ import annotations

import itertools
import uuid
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

_seq = itertools.count(1)


def make_tenant(conn: Any, **over: Any) -> dict[str, Any]:
    """Insert a tenant."""
    row = {"name": f"tenant-{next(_seq)}", "consent_training": True} | over
    return conn.execute(  # type: ignore[no-any-return]
        "INSERT INTO tenant (name, consent_training) VALUES (%(name)s, %(consent_training)s) RETURNING *",
        row,
    ).fetchone()


def make_route(conn: Any, *, tenant_id: int, **over: Any) -> dict[str, Any]:
    """Insert a route."""
    row = {
        "name": f"route-{next(_seq)}",
        "base_model": "smollm2-135m-instruct",
        "experiment": None,
        "fallback": "none",
    } | over
    return conn.execute(  # type: ignore[no-any-return]
        "INSERT INTO serve.route (name, tenant_id, base_model, experiment, fallback)"
        " VALUES (%(name)s, %(tenant_id)s, %(base_model)s, %(experiment)s, %(fallback)s)"
        " RETURNING *",
        row | {"tenant_id": tenant_id},
    ).fetchone()


def make_adapter(conn: Any, *, route: dict[str, Any], **over: Any) -> dict[str, Any]:
    """Insert an adapter of a route (status candidate unless told)."""
    row = {
        "id": f"{route['name']}-v{next(_seq)}",
        "tenant_id": route["tenant_id"],
        "route": route["name"],
        "base_model": route["base_model"],
        "status": "candidate",
        "traffic_pct": 0,
        "method": "sft",
        "rank": 8,
        "alpha": 16,
    } | over
    cols = ", ".join(row)
    vals = ", ".join(f"%({k})s" for k in row)
    return conn.execute(  # type: ignore[no-any-return]
        f"INSERT INTO serve.adapter ({cols}) VALUES ({vals}) RETURNING *", row
    ).fetchone()


def make_log(conn: Any, *, tenant_id: int, **over: Any) -> dict[str, Any]:
    """Insert one obs.inference_log row."""
    row: dict[str, Any] = {
        "request_id": uuid.uuid4(),
        "tenant_id": tenant_id,
        "route": "route",
        "adapter_id": "base",
        "messages": [{"role": "user", "content": f"question {next(_seq)}"}],
        "completion": "answer",
        "tokens_in": 5,
        "tokens_out": 7,
    } | over
    row["messages"] = Jsonb(row["messages"])
    if isinstance(row.get("created_at"), datetime | None) and row.get("created_at") is None:
        row.pop("created_at", None)
    cols = ", ".join(row)
    vals = ", ".join(f"%({k})s" for k in row)
    return conn.execute(  # type: ignore[no-any-return]
        f"INSERT INTO obs.inference_log ({cols}) VALUES ({vals}) RETURNING *", row
    ).fetchone()
