"""The one validator of log records, for every way in: POST /v1/logs, the gateway's log writer,
OTLP traces and `ingest.log_records`.

Records arrive as orjson-parsed dicts; pydantic per row would cost more than the database
insert, so each field is checked by hand. A valid record becomes a row: a dict keyed by the
columns `obs.log_rows` (sql/obs/log_rows.sql) reads a batch's rows into, holding the values the
database stores. The first invalid record fails the batch with an InvalidRecord that names the
record and the field.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from app.core.config import Settings, get_settings
from app.core.errors import PayloadTooLarge, Unprocessable
from app.core.metrics import LOG_REJECTED
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

# Encoded pseudonyms a caller may keep across batches (cleared when full: a cache, not a record).
MAX_USER_HASHES = 10_000


class InvalidRecord(Unprocessable):
    """One record of a batch is invalid; the message names the record and the field."""

    def __init__(self, index: int | None, field_name: str, message: str, reason: str):
        where = f"records[{index}].{field_name}" if index is not None else field_name
        super().__init__(f"{where}: {message}", param=where)
        self.reason = reason


@dataclass
class Prepared:
    """Validated records: each one's request_id in arrival order, and the rows to write (the
    first record of each request_id, with `ord`, its place in the batch)."""

    request_ids: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    _ids: set[str] = field(default_factory=set, repr=False)

    def add(self, request_id: str, row: dict[str, Any]) -> None:
        """Append one validated record; a repeat of a request_id is answered but not written."""
        if request_id not in self._ids:
            self._ids.add(request_id)
            row["ord"] = len(self.request_ids)
            self.rows.append(row)
        self.request_ids.append(request_id)


# The canonical form (lowercase, hyphenated) is kept as is; any other form uuid.UUID accepts
# (upper case, braces, no hyphens, urn:uuid:) is normalised through it.
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


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


def _opt_int(rec: dict[str, Any], name: str, index: int | None) -> int | None:
    value = rec.get(name)
    if value is None:
        return None
    if type(value) is not int:
        raise InvalidRecord(index, name, f"must be an integer, got {type(value).__name__}", "type")
    if not 0 <= value <= INT4_MAX:
        raise InvalidRecord(index, name, f"must be between 0 and {INT4_MAX}", "range")
    return value


def _uuid(value: Any, index: int | None, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidRecord(
            index, name, f"must be a UUID string, got {type(value).__name__}", "type"
        )
    if _CANONICAL_UUID.fullmatch(value):
        return value
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


def _messages(value: Any, index: int | None) -> tuple[orjson.Fragment, str]:
    """The messages as encoded JSON and their concatenated text (for PII detection)."""
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
        if not isinstance(role, str) or role not in ROLES:  # a list is not hashable
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
        content = msg.get("content")
        texts.append(content if type(content) is str else _content_text(content, index, m))
    dumped = orjson.dumps(value)
    if b"\\u0000" in dumped:
        raise InvalidRecord(index, "messages", "must not contain NUL characters", "nul")
    # Encoded once: the batch's JSON takes the fragment as it is.
    return orjson.Fragment(dumped), "\n".join(texts)


def _embedding(value: Any, index: int | None, dim: int) -> str | None:
    if value is None:
        return None
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


# A record's created_at lies within [now - CFT_LOG_RETENTION_DAYS, now + FUTURE_SKEW]: older
# rows would be dropped by the next retention pass anyway, and each distinct week a client may
# choose becomes a partition (ten indexes, locks on every query of the log), so a client that
# sets it freely could multiply partitions until queries run out of lock slots.
FUTURE_SKEW = timedelta(minutes=10)


def created_at_window(settings: Settings) -> tuple[datetime, datetime]:
    """The (earliest, latest) created_at a record may carry now."""
    now = datetime.now(UTC)
    return now - timedelta(days=settings.log_retention_days), now + FUTURE_SKEW


def _created_at(value: Any, index: int | None, window: tuple[datetime, datetime]) -> str | None:
    if value is None:
        return None
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
    earliest, latest = window
    if not earliest <= ts <= latest:
        low, high = (t.isoformat(timespec="seconds") for t in window)
        skew = int(FUTURE_SKEW.total_seconds() // 60)
        raise InvalidRecord(
            index,
            "created_at",
            f"{ts.isoformat()} is outside the accepted window {low} .. {high} (the log's"
            f" retention back, {skew} minutes of clock skew ahead); omit it for now()",
            "created_at_out_of_window",
        )
    return ts.isoformat()


def prepare_record(
    rec: Any,
    index: int | None,
    *,
    secret: bytes,
    dim: int,
    window: tuple[datetime, datetime],
    user_hashes: dict[str, str] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Validate one record; return its request_id and its row (all columns but ord).

    user_hashes caches the encoded pseudonym per user id (at most MAX_USER_HASHES of them)."""
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
    if not isinstance(status, str) or status not in STATUSES:
        raise InvalidRecord(
            index, "status", f"must be one of {', '.join(sorted(STATUSES))}", "status"
        )
    parent = rec.get("parent_request_id")
    parent_id = None if parent is None else _uuid(parent, index, "parent_request_id")
    if completion:
        text = text + "\n" + completion
    flags = pii.detect(text)
    model = _opt_str(rec, "model", index)
    experiment = _opt_str(rec, "experiment", index)
    hashed = None
    if user is not None:
        hashed = user_hashes.get(user) if user_hashes is not None else None
        if hashed is None:
            hashed = "\\x" + user_hash(user, secret).hex()  # bytea's hex input
            if user_hashes is not None:
                if len(user_hashes) >= MAX_USER_HASHES:
                    user_hashes.clear()
                user_hashes[user] = hashed
    embedding, created_at = rec.get("embedding"), rec.get("created_at")
    return request_id, {
        "request_id": request_id,
        "user_hash": hashed,
        "route": route,
        "adapter_id": adapter_id,
        "model": model,
        "experiment": experiment,
        "variant": variant,
        "messages": messages,
        "completion": completion,
        "ttft_ms": _opt_int(rec, "ttft_ms", index),
        "tokens_in": _opt_int(rec, "tokens_in", index),
        "tokens_out": _opt_int(rec, "tokens_out", index),
        "embedding": None if embedding is None else _embedding(embedding, index, dim),
        "parent_request_id": parent_id,
        "pii_flags": flags,
        "status": status,
        "created_at": None if created_at is None else _created_at(created_at, index, window),
    }


def check_call(messages: Any, user: str | None) -> None:
    """Refuse a router call whose log record could never be stored, before it is served: the
    validator's rules for the caller's `messages` and `user` (the router's other fields are its
    own). Raises InvalidRecord naming the field."""
    _messages(messages, None)
    _opt_str({"user": user}, "user", None)


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
    records: Sequence[Any],
    *,
    settings: Settings | None = None,
    batch: bool = True,
    secret: bytes | None = None,
    user_hashes: dict[str, str] | None = None,
) -> Prepared:
    """Validate records into rows; the first invalid one fails the whole batch.

    secret: the pseudonym key when the caller holds it (`user_secret` resolves CFT_HOME on
    disk each time: a fifth of the router's CPU for a log batch of one); user_hashes: a cache
    of encoded pseudonyms the caller keeps across batches (one per batch otherwise)."""
    settings = settings or get_settings()
    secret = secret or user_secret(settings)
    dim = settings.embedding_dim
    hashes: dict[str, str] = {} if user_hashes is None else user_hashes
    out = Prepared()
    window = created_at_window(settings)
    try:
        for i, rec in enumerate(records):
            request_id, row = prepare_record(
                rec,
                i if batch else None,
                secret=secret,
                dim=dim,
                window=window,
                user_hashes=hashes,
            )
            out.add(request_id, row)
    except InvalidRecord as exc:
        LOG_REJECTED.labels(exc.reason).inc()
        raise
    return out
