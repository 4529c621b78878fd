"""The router's JSON fast path (`ingest.staged_json`) never takes a record the validator
(`validation.prepare`) refuses: it repeats the validator's rules for the router's own record
shape, so a rule added to the validator alone would let router records past it. Checked over
generated records close to the rules' edges (no database: the stored rows are compared in
tests/integration/test_log_batch.py)."""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.config import get_settings
from app.core.pseudonym import user_secret
from app.logs import ingest
from app.logs.validation import InvalidRecord, prepare

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
ROLES = st.sampled_from(["user", "assistant", "system", "tool", "bot", "", None, 3])
CONTENT: st.SearchStrategy[Any] = st.one_of(
    TEXT, st.none(), st.integers(), st.just([{"type": "text", "text": "hi"}]), st.just({})
)
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": ROLES, "content": CONTENT}),
    st.fixed_dictionaries({"role": ROLES}),
    st.fixed_dictionaries({"role": ROLES, "tool_calls": st.just([{"id": "c1"}])}),
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
    "status": st.sampled_from(["ok", "error", "partial", "done", None]),
    "parent_request_id": UUIDS,
    "messages": st.one_of(st.lists(MESSAGE, min_size=1, max_size=3), st.just([]), TEXT),
    "extra_field": st.just(1),
}


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


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(), min_size=1, max_size=3))
def test_the_fast_path_never_takes_what_the_validator_refuses(batch: list[dict[str, Any]]) -> None:
    config = get_settings()
    secret = user_secret(config)
    fast = ingest.staged_json(batch, secret, {})
    try:
        prepare(batch, settings=config, secret=secret)
    except InvalidRecord as exc:
        assert fast is None, f"the fast path took a batch the validator refuses: {exc}"
    TAKEN.append(fast is not None)


TAKEN: list[bool] = []


def test_the_generated_batches_reach_both_paths() -> None:
    """The property above means something only if the fast path takes many of the batches."""
    test_the_fast_path_never_takes_what_the_validator_refuses()
    assert 0.2 < sum(TAKEN) / len(TAKEN) < 0.9, sum(TAKEN) / len(TAKEN)
