"""Eval suites over REST: a case's check must run in bounded time on the shared evaluator."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.core.auth import create_key
from app.evals.checks import check
from app.main import create_app
from tests.support.factories import make_route, make_tenant
from tests.support.servers import serve_app


@pytest.fixture
def api(db_url: str, conn: Any) -> Iterator[tuple[str, str, str]]:
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    key = create_key(conn, tenant_id=t["id"], role="trainer")
    with serve_app(create_app(db_url=db_url)) as base:
        yield base, key, r["name"]


def _suite(route: str, *cases: dict[str, Any]) -> dict[str, Any]:
    return {"id": "s1", "route": route, "cases": list(cases)}


def _case(check: str, expected: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], "check": check, "expected": expected}


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        (_case("regex", "(a)\\1"), "not an RE2 expression"),  # a backreference
        (_case("regex", "(?=x)y"), "not an RE2 expression"),  # lookahead
        (_case("regex", "x" * 1001), "at most 1000"),
        (_case("regex", 5), "a string"),
        (_case("json_schema", {"type": "string", "pattern": "(a)\\1"}), "not an RE2"),
        (_case("json_schema", {"patternProperties": {"^a": {}}}), "patternProperties"),
        (_case("json_schema", {"type": 12}), "not a valid JSON schema"),
        (_case("max_length", "ten"), "non-negative integer"),
        (_case("contains", "x" * 30_000), "larger than"),
    ],
)
def test_a_check_that_cannot_run_safely_is_a_422_that_says_why(api, conn, case, needle):
    base, key, route = api
    r = httpx.post(
        f"{base}/v1/eval-suites",
        json=_suite(route, case),
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 422, r.text
    assert needle in r.json()["error"]["message"]
    assert conn.execute("SELECT count(*) AS n FROM train.eval_suite").fetchone()["n"] == 0


def test_cases_per_suite_are_bounded(api):
    base, key, route = api
    r = httpx.post(
        f"{base}/v1/eval-suites",
        json=_suite(route, *[_case("contains", "x")] * 1001),
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 422


def test_a_catastrophic_pattern_is_stored_and_runs_in_linear_time(api):
    """`(.+)+Z` took 0.27 s at 22 characters with Python's re (x4 per 2 more); on RE2 it is
    linear, so the suite is accepted and its check stays fast on a long answer."""
    base, key, route = api
    cases = [
        _case("regex", "(.+)+Z"),
        _case("json_schema", {"type": "string", "pattern": "^(a+)+$"}),
    ]
    r = httpx.post(
        f"{base}/v1/eval-suites",
        json=_suite(route, *cases),
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 201, r.text
    started = time.perf_counter()
    assert not check("regex", "(.+)+Z", "a" * 100_000)
    assert not check(
        "json_schema", {"type": "string", "pattern": "^(a+)+$"}, '"' + "a" * 5000 + '!"'
    )
    assert check("json_schema", {"type": "string", "pattern": "^(a+)+$"}, '"aaaa"')
    assert time.perf_counter() - started < 1.0
