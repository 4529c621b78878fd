"""Schemathesis against the control plane's OpenAPI schema, served for real on loopback, with a
valid key of every role: no 5xx, and every response conforms to its documented schema.

CI runs CFT_FUZZ_EXAMPLES (default 12) examples per operation and role, plus as many negative
(schema-violating) ones with the admin key: at least 2,000 requests in all. `make fuzz` runs
more. The router's LLM endpoints are left out (they need an engine).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)

from app.core import auth
from app.core.config import Settings
from app.main import create_app
from tests.support import db as testdb
from tests.support.factories import make_adapter, make_log, make_route, make_tenant
from tests.support.servers import serve_app
from tests.support.training import make_snapshot

EXAMPLES = int(os.environ.get("CFT_FUZZ_EXAMPLES", "12"))
MIN_CASES = int(os.environ.get("CFT_FUZZ_MIN_CASES", "2000"))
EXCLUDED = {"/v1/chat/completions", "/v1/completions", "/v1/models"}
# The operator API refuses every tenant key (swept in test_security.py); it is fuzzed with an
# operator key in test_tenants_api.py.
EXCLUDED |= {"/v1/tenants", "/v1/tenants/{name}", "/v1/tenants/{name}/keys"}
EXCLUDED |= {"/v1/tenants/{name}/keys/{key_id}"}
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]


@pytest.fixture(scope="module")
def fuzz_server(pg_server: str, template_url: str, tmp_path_factory: Any) -> Iterator[Any]:
    """A fresh database with a little data, the real app on loopback and a key per role."""
    import psycopg
    from psycopg.rows import dict_row

    url = testdb.clone(pg_server)
    home: Path = tmp_path_factory.mktemp("fuzz-home")
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        tenant = make_tenant(conn)
        route = make_route(conn, tenant_id=tenant["id"])
        make_adapter(conn, route=route)
        make_snapshot(conn, tenant_id=tenant["id"], route=route["name"], method="sft")
        for _ in range(3):
            make_log(conn, tenant_id=tenant["id"], route=route["name"])
        keys = {
            role: auth.create_key(conn, tenant_id=tenant["id"], role=role) for role in auth.ROLES
        }
    settings = Settings(home=home, artefact_dir=home / "artefacts")
    try:
        with serve_app(create_app(settings, db_url=url, engine_urls=[])) as base:
            yield base, keys
    finally:
        testdb.drop(pg_server, url)


def _operations(base: str) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    return [op for op in ops if op.path not in EXCLUDED]


def _fuzz(op: Any, *, base: str, key: str, mode: GenerationMode, n: int, count: list[int]) -> None:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {key}"

    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        derandomize=os.environ.get("CFT_FUZZ_RANDOM") is None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        count[0] += 1
        response = case.call(base_url=base, session=session, timeout=30)
        case.validate_response(response, checks=CHECKS)

    run()


def test_fuzz_every_operation_with_every_role(fuzz_server: Any) -> None:
    base, keys = fuzz_server
    ops = _operations(base)
    assert len(ops) >= 20, [op.label for op in ops]
    count = [0]
    failures: list[str] = []
    timings: list[tuple[float, int, str]] = []
    plan = [(role, GenerationMode.POSITIVE, op) for role in auth.ROLES for op in ops]
    # Negative data needs something to break: a body or query parameters (path ids are free text).
    plan += [("admin", GenerationMode.NEGATIVE, op) for op in ops if len(op.body) or len(op.query)]
    started = time.monotonic()
    for role, mode, op in plan:
        t0, c0 = time.monotonic(), count[0]
        try:
            _fuzz(op, base=base, key=keys[role], mode=mode, n=EXAMPLES, count=count)
        except Unsatisfiable:
            continue  # nothing in the schema to violate for this operation
        except Exception as exc:  # collect every failing operation, then report them all
            failures.append(f"{op.label} [{role}, {mode.value}]: {str(exc)[:2000]}")
        timings.append((time.monotonic() - t0, count[0] - c0, f"{op.label} [{role}, {mode.value}]"))
    assert not failures, "\n\n".join(failures)
    print(f"fuzz: {count[0]} requests, {len(ops)} operations, {time.monotonic() - started:.0f} s")
    for seconds, n, label in sorted(timings, reverse=True)[:8]:
        print(f"  {seconds:6.1f} s {n:4d} cases  {label}")
    assert count[0] >= MIN_CASES, f"only {count[0]} cases were generated"


def test_nul_characters_are_a_client_error_not_a_500(fuzz_server: Any) -> None:
    """Regression (found by the fuzzer): a NUL in a text field made psycopg raise DataError, a 500."""
    base, keys = fuzz_server
    headers = {"Authorization": f"Bearer {keys['admin']}"}
    body = {
        "route": "r\x00",
        "method": "sft",
        "snapshot_id": "00000000-0000-0000-0000-000000000000",
    }
    r = requests.post(f"{base}/v1/training-runs", json=body, headers=headers, timeout=30)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_value" and "NUL" in r.json()["error"]["message"]
    r = requests.get(f"{base}/v1/adapters/a%00b", headers=headers, timeout=30)
    assert r.status_code in (404, 422), r.text


def test_the_audits_payloads_get_quick_answers_never_a_500(fuzz_server: Any) -> None:
    """The shapes an outside audit used (docs/security.md, "Doors"): a PII-pattern bomb, a
    created_at years ahead, eval checks that backtrack, and an OTLP span bomb. Each gets its
    documented answer within a time bound, and /healthz stays quick meanwhile."""
    import gzip
    import json
    import threading
    import uuid

    base, keys = fuzz_server

    def h(role: str, **more: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {keys[role]}"} | more

    route = requests.get(f"{base}/v1/routes", headers=h("reader"), timeout=30).json()[0]["name"]
    slowest: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            requests.get(f"{base}/healthz", timeout=30)
            slowest.append(time.perf_counter() - started)
            time.sleep(0.05)

    def record(**over: Any) -> dict[str, Any]:
        return {
            "request_id": str(uuid.uuid4()),
            "route": route,
            "adapter_id": "base",
            "messages": [{"role": "user", "content": "hi"}],
            "completion": "ok",
        } | over

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        cases = [
            # Quadratic on the old e-mail pattern: linear on RE2.
            ("POST", "/v1/logs", "ingest",
             {"records": [record(completion="@" + "a" * 300_000)]}, (200, 201)),
            # A week years ahead: refused, no partition made for it.
            ("POST", "/v1/logs", "ingest",
             {"records": [record(created_at="2030-01-07T00:00:00Z")]}, (422,)),
            # Backtracking patterns: RE2 runs them in linear time; backreferences are refused.
            ("POST", "/v1/eval-suites", "trainer", {"id": f"s-{uuid.uuid4().hex[:8]}",
             "route": route, "cases": [{"messages": [{"role": "user", "content": "hi"}],
                                        "check": "regex", "expected": "(.+)+Z"}]}, (201,)),
            ("POST", "/v1/eval-suites", "trainer", {"id": f"s-{uuid.uuid4().hex[:8]}",
             "route": route, "cases": [{"messages": [{"role": "user", "content": "hi"}],
                                        "check": "regex", "expected": "(a)\\1"}]}, (422,)),
        ]  # fmt: skip
        for method, path, role, body, expected in cases:
            started = time.perf_counter()
            r = requests.request(method, base + path, json=body, headers=h(role), timeout=60)
            took = time.perf_counter() - started
            assert r.status_code in expected, (path, r.status_code, r.text[:300])
            assert took < 5.0, (path, took)
        spans = [
            {"traceId": "01" * 16, "spanId": f"{i:016x}", "name": "x", "attributes": []}
            for i in range(28_000)
        ]
        doc = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}
        started = time.perf_counter()
        r = requests.post(
            f"{base}/v1/traces",
            data=gzip.compress(json.dumps(doc).encode()),
            headers=h("ingest", **{"Content-Type": "application/json", "Content-Encoding": "gzip"}),
            timeout=60,
        )
        assert r.status_code == 413 and time.perf_counter() - started < 5.0, r.text[:300]
    finally:
        stop.set()
        prober.join()
    assert slowest and max(slowest) < 1.5, max(slowest)
