"""Task suites and evaluation requests (RLS scopes every query to the caller's tenant)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import Connection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from app.core.errors import BadRequest, Conflict, NotFound


def create_suite(conn: Connection, *, tenant_id: int, suite: dict[str, Any]) -> dict[str, Any]:
    """Store a suite and its cases; a taken id is a Conflict."""
    cur = conn.cursor(row_factory=dict_row)
    if suite.get("route") is not None:
        found = cur.execute("SELECT 1 FROM serve.route WHERE name = %s", (suite["route"],))
        if found.fetchone() is None:
            raise NotFound(f"route {suite['route']!r} not found", code="route_not_found")
    try:
        with conn.transaction():
            cur.execute(
                "INSERT INTO train.eval_suite (id, tenant_id, route, name, kind, rubric)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (
                    suite["id"],
                    tenant_id,
                    suite.get("route"),
                    suite.get("name") or suite["id"],
                    suite["kind"],
                    suite.get("rubric"),
                ),
            )
            for case in suite["cases"]:
                cur.execute(
                    "INSERT INTO train.eval_case (suite_id, messages, check_kind, expected,"
                    " max_tokens) VALUES (%s, %s, %s, %s, %s)",
                    (
                        suite["id"],
                        Jsonb(case["messages"]),
                        case["check"],
                        Jsonb(case["expected"]),
                        case["max_tokens"],
                    ),
                )
    except psycopg.errors.UniqueViolation as exc:
        raise Conflict(f"eval suite {suite['id']!r} exists", code="suite_exists") from exc
    except psycopg.errors.CheckViolation as exc:
        raise BadRequest(f"invalid suite: {exc.diag.message_primary}") from exc
    return get_suite_or_raise(conn, suite_id=suite["id"])


def get_suite_or_raise(conn: Connection, *, suite_id: str) -> dict[str, Any]:
    """One suite with its cases, or NotFound."""
    cur = conn.cursor(row_factory=dict_row)
    row = cur.execute("SELECT * FROM train.eval_suite WHERE id = %s", (suite_id,)).fetchone()
    if row is None:
        raise NotFound(f"eval suite {suite_id!r} not found", code="suite_not_found")
    row["cases"] = cur.execute(
        "SELECT * FROM train.eval_case WHERE suite_id = %s ORDER BY id", (suite_id,)
    ).fetchall()
    return row


def list_suites(conn: Connection, *, route: str | None = None) -> list[dict[str, Any]]:
    """The tenant's suites (of one route: its own and the tenant-wide ones), with cases."""
    cur = conn.cursor(row_factory=dict_row)
    ids = cur.execute(
        "SELECT id FROM train.eval_suite WHERE %s::text IS NULL OR route IS NULL OR route = %s"
        " ORDER BY id",
        (route, route),
    ).fetchall()
    return [get_suite_or_raise(conn, suite_id=r["id"]) for r in ids]


def request_evaluation(
    conn: Connection, *, tenant_id: int, adapter_id: str, actor: str
) -> dict[str, Any]:
    """Queue an evaluation of an adapter (an open one is returned as is); NOTIFY cft_eval."""
    cur = conn.cursor(row_factory=dict_row)
    found = cur.execute("SELECT 1 FROM serve.adapter WHERE id = %s", (adapter_id,)).fetchone()
    if found is None:
        raise NotFound(f"adapter {adapter_id!r} not found", code="adapter_not_found")
    row = cur.execute(
        "INSERT INTO train.eval_request (tenant_id, adapter_id, requested_by) VALUES (%s, %s, %s)"
        " ON CONFLICT (adapter_id) WHERE status IN ('queued', 'running') DO NOTHING RETURNING *",
        (tenant_id, adapter_id, actor),
    ).fetchone()
    if row is None:
        row = cur.execute(
            "SELECT * FROM train.eval_request WHERE adapter_id = %s"
            " AND status IN ('queued', 'running')",
            (adapter_id,),
        ).fetchone()
    assert row is not None
    return row
