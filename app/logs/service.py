"""Rules of log ingestion and feedback: validate, pseudonymise, flag PII, COPY, link.

The batch path avoids per-row SQL: records are validated in Python (orjson-parsed dicts, a
hand-written validator: pydantic per row would cost more than the database insert), written
with one COPY into a per-connection TEMP staging table, then moved with one
`INSERT ... SELECT ... WHERE NOT EXISTS` into obs.inference_log as cft_app, so row-level
security checks every row (PostgreSQL refuses COPY into a table with RLS).

A batch is atomic: either every record is inserted or reported as already existing, or the
request fails and nothing is written. Records are idempotent by (tenant, request_id).

`log_records(conn=..., tenant_id=..., records=...)` is the entry point for other code (the
router logs proxied calls with it); the caller owns the transaction.
"""

from __future__ import annotations

import base64
import math
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from psycopg import errors as pg_errors

from app.core.config import Settings, get_settings
from app.core.db import Connection
from app.core.errors import Conflict, NotFound, PayloadTooLarge, Unprocessable
from app.core.metrics import LOG_REJECTED, LOG_ROWS
from app.core.pseudonym import user_hash, user_secret
from app.logs import pii

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
STATUSES = frozenset({"ok", "error", "partial"})
FIELDS = frozenset(
    {
        "request_id",
        "route",
        "adapter_id",
        "model",
        "experiment",
        "variant",
        "messages",
        "completion",
        "ttft_ms",
        "tokens_in",
        "tokens_out",
        "user",
        "embedding",
        "parent_request_id",
        "status",
        "created_at",
    }
)
MAX_TEXT = 256  # route, adapter_id, model, experiment, user
INT4_MAX = 2**31 - 1
HALF_MAX = 65504.0
DEFAULT_ADAPTER = "base"

STAGING_COLUMNS = (
    "ord, request_id, user_hash, route, adapter_id, model, experiment, variant, messages,"
    " completion, ttft_ms, tokens_in, tokens_out, embedding, parent_request_id, pii_flags,"
    " status, created_at"
)
_CREATE_STAGING = """
CREATE TEMP TABLE IF NOT EXISTS log_staging (
  ord int, request_id uuid, user_hash bytea, route text, adapter_id text, model text,
  experiment text, variant text, messages jsonb, completion text, ttft_ms int, tokens_in int,
  tokens_out int, embedding text, parent_request_id uuid, pii_flags smallint, status text,
  created_at timestamptz
) ON COMMIT DELETE ROWS
"""
_MOVE = """
INSERT INTO obs.inference_log (request_id, tenant_id, user_hash, route, adapter_id, model,
  experiment, variant, messages, completion, ttft_ms, tokens_in, tokens_out, embedding,
  parent_request_id, pii_flags, status, created_at)
SELECT s.request_id, %(tenant_id)s, s.user_hash, s.route, s.adapter_id, s.model, s.experiment,
       s.variant, s.messages, s.completion, s.ttft_ms, s.tokens_in, s.tokens_out,
       s.embedding::halfvec, s.parent_request_id, s.pii_flags, s.status,
       coalesce(s.created_at, now())
  FROM log_staging s
 WHERE NOT EXISTS (SELECT 1 FROM obs.request_key k
                    WHERE k.tenant_id = %(tenant_id)s AND k.request_id = s.request_id)
 ORDER BY s.ord
RETURNING request_id
"""
# COPY text format: backslash, and the row/column separators, are escaped.
_COPY_ESCAPE = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_NULL = "\\N"


class InvalidRecord(Unprocessable):
    """One record of a batch is invalid; the message names the record and the field."""

    def __init__(self, index: int | None, field_name: str, message: str, reason: str):
        where = f"records[{index}].{field_name}" if index is not None else field_name
        super().__init__(f"{where}: {message}", param=where)
        self.reason = reason


@dataclass
class Prepared:
    """Validated records, ready for COPY (one text line each) in arrival order."""

    request_ids: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    duplicates: set[int] = field(default_factory=set)  # repeated request_id inside the batch


def _text(value: str) -> str:
    return value.translate(_COPY_ESCAPE)


def _opt_str(
    rec: dict[str, Any], name: str, index: int | None, *, max_len: int | None = MAX_TEXT
) -> str | None:
    value = rec.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRecord(index, name, f"must be a string, got {type(value).__name__}", "type")
    if max_len is not None and len(value) > max_len:
        raise InvalidRecord(index, name, f"must be at most {max_len} characters", "too_long")
    if "\x00" in value:
        raise InvalidRecord(index, name, "must not contain NUL characters", "nul")
    return value


def _opt_int(rec: dict[str, Any], name: str, index: int | None) -> str:
    value = rec.get(name)
    if value is None:
        return _NULL
    if type(value) is not int:
        raise InvalidRecord(index, name, f"must be an integer, got {type(value).__name__}", "type")
    if not 0 <= value <= INT4_MAX:
        raise InvalidRecord(index, name, f"must be between 0 and {INT4_MAX}", "range")
    return str(value)


def _uuid(value: Any, index: int | None, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidRecord(
            index, name, f"must be a UUID string, got {type(value).__name__}", "type"
        )
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidRecord(
            index, name, f"{value[:64]!r} is not a UUID (e.g. 0b6f1b9e-...)", "bad_uuid"
        ) from None


def _content_text(content: Any, index: int | None, m: int) -> str:
    where = f"messages[{m}].content"
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for p, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise InvalidRecord(
                    index,
                    f"{where}[{p}]",
                    "content parts must be objects with a string 'type'",
                    "messages",
                )
            text = part.get("text")
            if isinstance(text, str):
                parts.append(text)
        return "\n".join(parts)
    raise InvalidRecord(
        index, where, "must be a string, null or a list of content parts", "messages"
    )


def _messages(value: Any, index: int | None) -> tuple[str, str]:
    """The messages as JSON text and their concatenated text (for PII detection)."""
    if not isinstance(value, list) or not value:
        raise InvalidRecord(
            index,
            "messages",
            'must be a non-empty list of chat messages like {"role": "user", "content": "..."}',
            "messages",
        )
    texts = []
    for m, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise InvalidRecord(index, f"messages[{m}]", "must be an object", "messages")
        role = msg.get("role")
        if role not in ROLES:
            raise InvalidRecord(
                index,
                f"messages[{m}].role",
                f"must be one of {', '.join(sorted(ROLES))}, got {str(role)[:32]!r}",
                "messages",
            )
        if "content" not in msg and not msg.get("tool_calls"):
            raise InvalidRecord(
                index, f"messages[{m}]", "needs 'content' (or 'tool_calls')", "messages"
            )
        texts.append(_content_text(msg.get("content"), index, m))
    dumped = orjson.dumps(value).decode()
    if "\\u0000" in dumped:
        raise InvalidRecord(index, "messages", "must not contain NUL characters", "nul")
    return dumped, "\n".join(texts)


def _embedding(value: Any, index: int | None, dim: int) -> str:
    if value is None:
        return _NULL
    if not isinstance(value, list) or len(value) != dim:
        raise InvalidRecord(index, "embedding", f"must be a list of {dim} numbers", "embedding")
    for x in value:
        if type(x) not in (int, float) or not math.isfinite(x) or abs(x) > HALF_MAX:
            raise InvalidRecord(
                index,
                "embedding",
                f"must hold finite numbers within +-{HALF_MAX:g} (halfvec)",
                "embedding",
            )
    return "[" + ",".join(map(str, value)) + "]"


def _created_at(value: Any, index: int | None) -> str:
    if value is None:
        return _NULL
    if not isinstance(value, str):
        raise InvalidRecord(index, "created_at", "must be an ISO-8601 timestamp string", "type")
    try:
        ts = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRecord(
            index,
            "created_at",
            f"{value[:40]!r} is not ISO-8601 (e.g. 2026-11-29T10:00:00Z)",
            "bad_timestamp",
        ) from None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return ts.isoformat()


def prepare_record(rec: Any, index: int | None, *, secret: bytes, dim: int) -> tuple[str, str]:
    """Validate one record; return its request_id and its COPY line (without ord)."""
    if not isinstance(rec, dict):
        raise InvalidRecord(index, "record", "must be a JSON object", "type")
    unknown = rec.keys() - FIELDS
    if unknown:
        name = sorted(unknown)[0]
        raise InvalidRecord(
            index, name, f"unknown field; allowed: {', '.join(sorted(FIELDS))}", "unknown_field"
        )
    if rec.get("request_id") is None:
        raise InvalidRecord(
            index, "request_id", "is required: a client-chosen UUID", "missing_request_id"
        )
    request_id = _uuid(rec["request_id"], index, "request_id")
    route = _opt_str(rec, "route", index)
    if not route:
        raise InvalidRecord(index, "route", "is required (the serving slot)", "missing_route")
    messages, text = _messages(rec.get("messages"), index)
    adapter_id = _opt_str(rec, "adapter_id", index) or DEFAULT_ADAPTER
    variant = _opt_str(rec, "variant", index, max_len=1)
    completion = _opt_str(rec, "completion", index, max_len=None)
    user = _opt_str(rec, "user", index)
    status = rec.get("status", "ok")
    if status not in STATUSES:
        raise InvalidRecord(
            index, "status", f"must be one of {', '.join(sorted(STATUSES))}", "status"
        )
    parent = rec.get("parent_request_id")
    parent_id = _NULL if parent is None else _uuid(parent, index, "parent_request_id")
    if completion:
        text = text + "\n" + completion
    flags = pii.detect(text)
    model = _opt_str(rec, "model", index)
    experiment = _opt_str(rec, "experiment", index)
    line = "\t".join(
        (
            request_id,
            _NULL if user is None else "\\\\x" + user_hash(user, secret).hex(),
            _text(route),
            _text(adapter_id),
            _NULL if model is None else _text(model),
            _NULL if experiment is None else _text(experiment),
            _NULL if variant is None else _text(variant),
            _text(messages),
            _NULL if completion is None else _text(completion),
            _opt_int(rec, "ttft_ms", index),
            _opt_int(rec, "tokens_in", index),
            _opt_int(rec, "tokens_out", index),
            _embedding(rec.get("embedding"), index, dim),
            parent_id,
            str(flags),
            status,
            _created_at(rec.get("created_at"), index),
        )
    )
    return request_id, line


def records_of(payload: Any, *, max_records: int) -> tuple[list[Any], bool]:
    """The records of a POST /v1/logs body (one record or {"records": [...]}); batch flag."""
    if isinstance(payload, dict) and "records" in payload:
        records = payload["records"]
        if len(payload) > 1:
            extra = sorted(payload.keys() - {"records"})[0]
            raise InvalidRecord(None, extra, "a batch body holds only 'records'", "unknown_field")
        if not isinstance(records, list) or not records:
            raise InvalidRecord(None, "records", "must be a non-empty list of log records", "type")
        if len(records) > max_records:
            LOG_REJECTED.labels("oversize_batch").inc(len(records))
            raise PayloadTooLarge(
                f"a batch holds at most {max_records} records, got {len(records)}:"
                " split it into smaller batches",
                param="records",
            )
        return records, True
    if isinstance(payload, dict):
        return [payload], False
    raise InvalidRecord(None, "body", 'must be a log record object or {"records": [...]}', "type")


def prepare(
    records: Sequence[Any], *, settings: Settings | None = None, batch: bool = True
) -> Prepared:
    """Validate and encode records; the first invalid one fails the whole batch."""
    settings = settings or get_settings()
    secret = user_secret(settings)
    dim = settings.embedding_dim
    out = Prepared()
    seen: set[str] = set()
    try:
        for i, rec in enumerate(records):
            request_id, line = prepare_record(rec, i if batch else None, secret=secret, dim=dim)
            if request_id in seen:
                out.duplicates.add(i)
            else:
                seen.add(request_id)
                out.lines.append(f"{i}\t{line}\n")
            out.request_ids.append(request_id)
    except InvalidRecord as exc:
        LOG_REJECTED.labels(exc.reason).inc()
        raise
    return out


def insert_prepared(conn: Connection, *, tenant_id: int, prepared: Prepared) -> list[str]:
    """Write prepared records; return the status of each: 'inserted' or 'existing'."""
    inserted: set[str] = set()
    for attempt in (1, 2):
        try:
            with conn.transaction():
                inserted = _copy_and_move(conn, tenant_id, prepared)
            break
        except pg_errors.UniqueViolation as exc:
            # A concurrent request logged one of these request_ids after our NOT EXISTS
            # check; on retry the check sees its row.
            if attempt == 2:
                raise Conflict(
                    "concurrent requests are logging the same request_ids: retry the batch"
                ) from exc
    result = [
        "inserted" if rid in inserted and i not in prepared.duplicates else "existing"
        for i, rid in enumerate(prepared.request_ids)
    ]
    n = len(inserted)
    LOG_ROWS.labels("inserted").inc(n)
    LOG_ROWS.labels("existing").inc(len(result) - n)
    return result


def _copy_and_move(conn: Connection, tenant_id: int, prepared: Prepared) -> set[str]:
    with conn.cursor() as cur:
        cur.execute(_CREATE_STAGING)
        cur.execute("DELETE FROM log_staging")  # empty unless called twice in one transaction
        with cur.copy(f"COPY log_staging ({STAGING_COLUMNS}) FROM STDIN") as copy:
            copy.write("".join(prepared.lines).encode())
        cur.execute(_MOVE, {"tenant_id": tenant_id})
        inserted = {str(row["request_id"]) for row in cur.fetchall()}
        if inserted:
            cur.execute(
                "SELECT obs.link_regenerations_v1(%s, %s::uuid[])",
                (tenant_id, list(inserted)),
            )
    return inserted


def log_records(
    conn: Connection,
    *,
    tenant_id: int,
    records: Sequence[dict[str, Any]],
    settings: Settings | None = None,
) -> list[str]:
    """Log records (dicts with the POST /v1/logs fields) for a tenant; 'inserted'/'existing' each.

    Runs in the caller's transaction; conn must be scoped to the tenant (`as_tenant`) or be
    the owner. Raises InvalidRecord (422) before writing anything if a record is invalid.
    """
    prepared = prepare(records, settings=settings)
    return insert_prepared(conn, tenant_id=tenant_id, prepared=prepared)


# Feedback ------------------------------------------------------------------------------------


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
            "SELECT obs.link_regenerations_v1(%s, ARRAY[%s]::uuid[])",
            (tenant_id, regenerated_by),
        )
    return get_log_or_raise(conn, tenant_id=tenant_id, request_id=request_id)


# Reading -------------------------------------------------------------------------------------

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


def summarize(request_ids: Iterable[str], statuses: Sequence[str]) -> dict[str, Any]:
    """The POST /v1/logs response body."""
    records = [
        {"request_id": rid, "status": st} for rid, st in zip(request_ids, statuses, strict=True)
    ]
    inserted = sum(1 for st in statuses if st == "inserted")
    return {"inserted": inserted, "existing": len(statuses) - inserted, "records": records}


__all__ = [
    "InvalidRecord",
    "Prepared",
    "get_log",
    "get_log_or_raise",
    "give_feedback",
    "insert_prepared",
    "list_logs",
    "log_records",
    "prepare",
]
