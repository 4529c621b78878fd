"""Ingest of validated records: one statement, `obs.log_rows`, writes a batch.

`validation.prepare` turns records into rows (keyed by the columns `obs.log_rows` reads, holding
the values stored); the rows travel as one JSON array, a query parameter, so no value is ever
part of the SQL text. `obs.log_rows` (sql/obs/log_rows.sql) inserts the rows not yet logged as
cft_app for the tenant, under row-level security, and links their regenerations.

A batch is atomic: either every record is inserted or reported as already existing, or the
request fails and nothing is written. Records are idempotent by (tenant, request_id); a
concurrent request that logs one of the same ids makes the insert raise unique_violation, and
the batch is retried once (its key probe then sees that row).

`log_records(conn=..., tenant_id=..., records=...)` is the entry point for other code; the
caller owns the transaction. POST /v1/logs runs `prepare` and `insert_prepared` itself.
`log_batch` is the router's log writer's: one statement in a transaction of its own (at low
rates every proxied call is a batch of one, and each round trip costs the router CPU:
BENCHMARKS.md, "Router against LiteLLM (issue 26)").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson
from psycopg import errors as pg_errors
from psycopg.rows import tuple_row
from psycopg.types.json import Json

from app.core.config import Settings, get_settings
from app.core.db import Connection
from app.core.errors import Conflict
from app.core.metrics import LOG_ROWS
from app.logs.validation import Prepared, prepare

_LOG_ROWS = "SELECT * FROM obs.log_rows(%s, %s)"
# The router's batch needs no ids back: one row instead of one per record (psycopg's CPU).
_LOG_BATCH = "SELECT count(*) FROM obs.log_rows(%s, %s)"


def _rows(prepared: Prepared) -> Json:
    """The rows as one JSON parameter (orjson's bytes, sent as they are)."""
    return Json(prepared.rows, dumps=orjson.dumps)


def insert_prepared(conn: Connection, *, tenant_id: int, prepared: Prepared) -> list[str]:
    """Write prepared records; return the status of each: 'inserted' or 'existing'."""
    inserted = _retried(conn, lambda: _insert(conn, tenant_id, prepared))
    return _statuses(prepared.request_ids, inserted)


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


def _insert(conn: Connection, tenant_id: int, prepared: Prepared) -> set[str]:
    if not prepared.rows:
        return set()
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(_LOG_ROWS, (tenant_id, _rows(prepared)))
        return {row[0] for row in cur.fetchall()}


def log_records(
    conn: Connection,
    *,
    tenant_id: int,
    records: Sequence[dict[str, Any]],
    settings: Settings | None = None,
) -> list[str]:
    """Log records (dicts with the POST /v1/logs fields) for a tenant; 'inserted'/'existing' each.

    Runs in the caller's transaction; conn is scoped to this tenant (`as_tenant`) or to none
    (`obs.log_rows` runs as the tenant either way). Raises InvalidRecord (422) before writing
    anything if a record is invalid.
    """
    prepared = prepare(records, settings=settings)
    return insert_prepared(conn, tenant_id=tenant_id, prepared=prepared)


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

    conn must be in autocommit mode and idle: the one statement is the transaction. Same rows,
    keys, links and row-level security as log_records. A concurrent request logging one of the
    same ids raises unique_violation; a retry then finds that row and skips it (idempotent by
    request_id). Raises InvalidRecord before sending anything if a record is invalid. secret:
    the pseudonym key, when the caller holds it (see `prepare`); user_hashes: a cache of encoded
    pseudonyms (user id -> value) the caller keeps across batches.
    """
    if not records:
        return
    prepared = prepare(
        records, settings=settings or get_settings(), secret=secret, user_hashes=user_hashes
    )
    conn.execute(_LOG_BATCH, (tenant_id, _rows(prepared)))


def summarize(request_ids: Iterable[str], statuses: Sequence[str]) -> dict[str, Any]:
    """The POST /v1/logs response body."""
    records = [
        {"request_id": rid, "status": st} for rid, st in zip(request_ids, statuses, strict=True)
    ]
    inserted = sum(1 for st in statuses if st == "inserted")
    return {"inserted": inserted, "existing": len(statuses) - inserted, "records": records}
