"""Ingest of validated records: one COPY into a TEMP staging table, one INSERT ... SELECT.

PostgreSQL refuses COPY into a table with row-level security, so records are copied into a
per-connection TEMP staging table, then moved with one `INSERT ... SELECT ... WHERE NOT EXISTS`
into obs.inference_log as cft_app, so row-level security checks every row.

A batch is atomic: either every record is inserted or reported as already existing, or the
request fails and nothing is written. Records are idempotent by (tenant, request_id).

`log_records(conn=..., tenant_id=..., records=...)` is the entry point for other code (the
router logs proxied calls with it); the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from psycopg import errors as pg_errors

from app.core.config import Settings
from app.core.db import Connection
from app.core.errors import Conflict
from app.core.metrics import LOG_ROWS
from app.logs.validation import Prepared, prepare

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
                "SELECT obs.link_regenerations(%s, %s::uuid[])",
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


def summarize(request_ids: Iterable[str], statuses: Sequence[str]) -> dict[str, Any]:
    """The POST /v1/logs response body."""
    records = [
        {"request_id": rid, "status": st} for rid, st in zip(request_ids, statuses, strict=True)
    ]
    inserted = sum(1 for st in statuses if st == "inserted")
    return {"inserted": inserted, "existing": len(statuses) - inserted, "records": records}
