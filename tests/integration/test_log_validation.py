"""The one log-record validator (`app.logs.validation`) is the database's gate: a batch it
accepts is stored as sent (normalised where its rules say so: UUIDs, a missing adapter or
status), and a batch it refuses fails with the first invalid record's InvalidRecord before
anything is sent. Checked over generated records close to the rules' edges, through the
router's log batch (`log_batch`, the same validator and statement as POST /v1/logs)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from app.core.config import get_settings
from app.core.pseudonym import user_hash, user_secret
from app.logs import service as logs
from tests.support.factories import make_route, make_tenant

TEXT = st.text(
    alphabet=st.sampled_from(["a", "'", "\\", "\t", "\n", "\x00", "ñ", "😀", "%", "u", "0"]),
    max_size=8,
)
LONG = st.builds(lambda n, c: c * n, st.sampled_from([0, 1, 255, 256, 257]), st.just("x"))
STRINGISH = st.one_of(TEXT, LONG, st.none(), st.integers(-2, 2), st.booleans())
INTS = st.one_of(
    st.none(),
    st.integers(-1, 3),
    st.sampled_from([2**31 - 1, 2**31]),
    st.booleans(),
    st.floats(0, 2),
    TEXT,
)
ROLES = st.sampled_from(["user", "assistant", "system", "tool", "bot", "", None, 3, ["user"]])
CONTENT: st.SearchStrategy[Any] = st.one_of(
    TEXT,
    st.none(),
    st.integers(),
    st.just([{"type": "text", "text": "hi"}]),
    st.just([{"text": "no type"}]),
    st.just({}),
)
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": ROLES, "content": CONTENT}),
    st.fixed_dictionaries({"role": ROLES}),
    st.fixed_dictionaries({"role": ROLES, "tool_calls": st.just([{"id": "c'1", "x": "\\N"}])}),
    st.just("not an object"),
)
UUIDS = st.one_of(
    st.builds(lambda: str(uuid.uuid4())),
    st.builds(lambda: str(uuid.uuid4()).upper()),
    st.builds(lambda: uuid.uuid4().hex),
    st.just("not-a-uuid"),
    st.none(),
)
EDGES: dict[str, Any] = {
    "request_id": UUIDS,
    "route": st.one_of(TEXT, LONG, st.none()),
    "adapter_id": STRINGISH,
    "model": STRINGISH,
    "experiment": STRINGISH,
    "variant": st.one_of(st.sampled_from(["A", "B", "AB", ""]), STRINGISH),
    "completion": st.one_of(TEXT, st.none(), st.integers()),
    "user": STRINGISH,
    "ttft_ms": INTS,
    "tokens_in": INTS,
    "tokens_out": INTS,
    "status": st.sampled_from(["ok", "error", "partial", "done", None, ["ok"], {}]),
    "parent_request_id": UUIDS,
    "messages": st.one_of(st.lists(MESSAGE, min_size=1, max_size=3), st.just([]), TEXT),
    "extra_field": st.just(1),
}
COLUMNS = (
    "request_id::text, user_hash, route, adapter_id, model, experiment, variant, messages,"
    " completion, ttft_ms, tokens_in, tokens_out, parent_request_id::text, status"
)


def _record(draw: Any) -> dict[str, Any]:
    """A valid router record with up to two fields set to a value near a rule's edge."""
    rec: dict[str, Any] = {
        "request_id": str(uuid.uuid4()),
        "route": "support",
        "messages": [{"role": "user", "content": draw(TEXT.filter(lambda t: "\x00" not in t))}],
        "model": "base",
        "user": "alice",
        "completion": "an answer",
        "ttft_ms": 3,
    }
    for name in draw(st.lists(st.sampled_from(sorted(EDGES)), max_size=2, unique=True)):
        if draw(st.booleans()) and name in rec:
            del rec[name]
        else:
            rec[name] = draw(EDGES[name])
    return rec


records = st.composite(_record)


def _expected(rec: dict[str, Any], secret: bytes) -> dict[str, Any]:
    """The row the rules say a valid record becomes, worked out from the record alone."""
    parent, variant = rec.get("parent_request_id"), rec.get("variant")
    return {
        "request_id": str(uuid.UUID(rec["request_id"])),
        "user_hash": None if rec.get("user") is None else user_hash(rec["user"], secret),
        "route": rec["route"],
        "adapter_id": rec.get("adapter_id") or "base",
        "model": rec.get("model"),
        "experiment": rec.get("experiment"),
        "variant": None if variant is None else variant.ljust(1),  # char(1) pads
        "messages": rec["messages"],
        "completion": rec.get("completion"),
        "ttft_ms": rec.get("ttft_ms"),
        "tokens_in": rec.get("tokens_in"),
        "tokens_out": rec.get("tokens_out"),
        "parent_request_id": None if parent is None else str(uuid.UUID(parent)),
        "status": rec.get("status", "ok"),
    }


class _NoSend:
    def execute(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("nothing may be sent for an invalid batch")


SEEN: list[bool] = []


@pytest.fixture
def tenant(conn: Any) -> dict[str, Any]:
    t = make_tenant(conn)
    make_route(conn, tenant_id=t["id"], name="support")
    return t


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(batch=st.lists(records(), min_size=1, max_size=3))
def test_a_batch_is_stored_as_sent_or_refused_at_its_first_invalid_record(
    db_url: str, conn: Any, tenant: dict[str, Any], batch: list[dict[str, Any]]
) -> None:
    config = get_settings()
    secret = user_secret(config)
    alone = []
    for rec in batch:
        try:
            logs.prepare([rec], settings=config, secret=secret)
            alone.append(None)
        except logs.InvalidRecord as exc:
            alone.append(exc)
    bad = next((i for i, exc in enumerate(alone) if exc is not None), None)
    SEEN.append(bad is None)
    if bad is not None:
        with pytest.raises(logs.InvalidRecord) as refused:
            logs.log_batch(_NoSend(), tenant_id=tenant["id"], records=batch, secret=secret)  # type: ignore[arg-type]
        first = alone[bad]
        assert first is not None
        assert refused.value.param == (first.param or "").replace("records[0]", f"records[{bad}]")
        assert refused.value.message == first.message.replace("records[0]", f"records[{bad}]")
        return
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        logs.log_batch(c, tenant_id=tenant["id"], records=batch, secret=secret)
    firsts = {str(uuid.UUID(rec["request_id"])): rec for rec in reversed(batch)}
    for rid, rec in firsts.items():
        row = conn.execute(
            f"SELECT {COLUMNS} FROM obs.inference_log WHERE tenant_id = %s AND request_id = %s",
            (tenant["id"], rid),
        ).fetchone()
        assert row is not None, rec
        assert dict(row) == _expected(rec, secret), rec


def test_the_generated_batches_reach_both_outcomes(
    db_url: str, conn: Any, tenant: dict[str, Any]
) -> None:
    """The property above means something only if many batches are stored and many refused."""
    SEEN.clear()
    test_a_batch_is_stored_as_sent_or_refused_at_its_first_invalid_record(db_url, conn, tenant)  # type: ignore[call-arg]
    assert 0.2 < sum(SEEN) / len(SEEN) < 0.9, sum(SEEN) / len(SEEN)
