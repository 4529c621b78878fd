"""The router's one-statement log batch stores what `log_records` stores, the values as sent."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from app.core.config import get_settings
from app.core.db import as_tenant
from app.logs import service as logs
from app.logs.validation import InvalidRecord
from tests.support.factories import make_route, make_tenant

# Everything a value must carry unchanged: quotes, backslashes, tabs and newlines, a literal \N,
# placeholders, SQL, non-ASCII.
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
        row = stored(conn, via_batch["request_id"])
        assert row["completion"] == TRICKY and row["model"] == "m'\\"
        assert row["messages"] == via_batch["messages"] and row["experiment"] == "e'1"
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


def router_record(route: str, **over: Any) -> dict[str, Any]:
    """A record shaped as the router builds it (no created_at, no embedding)."""
    return {
        "request_id": str(uuid.uuid4()),
        "route": route,
        "model": "m'\\",
        "messages": [
            {"role": "system", "content": TRICKY},
            {"role": "user", "content": "call me at +34 612 345 678 " + TRICKY},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c'1", "x": "\\N"}]},
            {"role": "tool", "content": ""},
        ],
        "user": TRICKY,
        "adapter_id": "a'\\N",
        "experiment": "e'1",
        "variant": "b",
        "completion": TRICKY,
        "tokens_in": 12,
        "tokens_out": 0,
        "ttft_ms": 2**31 - 1,
        "status": "partial",
    } | over


def _fails_on_send() -> Any:
    class NoSend:
        def execute(self, *a: Any, **k: Any) -> None:
            raise AssertionError("nothing may be sent for an invalid batch")

    return NoSend()


def test_router_records_store_what_log_records_stores(db_url, conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    settings = get_settings()
    parent = str(uuid.uuid4())
    shapes: list[dict[str, Any]] = [
        {},
        {"user": None, "completion": None, "adapter_id": None, "model": None},
        {"completion": "", "adapter_id": "", "status": "error", "parent_request_id": parent},
        {"messages": [{"role": "user", "content": "mail me: a.b@example.com 😀"}]},
        {"experiment": None, "variant": None, "tokens_in": None, "ttft_ms": 0},
    ]
    cache: dict[str, str] = {}
    for over in shapes:
        via_copy, via_json = router_record(r["name"], **over), router_record(r["name"], **over)
        with psycopg.connect(db_url, row_factory=dict_row) as c, c.transaction():
            as_tenant(c, t["id"])
            logs.log_records(c, tenant_id=t["id"], records=[via_copy], settings=settings)
        with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
            # Twice with a kept pseudonym cache: the cached value is the computed one.
            logs.log_batch(c, tenant_id=t["id"], records=[via_json], user_hashes=cache)
            logs.log_batch(c, tenant_id=t["id"], records=[via_json], user_hashes=cache)
            assert c.execute("SELECT current_user AS u").fetchone()["u"] != "cft_app"
            assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        got, want = stored(conn, via_json["request_id"]), stored(conn, via_copy["request_id"])
        assert got.pop("created_at") is not None and want.pop("created_at") is not None
        assert got == want, over
    n = conn.execute(
        "SELECT count(*) AS n FROM obs.inference_log WHERE tenant_id = %s", (t["id"],)
    ).fetchone()
    assert n["n"] == 2 * len(shapes)


def test_log_batch_keeps_the_first_of_a_repeated_request_id_and_links(db_url, conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    first = router_record(r["name"], completion="first")
    again = first | {"completion": "second"}
    child = router_record(r["name"], parent_request_id=first["request_id"])
    records = [child, first, again]
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        logs.log_batch(c, tenant_id=t["id"], records=records)
    rows = conn.execute(
        "SELECT request_id::text AS rid, id, parent_id, completion FROM obs.inference_log"
        " WHERE tenant_id = %s",
        (t["id"],),
    ).fetchall()
    by_id = {row["rid"]: row for row in rows}
    assert len(rows) == 2 and by_id[first["request_id"]]["completion"] == "first"
    assert by_id[child["request_id"]]["parent_id"] == by_id[first["request_id"]]["id"]


# Records at the validator's edges: each is either invalid (InvalidRecord, nothing sent) or valid
# in a form the validator normalises (stored normalised).
def _refused(route: str) -> list[tuple[dict[str, Any], bool]]:
    def new() -> str:
        return str(uuid.uuid4())

    msg = [{"role": "user", "content": "hi"}]
    return [
        # (record, valid)
        ({"request_id": new().upper(), "route": route, "messages": msg}, True),
        ({"request_id": new(), "route": route, "messages": msg, "created_at": None}, True),
        ({"request_id": new(), "route": route, "messages": msg, "embedding": None}, True),
        (router_record(route, messages=[{"role": "user", "content": [{"type": "text"}]}]), True),
        (router_record(route, completion="a\\u0000b"), True),  # a literal backslash-u0000
        (router_record(route, parent_request_id=new().replace("-", "")), True),
        (router_record(route, user="x\x00y"), False),
        (router_record(route, completion="x\x00y"), False),
        (router_record(route, model="x\x00y"), False),
        (router_record(route, messages=[{"role": "user", "content": "x\x00y"}]), False),
        (router_record(route, user="u" * 257), False),
        (router_record(route, experiment="e" * 257), False),
        (router_record(route, variant="ab"), False),
        (router_record(route, tokens_in=True), False),
        (router_record(route, tokens_in=-1), False),
        (router_record(route, ttft_ms=2**31), False),
        (router_record(route, ttft_ms=1.0), False),
        (router_record(route, status="done"), False),
        (router_record(route, status=None), False),
        (router_record(route, messages=[]), False),
        (router_record(route, messages=[{"role": "bot", "content": "x"}]), False),
        (router_record(route, messages=[{"role": "user"}]), False),
        (router_record(route, messages=[{"role": "user", "content": 3}]), False),
        (router_record(route) | {"route": ""}, False),
        (router_record(route, request_id="not-a-uuid"), False),
        (router_record(route, request_id=None), False),
        (router_record(route, completion=3), False),
        (router_record(route, extra=1), False),
        ({"route": route, "messages": msg}, False),
    ]


def test_log_batch_normalises_or_refuses_what_the_validator_does(db_url, conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    for rec, valid in _refused(r["name"]):
        ok = router_record(r["name"])
        if valid:
            with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
                logs.log_batch(c, tenant_id=t["id"], records=[ok, rec])
        else:
            with pytest.raises(InvalidRecord):
                logs.log_batch(_fails_on_send(), tenant_id=t["id"], records=[ok, rec])
            # A repeated request_id is validated too, though only the first is stored.
            if rec.get("request_id") not in (None, "not-a-uuid"):
                dup = rec | {"request_id": ok["request_id"]}
                with pytest.raises(InvalidRecord):
                    logs.log_batch(_fails_on_send(), tenant_id=t["id"], records=[ok, dup])
    n = conn.execute(
        "SELECT count(*) AS n FROM obs.inference_log WHERE tenant_id = %s", (t["id"],)
    ).fetchone()
    assert n["n"] == 2 * sum(valid for _, valid in _refused(r["name"]))


@pytest.mark.parametrize("in_process", [True, False], ids=["thread", "log-process"])
def test_a_record_that_can_never_be_stored_is_dropped_alone_and_counted(db_url, conn, in_process):
    """A served call whose record the sink can never write (here a backend's completion with a
    NUL) must not block the router's log writer: the others land, that one is dropped and
    counted, and close() returns; the same through the log process, where the error crosses
    the pipe."""
    import asyncio

    from app.core.metrics import ROUTER_LOG_DROPPED
    from app.gateway.logprocess import WRITER_PERMANENT_ERRORS, ProcessSink
    from app.gateway.logsink import TENANT_KEY, LogSink
    from app.gateway.logwriter import LogWriter
    from app.gateway.service import log_dropped

    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    good = [record(r["name"]) | {TENANT_KEY: t["id"]} for _ in range(6)]
    bad = record(r["name"], completion="a NUL \x00 from the engine") | {TENANT_KEY: t["id"]}
    before = ROUTER_LOG_DROPPED.labels("nul")._value.get()
    sink = (
        LogSink(db_url, get_settings())
        if in_process
        else ProcessSink(db_url, get_settings(), inline_max=0)
    )

    async def main() -> LogWriter:
        writer = LogWriter(
            sink,
            max_delay=0.05,
            permanent=WRITER_PERMANENT_ERRORS,
            on_drop=log_dropped,
        )
        writer.start()
        for rec in [*good[:3], bad, *good[3:]]:
            writer.submit(rec)
        assert await asyncio.to_thread(writer.wait_written, bad["request_id"], 10.0)
        await asyncio.wait_for(writer.close(), 10.0)
        return writer

    try:
        writer = asyncio.run(main())
    finally:
        sink.close()
    assert writer.dropped == 1 and writer.written == 6
    assert ROUTER_LOG_DROPPED.labels("nul")._value.get() == before + 1
    ids = [g["request_id"] for g in good] + [bad["request_id"]]
    rows = conn.execute(
        "SELECT request_id::text AS id FROM obs.inference_log WHERE request_id = ANY(%s::uuid[])",
        (ids,),
    ).fetchall()
    assert sorted(row["id"] for row in rows) == sorted(g["request_id"] for g in good)


def test_insert_prepared_reports_each_record_and_stores_what_log_batch_stores(db_url, conn):
    """POST /v1/logs's write (`prepare` + `insert_prepared` in a tenant's transaction): a new
    record, the same id again within the batch, one logged before; the row is log_batch's."""
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    settings = get_settings()
    plain = {k: v for k, v in record(r["name"]).items() if k != "created_at"}

    def new() -> dict[str, Any]:
        return plain | {"request_id": str(uuid.uuid4())}

    def write(records: list[dict[str, Any]]) -> list[str]:
        with psycopg.connect(db_url, row_factory=dict_row) as c, c.transaction():
            as_tenant(c, t["id"])
            prepared = logs.prepare(records, settings=settings)
            return logs.insert_prepared(c, tenant_id=t["id"], prepared=prepared)

    old, first, via_batch = new(), new(), new()
    assert write([old]) == ["inserted"]
    assert write([first, first, old]) == ["inserted", "existing", "existing"]
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        logs.log_batch(c, tenant_id=t["id"], records=[via_batch], settings=settings)
    got, want = stored(conn, via_batch["request_id"]), stored(conn, first["request_id"])
    assert got.pop("created_at") is not None and want.pop("created_at") is not None
    assert got == want


def test_log_rows_runs_as_the_tenant_and_leaves_the_callers_scope(db_url, conn):
    """obs.log_rows writes as cft_app for its tenant whoever calls, puts the caller's role and
    tenant back, and refuses a transaction scoped to another tenant, and the dashboard's role."""
    t, other = make_tenant(conn), make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    scope = "SELECT current_user AS u, nullif(current_setting('cft.tenant_id', true), '') AS tenant"
    with psycopg.connect(db_url, row_factory=dict_row) as c:
        with c.transaction():  # the owner, unscoped
            before = c.execute(scope).fetchone()
            assert logs.log_records(c, tenant_id=t["id"], records=[record(r["name"])]) == [
                "inserted"
            ]
            assert c.execute(scope).fetchone() == before
        with c.transaction():
            as_tenant(c, t["id"])
            logs.log_records(c, tenant_id=t["id"], records=[record(r["name"])])
            assert c.execute(scope).fetchone() == {"u": "cft_app", "tenant": str(t["id"])}
        with pytest.raises(psycopg.errors.InsufficientPrivilege), c.transaction():
            as_tenant(c, t["id"])
            logs.log_records(c, tenant_id=other["id"], records=[record(r["name"])])
        with pytest.raises(psycopg.errors.InsufficientPrivilege), c.transaction():
            c.execute("SET LOCAL ROLE cft_dashboard")
            logs.log_records(c, tenant_id=t["id"], records=[record(r["name"])])
    n = conn.execute(
        "SELECT count(*) AS n FROM obs.inference_log WHERE tenant_id = %s", (t["id"],)
    ).fetchone()
    assert n["n"] == 2
