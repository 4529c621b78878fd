"""Ingest of validated records: one key probe, one COPY into a TEMP staging table, one INSERT.

PostgreSQL refuses COPY into a table with row-level security, so records are copied into a
per-connection TEMP staging table, then moved with one `INSERT ... SELECT` into
obs.inference_log as cft_app, so row-level security checks every row.

Idempotency: the request_ids already logged are found first with one index probe of
obs.request_key (`= ANY`, O(batch)), and only the others are copied. (An anti-join of the
staging table against obs.request_key was planned as a hash join over all of the tenant's keys,
O(tenant's log) per batch.) A concurrent request that logs one of the same ids between the probe
and the INSERT makes the request_key trigger raise unique_violation; the batch is retried once,
and the probe then sees that row.

A batch is atomic: either every record is inserted or reported as already existing, or the
request fails and nothing is written. Records are idempotent by (tenant, request_id).

`log_records(conn=..., tenant_id=..., records=...)` is the entry point for other code; the
caller owns the transaction. POST /v1/logs inserts plain records from one JSON literal (`stage`,
`insert_staged`: the same checks, half the Python per record, no staging table) and the others
through `prepare`. `log_batch` is the router's log writer's: a transaction of its own in one
round trip instead of ~11 (at low rates every proxied call is a batch of one, and each
round trip costs the router CPU: BENCHMARKS.md, "Router against LiteLLM (issue 26)"). It stages
the router's records from one JSON literal (`staged_json`: the checks the validator would
make, then one orjson.dumps) rather than validating into COPY lines and quoting each field: the
batch is Python holding the GIL that the router's event loop waits for, and this path is about
a third of that; anything it cannot encode exactly as the validator does goes the validator's
way, which stores the same row or raises the same InvalidRecord.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from psycopg import errors as pg_errors
from psycopg.rows import tuple_row

from app.core.config import Settings, get_settings
from app.core.db import Connection, tenant_scope_sql
from app.core.errors import Conflict
from app.core.metrics import LOG_ROWS
from app.core.pseudonym import user_hash, user_secret
from app.logs import pii
from app.logs.validation import (
    _CANONICAL_UUID,
    DEFAULT_ADAPTER,
    FIELDS,
    INT4_MAX,
    MAX_TEXT,
    ROLES,
    STATUSES,
    Prepared,
    prepare,
)

# The column order of the lines that validation.prepare_record encodes (after ord).
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
# The move of staged rows (in STAGING_COLUMNS) from {source}: the TEMP staging table, or the
# JSON path's CTE.
_MOVE_FROM = """
INSERT INTO obs.inference_log (request_id, tenant_id, user_hash, route, adapter_id, model,
  experiment, variant, messages, completion, ttft_ms, tokens_in, tokens_out, embedding,
  parent_request_id, pii_flags, status, created_at)
SELECT s.request_id, %(tenant_id)s, s.user_hash, s.route, s.adapter_id, s.model, s.experiment,
       s.variant, s.messages, s.completion, s.ttft_ms, s.tokens_in, s.tokens_out,
       s.embedding::halfvec, s.parent_request_id, s.pii_flags, s.status,
       coalesce(s.created_at, now())
  FROM {source} s
"""
_MOVE = _MOVE_FROM.format(source="log_staging") + " ORDER BY s.ord"
# The ids of this batch that are already logged (an index probe per id, under row-level security).
_EXISTING = """
SELECT request_id::text AS request_id FROM obs.request_key
 WHERE tenant_id = %s AND request_id = ANY (%s::uuid[])
"""


# _MOVE with the key probe inside: the ids of the staged rows already logged are read with one
# `= ANY` probe of obs.request_key's primary key (both ARRAYs are init plans, computed once: no
# anti-join over the tenant's keys), and only the other rows are inserted.
_MOVE_NEW_FROM = (
    _MOVE_FROM
    + """ WHERE s.request_id <> ALL (ARRAY(
   SELECT k.request_id FROM obs.request_key k
    WHERE k.tenant_id = %(tenant_id)s
      AND k.request_id = ANY (ARRAY(SELECT request_id FROM {source}))))
 ORDER BY s.ord"""
)
_MOVE_NEW = _MOVE_NEW_FROM.format(source="log_staging")
# Linking every staged id, including ones logged before, is harmless: it only links what is
# unlinked, so a row already linked is left as it is.
_LINK_STAGED = (
    "SELECT obs.link_regenerations(%(tenant_id)s, ARRAY(SELECT request_id FROM log_staging))"
)


def insert_prepared(conn: Connection, *, tenant_id: int, prepared: Prepared) -> list[str]:
    """Write prepared records; return the status of each: 'inserted' or 'existing'."""
    inserted = _retried(conn, lambda: _copy_and_move(conn, tenant_id, prepared))
    return _statuses(prepared.request_ids, inserted)


@dataclass
class Staged:
    """Records the JSON path took: their request_ids in order and the SELECT that stages them."""

    request_ids: list[str]
    select: str


def stage(records: Sequence[Any], *, settings: Settings | None = None) -> Staged | None:
    """The records staged from one JSON literal (`staged_json`), or None when any of them is
    not one that path encodes exactly as `prepare` does: then `prepare` (which stores the same
    rows, or raises the InvalidRecord naming the record and field) is the way. About half the
    Python per record of prepare and its COPY lines."""
    settings = settings or get_settings()
    select = staged_json(records, user_secret(settings), {})
    if select is None:
        return None
    return Staged([rec["request_id"] for rec in records], select)


def insert_staged(conn: Connection, *, tenant_id: int, staged: Staged) -> list[str]:
    """Write staged records (as insert_prepared does); the status of each."""
    inserted = _retried(conn, lambda: _stage_and_move(conn, tenant_id, staged.select))
    return _statuses(staged.request_ids, inserted)


def _retried(conn: Connection, write: Callable[[], set[str]]) -> set[str]:
    """Run write in a savepoint; once more if a concurrent request logged one of its ids."""
    for attempt in (1, 2):
        try:
            with conn.transaction():
                return write()
        except pg_errors.UniqueViolation as exc:
            # A concurrent request logged one of these request_ids after our key probe; on
            # retry the probe sees its row.
            if attempt == 2:
                raise Conflict(
                    "concurrent requests are logging the same request_ids: retry the batch"
                ) from exc
    raise AssertionError("unreachable")


def _statuses(request_ids: Sequence[str], inserted: set[str]) -> list[str]:
    """'inserted' for the first record of each id written now, 'existing' for the others."""
    seen: set[str] = set()
    result = []
    for rid in request_ids:
        result.append("inserted" if rid in inserted and rid not in seen else "existing")
        seen.add(rid)
    n = len(inserted)
    LOG_ROWS.labels("inserted").inc(n)
    LOG_ROWS.labels("existing").inc(len(result) - n)
    return result


# The JSON rows straight into the log, no staging table (COPY is what needs one: it cannot
# write a table with row-level security): the rows are a MATERIALIZED CTE, read once for the
# key probe and once for the INSERT.
_MOVE_NEW_JSON = _MOVE_NEW_FROM.format(source="staged") + " RETURNING request_id::text"


def _stage_and_move(conn: Connection, tenant_id: int, select: str) -> set[str]:
    move = _MOVE_NEW_JSON % {"tenant_id": int(tenant_id)}
    with conn.cursor(row_factory=tuple_row) as cur:
        # No parameters: psycopg sends the text as is (a % in a value is not a placeholder).
        cur.execute(f"WITH staged ({STAGING_COLUMNS}) AS MATERIALIZED ({select}) {move}")
        inserted = {row[0] for row in cur.fetchall()}
        if inserted:
            cur.execute(
                "SELECT obs.link_regenerations(%s, %s::uuid[])", (tenant_id, list(inserted))
            )
    return inserted


def _copy_and_move(conn: Connection, tenant_id: int, prepared: Prepared) -> set[str]:
    # A line is "ord\trequest_id\t...": the id is its second field.
    ids = [line.split("\t", 2)[1] for line in prepared.lines]
    with conn.cursor() as cur:
        existing = {
            row["request_id"] for row in cur.execute(_EXISTING, (tenant_id, ids)).fetchall()
        }
        new = [(rid, line) for rid, line in zip(ids, prepared.lines, strict=True)]
        if existing:
            new = [(rid, line) for rid, line in new if rid not in existing]
        if not new:
            return set()
        # One round trip; the DELETE empties rows of an earlier call in this transaction.
        cur.execute(_CREATE_STAGING + "; DELETE FROM log_staging")
        with cur.copy(f"COPY log_staging ({STAGING_COLUMNS}) FROM STDIN") as copy:
            copy.write("".join(line for _, line in new).encode())
        cur.execute(_MOVE, {"tenant_id": tenant_id})
        inserted = {rid for rid, _ in new}
        cur.execute("SELECT obs.link_regenerations(%s, %s::uuid[])", (tenant_id, list(inserted)))
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


def _literal(field: str) -> str:
    r"""A field of a COPY text line as an SQL literal with the same value.

    Validation escapes every backslash in a value, so a field holds no backslash but those of
    the escapes \\, \t, \n, \r (or is \N, NULL), which an E'' string reads exactly as COPY
    does: doubling ' is the only quoting left to do."""
    return "NULL" if field == "\\N" else "E'" + field.replace("'", "''") + "'"


def log_batch(
    conn: Connection,
    *,
    tenant_id: int,
    records: Sequence[dict[str, Any]],
    settings: Settings | None = None,
    secret: bytes | None = None,
    user_hashes: dict[str, str] | None = None,
) -> None:
    """Log records for a tenant in a transaction of its own, in one round trip.

    conn must be in autocommit mode and idle. Same rows, keys, links and row-level security
    as log_records, sent as one simple-protocol query: BEGIN, the tenant scope, the staged
    rows, the move of the rows not yet logged, the regeneration links, COMMIT. On an error the
    transaction is left aborted: close or roll back the connection. A concurrent request
    logging one of the same ids raises unique_violation; a retry then finds that row and skips
    it (idempotent by request_id). Raises InvalidRecord before sending anything if a record is
    invalid. secret: the pseudonym key, when the caller holds it (see `prepare`); user_hashes:
    a cache of encoded pseudonyms (user id -> value) the caller keeps across batches.
    """
    if not records:
        return
    settings = settings or get_settings()
    secret = secret or user_secret(settings)
    staged = staged_json(records, secret, {} if user_hashes is None else user_hashes)
    if staged is None:
        staged = _staged_literals(prepare(records, settings=settings, secret=secret))
        if not staged:
            return
    tenant = {"tenant_id": int(tenant_id)}
    # No parameters: psycopg sends the text as is (a % in a value is not a placeholder).
    conn.execute(
        f"BEGIN; {tenant_scope_sql(tenant_id)}; {_CREATE_STAGING};"
        f" INSERT INTO log_staging ({STAGING_COLUMNS}) {staged};"
        f" {_MOVE_NEW % tenant}; {_LINK_STAGED % tenant}; COMMIT"
    )


def _staged_literals(prepared: Prepared) -> str:
    """The prepared COPY lines as a VALUES list of literals ('' for none)."""
    if not prepared.lines:
        return ""
    return "VALUES " + ",".join(
        "(" + ",".join(map(_literal, line[:-1].split("\t"))) + ")" for line in prepared.lines
    )


# The router's records, staged from one JSON array of rows (one array per record, in
# STAGING_COLUMNS order less embedding and created_at, which the router never sets): the
# client's encoding is one orjson.dumps, C-speed, instead of a Python literal per field.
_FROM_JSON = """SELECT (r->>0)::int, (r->>1)::uuid, (r->>2)::bytea, r->>3, r->>4, r->>5, r->>6,
       r->>7, r->8, r->>9, (r->>10)::int, (r->>11)::int, (r->>12)::int, NULL::text,
       (r->>13)::uuid, (r->>14)::smallint, r->>15, NULL::timestamptz
  FROM jsonb_array_elements(E'{}'::jsonb) r"""
# Fields the JSON path takes; a record with any other field (embedding, created_at) goes
# through the validator and the literals.
_JSON_FIELDS = FIELDS - {"embedding", "created_at"}
# Encoded pseudonyms kept across batches (cleared when full: a cache, not a record).
_MAX_USER_HASHES = 10_000
_TEXT_FIELDS = ("route", "adapter_id", "model", "experiment", "user")
_INT_FIELDS = ("ttft_ms", "tokens_in", "tokens_out")


def staged_json(records: Sequence[Any], secret: bytes, user_hashes: dict[str, str]) -> str | None:
    """The SELECT that stages records from one JSON literal, or None when any record is not
    one this path encodes exactly as `prepare` does (then the caller takes that path, which
    stores the same row or raises its InvalidRecord).

    Accepted: the fields and values `prepare` accepts unchanged (canonical UUIDs, string
    contents, no embedding or created_at): each row holds the values prepare's COPY line
    holds, so the stored rows are the same. NUL, which PostgreSQL's text cannot hold, is
    checked once over the whole encoded batch, as prepare checks it per field."""
    rows: list[list[Any]] = []
    repeated: list[list[Any]] = []
    seen: set[str] = set()
    for i, rec in enumerate(records):
        if type(rec) is not dict or not rec.keys() <= _JSON_FIELDS:
            return None
        rid = rec.get("request_id")
        if type(rid) is not str or not _CANONICAL_UUID.fullmatch(rid):
            return None
        route = rec.get("route")
        if type(route) is not str or not route:
            return None
        for name in _TEXT_FIELDS:
            value = rec.get(name)
            if value is not None and (type(value) is not str or len(value) > MAX_TEXT):
                return None
        variant = rec.get("variant")
        if variant is not None and (type(variant) is not str or len(variant) > 1):
            return None
        completion = rec.get("completion")
        if completion is not None and type(completion) is not str:
            return None
        for name in _INT_FIELDS:
            value = rec.get(name)
            if value is not None and (type(value) is not int or not 0 <= value <= INT4_MAX):
                return None
        status = rec.get("status", "ok")
        parent = rec.get("parent_request_id")
        if status not in STATUSES or (
            parent is not None
            and (type(parent) is not str or not _CANONICAL_UUID.fullmatch(parent))
        ):
            return None
        messages = rec.get("messages")
        if type(messages) is not list or not messages:
            return None
        texts = []
        for msg in messages:
            if type(msg) is not dict or msg.get("role") not in ROLES:
                return None
            content = msg.get("content")
            if content is None:
                if "content" not in msg and not msg.get("tool_calls"):
                    return None
                texts.append("")
            elif type(content) is str:
                texts.append(content)
            else:
                return None  # content parts: prepare's own rules
        text = "\n".join(texts)
        if completion:
            text = text + "\n" + completion
        user = rec.get("user")
        if user is None:
            hashed = None
        elif "\x00" in user:
            return None
        else:
            hashed = user_hashes.get(user)
            if hashed is None:
                if len(user_hashes) >= _MAX_USER_HASHES:
                    user_hashes.clear()
                hashed = user_hashes[user] = "\\x" + user_hash(user, secret).hex()
        row = [
            i,
            rid,
            hashed,
            route,
            rec.get("adapter_id") or DEFAULT_ADAPTER,
            rec.get("model"),
            rec.get("experiment"),
            variant,
            messages,
            completion,
            rec.get("ttft_ms"),
            rec.get("tokens_in"),
            rec.get("tokens_out"),
            parent,
            pii.detect(text),
            status,
        ]
        # prepare validates a repeated request_id, then keeps the first: a repeat is encoded
        # too, so that the NUL check below covers it, but not staged.
        (repeated if rid in seen else rows).append(row)
        seen.add(rid)
    try:
        doc = orjson.dumps(rows).decode()
        other = orjson.dumps(repeated).decode() if repeated else ""
    except orjson.JSONEncodeError:
        return None  # prepare raises its own error for what orjson cannot encode
    # orjson writes every control character escaped, so a NUL anywhere is this text (or a
    # literal backslash-u0000 in a value, which prepare refuses in messages too: its path).
    if "\\u0000" in doc or "\\u0000" in other:
        return None
    return _FROM_JSON.format(doc.replace("\\", "\\\\").replace("'", "''"))


def summarize(request_ids: Iterable[str], statuses: Sequence[str]) -> dict[str, Any]:
    """The POST /v1/logs response body."""
    records = [
        {"request_id": rid, "status": st} for rid, st in zip(request_ids, statuses, strict=True)
    ]
    inserted = sum(1 for st in statuses if st == "inserted")
    return {"inserted": inserted, "existing": len(statuses) - inserted, "records": records}
