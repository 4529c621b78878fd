"""Reads of logged requests: one by request_id, or a page of them with an opaque cursor."""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

import orjson

from app.core.db import Connection
from app.core.errors import NotFound, Unprocessable
from app.logs import pii

_OUT_COLUMNS = (
    "l.id, l.request_id, l.tenant_id, l.user_hash, l.route, l.adapter_id, l.model, l.experiment,"
    " l.variant, l.messages, l.completion, l.ttft_ms, l.tokens_in, l.tokens_out, l.fb_explicit,"
    " l.fb_regen, l.fb_edited, l.edited_completion, l.parent_id, l.parent_request_id,"
    " l.regenerated_by, l.pii_flags, l.status, l.feedback_at, l.created_at,"
    " l.embedding IS NOT NULL AS has_embedding"
)


def _out(row: dict[str, Any]) -> dict[str, Any]:
    uh = row.get("user_hash")
    row["user_hash"] = uh.hex() if uh is not None else None
    row["pii"] = pii.names(row["pii_flags"])
    return row


def get_log(conn: Connection, *, tenant_id: int, request_id: str) -> dict[str, Any] | None:
    """One logged request of the tenant, or None."""
    row = conn.execute(
        f"SELECT {_OUT_COLUMNS} FROM obs.request_key k"
        " JOIN obs.inference_log l ON l.id = k.log_id AND l.created_at = k.created_at"
        " WHERE k.tenant_id = %s AND k.request_id = %s",
        (tenant_id, request_id),
    ).fetchone()
    return _out(row) if row else None


def get_log_or_raise(conn: Connection, *, tenant_id: int, request_id: str) -> dict[str, Any]:
    """One logged request of the tenant; NotFound if none."""
    row = get_log(conn, tenant_id=tenant_id, request_id=request_id)
    if row is None:
        raise NotFound(f"no log with request_id {request_id} for this tenant", code="log_not_found")
    return row


def _encode_cursor(created_at: datetime, log_id: int) -> str:
    raw = orjson.dumps([created_at.isoformat(), log_id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        ts, log_id = orjson.loads(raw)
        return datetime.fromisoformat(ts), int(log_id)
    except (ValueError, TypeError, orjson.JSONDecodeError):
        raise Unprocessable(
            "cursor is not one this API returned: pass next_cursor unchanged", param="cursor"
        ) from None


def list_logs(
    conn: Connection,
    *,
    tenant_id: int,
    route: str | None = None,
    adapter_id: str | None = None,
    since: datetime | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> dict[str, Any]:
    """A page of the tenant's logs, oldest first, with an opaque cursor for the next page."""
    where = ["l.tenant_id = %(tenant_id)s"]
    params: dict[str, Any] = {"tenant_id": tenant_id, "limit": limit + 1}
    if route is not None:
        where.append("l.route = %(route)s")
        params["route"] = route
    if adapter_id is not None:
        where.append("l.adapter_id = %(adapter_id)s")
        params["adapter_id"] = adapter_id
    if since is not None:
        where.append("l.created_at >= %(since)s")
        params["since"] = since
    if cursor is not None:
        params["c_at"], params["c_id"] = _decode_cursor(cursor)
        where.append("(l.created_at, l.id) > (%(c_at)s, %(c_id)s)")
    rows = conn.execute(
        f"SELECT {_OUT_COLUMNS} FROM obs.inference_log l WHERE {' AND '.join(where)}"
        " ORDER BY l.created_at, l.id LIMIT %(limit)s",
        params,
    ).fetchall()
    has_more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = (
        _encode_cursor(rows[-1]["created_at"], rows[-1]["id"]) if has_more and rows else None
    )
    return {
        "object": "list",
        "data": [_out(r) for r in rows],
        "has_more": has_more,
        "next_cursor": next_cursor,
    }
