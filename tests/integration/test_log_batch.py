"""The router's one-round-trip log batch stores what the API's COPY ingest stores."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row

from app.core.config import get_settings
from app.core.db import as_tenant
from app.logs import service as logs
from tests.support.factories import make_route, make_tenant

# Everything the literal encoding must carry unchanged: quotes, backslashes, the COPY
# separators, a literal \N, placeholders, SQL, non-ASCII.
TRICKY = "it's \\ a\ttab\nnew\rline \\N %s %(x)s '); DROP TABLE obs.inference_log; -- ñ 😀"
COLUMNS = (
    "user_hash, route, adapter_id, model, experiment, variant, messages, completion, ttft_ms,"
    " tokens_in, tokens_out, parent_request_id, pii_flags, status, created_at"
)


def record(route: str, **over: Any) -> dict[str, Any]:
    return {
        "request_id": str(uuid.uuid4()),
        "route": route,
        "messages": [{"role": "user", "content": TRICKY}, {"role": "assistant", "content": "x"}],
        "completion": TRICKY,
        "model": "m'\\",
        "user": TRICKY,
        "ttft_ms": 3,
        "tokens_in": 12,
        "created_at": "2026-12-01T10:00:00+00:00",
    } | over


def stored(conn: psycopg.Connection[Any], request_id: str) -> dict[str, Any]:
    row = conn.execute(
        f"SELECT {COLUMNS} FROM obs.inference_log WHERE request_id = %s", (request_id,)
    ).fetchone()
    assert row is not None
    return dict(row)


def test_log_batch_stores_what_log_records_stores_and_is_idempotent(db_url, conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    settings = get_settings()
    via_copy, via_batch = record(r["name"]), record(r["name"], variant=None, experiment="e'1")
    via_copy["experiment"] = "e'1"
    with psycopg.connect(db_url, row_factory=dict_row) as c, c.transaction():
        as_tenant(c, t["id"])
        logs.log_records(c, tenant_id=t["id"], records=[via_copy], settings=settings)
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        logs.log_batch(c, tenant_id=t["id"], records=[via_batch], settings=settings)
        # The scope ended with the transaction; the connection is idle and usable.
        assert c.execute("SELECT current_user AS u").fetchone()["u"] != "cft_app"
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert stored(conn, via_batch["request_id"]) == stored(conn, via_copy["request_id"])
        # Again, with one new record: only the new one is inserted (idempotent by request_id).
        new = record(r["name"])
        logs.log_batch(c, tenant_id=t["id"], records=[via_batch, via_copy, new], settings=settings)
    n = conn.execute(
        "SELECT count(*) AS n FROM obs.inference_log WHERE tenant_id = %s", (t["id"],)
    ).fetchone()
    assert n["n"] == 3


def test_log_batch_links_regenerations_within_and_across_batches(db_url, conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    parent = record(r["name"])
    child = record(r["name"], parent_request_id=parent["request_id"])
    orphan = record(r["name"], parent_request_id=str(uuid.uuid4()))
    grandchild_first = record(r["name"])
    grandchild = record(r["name"], parent_request_id=grandchild_first["request_id"])
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        logs.log_batch(c, tenant_id=t["id"], records=[child, parent, orphan, grandchild])
        logs.log_batch(c, tenant_id=t["id"], records=[grandchild_first])

    def row(rec: dict[str, Any]) -> dict[str, Any]:
        got = conn.execute(
            "SELECT id, parent_id, fb_regen, regenerated_by FROM obs.inference_log"
            " WHERE request_id = %s",
            (rec["request_id"],),
        ).fetchone()
        assert got is not None
        return dict(got)

    assert row(child)["parent_id"] == row(parent)["id"]
    assert row(parent)["fb_regen"] and str(row(parent)["regenerated_by"]) == child["request_id"]
    assert row(orphan)["parent_id"] is None
    assert row(grandchild)["parent_id"] == row(grandchild_first)["id"]
