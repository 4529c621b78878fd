"""Feedback on logged requests: thumbs, regeneration, edited completion."""

from __future__ import annotations

from typing import Any

from app.core.db import Connection
from app.core.errors import NotFound, Unprocessable
from app.logs.queries import get_log_or_raise


def _locate(conn: Connection, tenant_id: int, request_id: str) -> dict[str, Any] | None:
    row: dict[str, Any] | None = conn.execute(
        "SELECT log_id, created_at FROM obs.request_key WHERE tenant_id = %s AND request_id = %s",
        (tenant_id, request_id),
    ).fetchone()
    return row


def give_feedback(
    conn: Connection,
    *,
    tenant_id: int,
    request_id: str,
    thumbs: int | None = None,
    regenerated: bool | None = None,
    regenerated_by: str | None = None,
    edited_completion: str | None = None,
) -> dict[str, Any]:
    """Record feedback on a logged request; NotFound if the tenant never logged it."""
    key = _locate(conn, tenant_id, request_id)
    if key is None:
        raise NotFound(
            f"no log with request_id {request_id} for this tenant:"
            " log it with POST /v1/logs before sending feedback",
            code="log_not_found",
        )
    if regenerated_by is not None and regenerated is None:
        regenerated = True
    if regenerated_by == request_id:
        raise Unprocessable(
            "regenerated_by must name another request, not this one", param="regenerated_by"
        )
    if regenerated is False and regenerated_by is not None:
        raise Unprocessable(
            "regenerated_by needs regenerated: true (or leave regenerated out)",
            param="regenerated_by",
        )
    sets = ["feedback_at = now()"]
    params: dict[str, Any] = {"id": key["log_id"], "created_at": key["created_at"]}
    if thumbs is not None:
        sets.append("fb_explicit = %(thumbs)s")
        params["thumbs"] = thumbs
    if regenerated is not None:
        sets.append("fb_regen = %(regen)s")
        params["regen"] = regenerated
        if regenerated_by is not None:
            sets.append("regenerated_by = %(regenerated_by)s")
            params["regenerated_by"] = regenerated_by
        elif not regenerated:
            sets.append("regenerated_by = NULL")
    if edited_completion is not None:
        sets.append("fb_edited = true, edited_completion = %(edited)s")
        params["edited"] = edited_completion
    conn.execute(
        f"UPDATE obs.inference_log SET {', '.join(sets)}"
        " WHERE id = %(id)s AND created_at = %(created_at)s",
        params,
    )
    if regenerated_by is not None:
        conn.execute(
            "SELECT obs.link_regenerations(%s, ARRAY[%s]::uuid[])",
            (tenant_id, regenerated_by),
        )
    return get_log_or_raise(conn, tenant_id=tenant_id, request_id=request_id)
