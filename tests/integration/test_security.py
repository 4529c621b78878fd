"""Security, against the real app on loopback, a real engine and real PostgreSQL:

- every endpoint admits exactly the roles it declares (introspected from the app, so a new
  endpoint is swept too) and answers 403 in the OpenAI error shape to the others;
- another tenant's rows never come back through list filters, pagination cursors or exports;
- SQL-injection strings in every string field of the write endpoints are stored as data;
- API keys are stored hashed and looked up by hash; user ids are never stored in clear;
- request bodies and headers are bounded; CORS is closed;
- the PostgreSQL roles: cft_dashboard cannot write anything, cft_app cannot get around RLS.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import psycopg
import pytest
from fastapi import routing
from psycopg import errors as pg_errors
from psycopg.rows import dict_row

from app.core import auth
from app.core.config import Settings
from app.core.limits import MAX_HEADER_BYTES
from app.gateway import keys
from cft.engine.core import Engine
from cft.engine.server import create_app as create_engine_app
from cft.serve import create_app
from tests.support import dashboard
from tests.support import db as testdb
from tests.support.factories import make_adapter, make_log, make_route, make_tenant
from tests.support.servers import serve_app
from tests.support.training import make_run, make_snapshot
from workers import base_model

pytestmark = pytest.mark.slow  # one real engine for the router calls
BASE = base_model.BUNDLED
MAX_BODY = 64 * 1024
SECRET = "test-user-hash-secret"
# Endpoints anyone may call; the dashboard checks its cookie itself (tested below).
# (Prometheus metrics are not on the API's port at all: they name every tenant's routes.)
PUBLIC = {"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
DASHBOARD = "/dashboard"
# The intended policy. The sweep reads each endpoint's roles from the app itself; this table
# catches a role widened (or narrowed) by accident. A new endpoint is swept by its declared
# roles, and must declare some.
READ = frozenset({"reader", "trainer", "release", "admin"})
# The dashboard only reads: an admin key is refused there (it logs in with a reader key).
DASHBOARD_READ = frozenset({"reader", "trainer", "release"})
EXPECTED: dict[str, frozenset[str]] = {
    "GET /v1/adapters": READ,
    "POST /v1/adapters": frozenset({"trainer", "admin"}),
    "GET /v1/adapters/{adapter_id}": READ,
    "GET /v1/adapters/{adapter_id}/promotion-check": READ,
    "POST /v1/adapters/{adapter_id}/canary": frozenset({"release", "admin"}),
    "POST /v1/adapters/{adapter_id}/promote": frozenset({"release", "admin"}),
    "POST /v1/adapters/{adapter_id}/rollback": frozenset({"release", "admin"}),
    "POST /v1/adapters/{adapter_id}/eval-results": frozenset({"trainer", "release", "admin"}),
    "POST /v1/adapters/{adapter_id}/evaluate": frozenset({"trainer", "admin"}),
    "GET /v1/promotion-policy": READ,
    "PUT /v1/promotion-policy": frozenset({"admin"}),
    "POST /v1/datasets/snapshots": frozenset({"trainer", "admin"}),
    "GET /v1/datasets/snapshots/{snapshot_id}": READ,
    "GET /v1/datasets/snapshots/{snapshot_id}/export": READ,
    "POST /v1/logs": frozenset({"ingest", "client", "admin"}),
    "POST /v1/traces": frozenset({"ingest", "client", "admin"}),
    "POST /v1/logs/{request_id}/feedback": frozenset({"ingest", "client", "admin"}),
    "GET /v1/logs/{request_id}": READ,
    "GET /v1/logs": READ,
    "POST /v1/training-runs": frozenset({"trainer", "admin"}),
    "GET /v1/training-runs/{run_id}": READ,
    "GET /v1/training-runs": READ,
    "POST /v1/training-runs/{run_id}/cancel": frozenset({"trainer", "admin"}),
    "POST /v1/eval-suites": frozenset({"trainer", "admin"}),
    "GET /v1/eval-suites": READ,
    "POST /v1/users/forget": frozenset({"admin"}),
    "GET /v1/experiments": READ,
    "GET /v1/experiments/{name}/metrics": READ,
    "POST /v1/chat/completions": frozenset({"ingest", "client", "admin"}),
    "POST /v1/completions": frozenset({"ingest", "client", "admin"}),
    "GET /v1/models": frozenset({"ingest", "client", "admin"}),
    "POST /v1/routes": frozenset({"trainer", "admin"}),
    "GET /v1/routes": READ,
    "GET /v1/routes/{name}": READ,
    "PATCH /v1/routes/{name}": frozenset({"release", "admin"}),
    "PUT /v1/routes/{name}/loop": frozenset({"trainer", "release", "admin"}),
    "GET /v1/routes/{name}/loop": READ,
    "GET /v1/loop/cycles/{cycle_id}": READ,
    "POST /v1/files": frozenset({"trainer", "admin"}),
    "GET /v1/files": READ,
    "GET /v1/files/{file_id}": READ,
    "DELETE /v1/files/{file_id}": frozenset({"trainer", "admin"}),
    "GET /v1/files/{file_id}/content": READ,
    "POST /v1/fine_tuning/jobs": frozenset({"trainer", "admin"}),
    "GET /v1/fine_tuning/jobs": READ,
    "GET /v1/fine_tuning/jobs/{fine_tuning_job_id}": READ,
    "POST /v1/fine_tuning/jobs/{fine_tuning_job_id}/cancel": frozenset({"trainer", "admin"}),
    "GET /v1/fine_tuning/jobs/{fine_tuning_job_id}/events": READ,
    "GET /v1/fine_tuning/jobs/{fine_tuning_job_id}/checkpoints": READ,
    "GET /v1/loop/control": READ,
    "PUT /v1/loop/control": frozenset({auth.OPERATOR}),
    # The operator API: operator keys only, never a tenant's (tests/integration/test_tenants_api.py).
    "POST /v1/tenants": frozenset({auth.OPERATOR}),
    "GET /v1/tenants": frozenset({auth.OPERATOR}),
    "GET /v1/tenants/{name}": frozenset({auth.OPERATOR}),
    "PATCH /v1/tenants/{name}": frozenset({auth.OPERATOR}),
    "DELETE /v1/tenants/{name}": frozenset({auth.OPERATOR}),
    "POST /v1/tenants/{name}/keys": frozenset({auth.OPERATOR}),
    "GET /v1/tenants/{name}/keys": frozenset({auth.OPERATOR}),
    "DELETE /v1/tenants/{name}/keys/{key_id}": frozenset({auth.OPERATOR}),
}
XSS = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
INJECTIONS = [
    "'; DROP TABLE obs.inference_log; --",
    "' OR '1'='1",
    '" OR ""="',
    "$$; DELETE FROM serve.route; $$",
    "$cft$ $$ \\",
    "C:\\path\\to\\N \\N \\\\N \\x41",  # COPY's NULL marker and escapes, as plain text
    "tab\there\nnewline\r\nend",
    "%(tenant_id)s %s {0} ${x}",
    "😀 ünïcode ‮rtl",
    XSS,
]


@dataclass
class Stack:
    """The app (with a real engine), two tenants and keys."""

    api: str
    db_url: str
    keys_a: dict[str, str]
    keys_b: dict[str, str]
    a: dict[str, Any] = field(default_factory=dict)
    b: dict[str, Any] = field(default_factory=dict)

    def h(self, key: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} | extra

    def owner(self) -> psycopg.Connection[dict[str, Any]]:
        return psycopg.connect(self.db_url, autocommit=True, row_factory=dict_row)


@pytest.fixture(scope="module")
def stack(
    pg_server: str, template_url: str, models_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    url = testdb.clone(pg_server)
    home = tmp_path_factory.mktemp("security-home")
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as c:
        ta, tb = make_tenant(c), make_tenant(c)
        # Tenant A's names carry a marker that must never reach tenant B.
        ra = make_route(c, tenant_id=ta["id"], name="a-secret-route", base_model=BASE)
        rb = make_route(c, tenant_id=tb["id"], name="b-route", base_model=BASE)
        aa = make_adapter(c, route=ra, id="a-secret-route-v1")
        ab = make_adapter(c, route=rb, id="b-route-v1")
        sa = make_snapshot(c, tenant_id=ta["id"], route=ra["name"], method="sft")
        sb = make_snapshot(c, tenant_id=tb["id"], route=rb["name"], method="sft")
        run_a = make_run(c, snapshot=sa)
        logs_a = [
            make_log(
                c,
                tenant_id=ta["id"],
                route=ra["name"],
                adapter_id=aa["id"],
                experiment="a-secret-exp",
                variant="A",
                completion=f"a-secret-answer-{i}",
            )
            for i in range(5)
        ]
        logs_b = [
            make_log(c, tenant_id=tb["id"], route=rb["name"], adapter_id=ab["id"]) for _ in range(3)
        ]
        c.execute(
            "INSERT INTO train.eval_suite (id, tenant_id, name, route) VALUES (%s, %s, %s, %s)",
            ("a-secret-suite", ta["id"], "a-secret-suite", ra["name"]),
        )
        keys_a = {role: auth.create_key(c, tenant_id=ta["id"], role=role) for role in auth.ROLES}
        keys_b = {role: auth.create_key(c, tenant_id=tb["id"], role=role) for role in auth.ROLES}
    settings = Settings(
        home=home,
        artefact_dir=home / "artefacts",
        serving_dir=home / "serving",
        max_body_bytes=MAX_BODY,
        user_hash_secret=SECRET,  # type: ignore[arg-type]
    )
    eng = Engine(BASE, models_dir, max_loras=1)
    try:
        with (
            serve_app(create_engine_app(eng), ready_path="/health") as engine_url,
            serve_app(create_app(settings, db_url=url, engine_urls=[engine_url])) as api,
        ):
            st = Stack(api, url, keys_a, keys_b)
            st.a = {
                "tenant": ta,
                "route": ra,
                "adapter": aa,
                "snapshot": sa,
                "run": run_a,
                "logs": logs_a,
            }
            st.b = {"tenant": tb, "route": rb, "adapter": ab, "snapshot": sb, "logs": logs_b}
            yield st
    finally:
        eng.close()
        testdb.drop(pg_server, url)


def _calls(dependant: Any) -> Iterator[Any]:
    for dep in dependant.dependencies:
        yield dep.call
        yield from _calls(dep)


def declared_roles(app: Any) -> dict[str, frozenset[str] | None]:
    """'METHOD path' -> the roles the endpoint admits (None: no key check), from the app."""
    out: dict[str, frozenset[str] | None] = {}
    for rc in routing.iter_route_contexts(app.routes):
        route = rc.original_route
        dependant = getattr(route, "dependant", None)
        for method in sorted(rc.methods or ()):
            if method == "HEAD":
                continue
            roles: frozenset[str] | None = None
            for call in _calls(dependant) if dependant is not None else ():
                if hasattr(call, "roles"):
                    roles = frozenset(call.roles)
                elif call is keys.client_key:
                    roles = frozenset(keys.CLIENT_ROLES)
            out[f"{method} {rc.path}"] = roles
    return out


FAKE_IDS = {
    "adapter_id": "no-such-adapter",
    "snapshot_id": str(uuid.UUID(int=1)),
    "run_id": str(uuid.UUID(int=2)),
    "request_id": str(uuid.UUID(int=3)),
    "name": "no-such-name",
    "cycle_id": "999999999",
    "key_id": "cft_nosuchkey",
    "file_id": "file-nosuchfile",
    "fine_tuning_job_id": "ftjob-nosuchjob",
}


def assert_openai_error(resp: httpx.Response, status: int, error_type: str, label: str) -> None:
    assert resp.status_code == status, f"{label}: {resp.status_code} {resp.text[:300]}"
    body = resp.json()
    assert set(body) == {"error"}, f"{label}: {resp.text[:300]}"
    assert body["error"]["type"] == error_type and body["error"]["message"], label
    assert isinstance(body["error"]["code"], str), label


def test_every_role_can_do_only_what_its_role_allows(stack: Stack, tmp_path: Path) -> None:
    app = create_app(Settings(home=tmp_path), db_url=stack.db_url, engine_urls=[])
    declared = declared_roles(app)
    unguarded = [
        ep
        for ep, roles in declared.items()
        if roles is None and ep.split()[1] not in PUBLIC and not ep.split()[1].startswith(DASHBOARD)
    ]
    assert unguarded == [], f"endpoints without a role check: {unguarded}"
    for ep, roles in EXPECTED.items():
        assert declared.get(ep) == roles, f"{ep}: declared {declared.get(ep)}, intended {roles}"
    swept = 0
    with httpx.Client(base_url=stack.api, timeout=30) as http:
        for ep, roles in sorted(declared.items()):
            if roles is None:
                continue
            method, path = ep.split()
            url = path.format(**{k: v for k, v in FAKE_IDS.items() if "{" + k + "}" in path})
            body = {} if method in ("POST", "PUT", "PATCH") else None
            # No key and a wrong key of the right shape: 401, whatever the role.
            assert_openai_error(
                http.request(method, url, json=body), 401, "authentication_error", ep
            )
            for role in auth.ROLES:
                resp = http.request(method, url, json=body, headers=stack.h(stack.keys_a[role]))
                label = f"{ep} as {role}"
                if role in roles:
                    assert resp.status_code not in (401, 403), f"{label}: {resp.text[:300]}"
                else:
                    assert_openai_error(resp, 403, "permission_error", label)
                    assert role in resp.json()["error"]["message"], label
                swept += 1
        # The dashboard takes its key once, at login, and only from reading roles (not admin).
        for role in auth.ROLES:
            with httpx.Client(base_url=stack.api, timeout=30) as browser:
                resp = dashboard.login(browser, stack.keys_a[role])
            assert resp.status_code == (303 if role in DASHBOARD_READ else 403), (role, resp.text)
            if role in DASHBOARD_READ:
                (cookie,) = [
                    c.lower()
                    for c in resp.headers.get_list("set-cookie")
                    if c.startswith("cft_dashboard_session=")
                ]
                assert "httponly" in cookie and "samesite=strict" in cookie
    assert swept >= len(EXPECTED) * len(auth.ROLES)


def test_a_wrong_key_with_a_valid_prefix_is_rejected(stack: Stack) -> None:
    key = stack.keys_a["reader"]
    last = key[-1]
    forged = [
        key[:-1] + ("A" if last != "A" else "B"),  # one character off, same length and prefix
        key[:12] + "x" * (len(key) - 12),
        key + "x",
        key[:-1],
        key.upper(),
        auth.KEY_PREFIX,
    ]
    with httpx.Client(base_url=stack.api, timeout=30) as http:
        assert http.get("/v1/routes", headers=stack.h(key)).status_code == 200
        for bad in forged:
            for path in ("/v1/routes", "/v1/models"):
                resp = http.get(path, headers=stack.h(bad))
                assert_openai_error(resp, 401, "authentication_error", f"{path} {bad[:14]}...")
        resp = http.post(
            "/v1/chat/completions",
            json={"model": "b-route", "messages": [{"role": "user", "content": "x"}]},
            headers=stack.h(forged[0]),
        )
        assert_openai_error(resp, 401, "authentication_error", "router")


def test_keys_are_stored_hashed_and_looked_up_by_hash(stack: Stack) -> None:
    with stack.owner() as c:
        rows = c.execute("SELECT prefix, key_hash FROM auth.api_key").fetchall()
        by_hash = {bytes(r["key_hash"]): r for r in rows}
        for key in [*stack.keys_a.values(), *stack.keys_b.values()]:
            digest = hashlib.sha256(key.encode()).digest()
            assert digest in by_hash and key.startswith(by_hash[digest]["prefix"])
            assert len(by_hash[digest]["prefix"]) <= 12  # a display prefix, not the key
            # The clear key is nowhere in the database.
            assert find_everywhere(c, key) == [], key[:12]
        # A key is found by its hash alone: a row written by hand from a token's sha256 lets
        # that token in (a tenant key at the API and at the router, an operator key at the
        # operator API), and the same token one character off does not. No clear key is ever
        # compared, so there is nothing to time.
        tenant_token = f"cft_{uuid.uuid4().hex}"
        operator_token = f"cft_{uuid.uuid4().hex}"
        add = "INSERT INTO auth.api_key (tenant_id, role, prefix, key_hash) VALUES (%s, %s, %s, %s)"
        for tenant_id, role, token in (
            (stack.a["tenant"]["id"], "admin", tenant_token),
            (None, auth.OPERATOR, operator_token),
        ):
            c.execute(add, (tenant_id, role, token[:12], hashlib.sha256(token.encode()).digest()))
        # Two keys never share a hash.
        with pytest.raises(pg_errors.UniqueViolation):
            digest = hashlib.sha256(tenant_token.encode()).digest()
            c.execute(add, (stack.a["tenant"]["id"], "reader", "cft_other", digest))
    off = tenant_token[:-1] + ("0" if tenant_token[-1] != "0" else "1")
    with httpx.Client(base_url=stack.api, timeout=60) as http:
        for path, label in (("/v1/routes", "api"), ("/v1/models", "router")):
            assert http.get(path, headers=stack.h(tenant_token)).status_code == 200, label
            resp = http.get(path, headers=stack.h(off))
            assert_openai_error(resp, 401, "authentication_error", label)
        assert http.get("/v1/tenants", headers=stack.h(operator_token)).status_code == 200


def text_columns(c: psycopg.Connection[Any]) -> list[tuple[str, str, str]]:
    """(table, column, type) of every text-like column of every user table (not views)."""
    return [
        (r["tbl"], r["col"], r["typ"])
        for r in c.execute(
            """
            SELECT format('%I.%I', n.nspname, t.relname) AS tbl, quote_ident(a.attname) AS col,
                   format_type(a.atttypid, NULL) AS typ
              FROM pg_attribute a
              JOIN pg_class t ON t.oid = a.attrelid
              JOIN pg_namespace n ON n.oid = t.relnamespace
             WHERE t.relkind IN ('r', 'm') AND a.attnum > 0 AND NOT a.attisdropped
               AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
               AND n.nspname NOT LIKE 'pg_temp%%'
               AND format_type(a.atttypid, NULL) IN ('text', 'character varying', 'jsonb',
                   'json', 'bytea', 'text[]', 'name', 'character')
            """
        ).fetchall()
    ]


def find_everywhere(c: psycopg.Connection[Any], needle: str) -> list[str]:
    """'table.column' of every row value that contains needle (as text, JSON or bytes)."""
    hits = []
    for tbl, col, typ in text_columns(c):
        if typ == "bytea":
            cond = f"position(%(b)s::bytea in {col}) > 0"
        else:
            cond = f"strpos({col}::text, %(t)s) > 0"
        n = c.execute(
            f"SELECT count(*) AS n FROM {tbl} WHERE {cond}",
            {"b": needle.encode(), "t": needle},
        ).fetchone()
        if n and n["n"]:
            hits.append(f"{tbl}.{col}")
    return hits


def test_user_ids_are_never_stored_in_clear(stack: Stack) -> None:
    user = f"alice.{uuid.uuid4().hex}@example.com"
    forgotten = f"bob.{uuid.uuid4().hex}"
    ka = stack.keys_a
    with httpx.Client(base_url=stack.api, timeout=60) as http:
        rid = str(uuid.uuid4())
        records = [
            {
                "request_id": rid,
                "route": "a-secret-route",
                "messages": [{"role": "user", "content": "hello"}],
                "completion": "hi",
                "user": user,
            },
            {
                "request_id": str(uuid.uuid4()),
                "route": "a-secret-route",
                "messages": [{"role": "user", "content": "hello"}],
                "user": forgotten,
            },
        ]
        resp = http.post("/v1/logs", json={"records": records}, headers=stack.h(ka["ingest"]))
        assert resp.status_code == 200, resp.text
        fb = http.post(
            f"/v1/logs/{rid}/feedback", json={"thumbs": 1}, headers=stack.h(ka["ingest"])
        )
        assert fb.status_code == 200, fb.text
        routed = []
        for how in ("body", "header"):
            body: dict[str, Any] = {
                "model": "a-secret-route",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 2,
            }
            extra = {"X-Cft-User": user} if how == "header" else {}
            if how == "body":
                body["user"] = user
            resp = http.post(
                "/v1/chat/completions", json=body, headers=stack.h(ka["client"], **extra)
            )
            assert resp.status_code == 200, resp.text
            routed.append(resp.headers["x-request-id"])
        # A cross-tenant route is unknown to the router (404, nothing proxied).
        other = http.post(
            "/v1/chat/completions",
            json={"model": "a-secret-route", "messages": [{"role": "user", "content": "Hi"}]},
            headers=stack.h(stack.keys_b["client"]),
        )
        assert_openai_error(other, 404, "not_found_error", "cross-tenant route")
        models = http.get("/v1/models", headers=stack.h(stack.keys_b["client"])).json()
        assert [m["id"] for m in models["data"]] == ["b-route"]
        # Feedback on a routed call waits for its log row: then every row is written.
        for r in routed:
            resp = http.post(
                f"/v1/logs/{r}/feedback", json={"thumbs": -1}, headers=stack.h(ka["client"])
            )
            assert resp.status_code == 200, resp.text
        forget = http.post(
            "/v1/users/forget", json={"user": forgotten}, headers=stack.h(ka["admin"])
        )
        assert forget.status_code == 200, forget.text
    pseudonym = hmac.digest(SECRET.encode(), user.encode(), "sha256")
    with stack.owner() as c:
        stored = c.execute(
            "SELECT user_hash FROM obs.inference_log WHERE request_id = ANY(%s::uuid[])",
            ([rid, *routed],),
        ).fetchall()
        assert [bytes(r["user_hash"]) for r in stored] == [pseudonym] * 3
        for needle in (user, forgotten, user.split("@")[0]):
            assert find_everywhere(c, needle) == [], needle
        assert len(text_columns(c)) > 40  # the scan looked at every table


def test_other_tenants_rows_never_come_back_through_lists_cursors_or_exports(
    stack: Stack,
) -> None:
    kb = stack.keys_b["admin"]
    a_values = {
        "route": "a-secret-route",
        "adapter_id": "a-secret-route-v1",
        "experiment": "a-secret-exp",
        "name": "a-secret-exp",
        "suite_id": "a-secret-suite",
        "status": "candidate",
    }
    log_ids = {str(r["request_id"]) for r in stack.a["logs"]}
    a_ids = log_ids | {str(stack.a["snapshot"]["id"])}
    marker = "a-secret"

    def clean(resp: httpx.Response, label: str, sent: bool = False) -> None:
        assert resp.status_code < 500, f"{label}: {resp.status_code}"
        # An error may echo the name B sent (sent=True), never anything of A's rows.
        assert ("a-secret-answer" if sent else marker) not in resp.text, (
            f"{label} leaks tenant A: {resp.text[:300]}"
        )
        ids = log_ids if sent else a_ids
        assert not any(i in resp.text for i in ids), f"{label} leaks A's ids"

    with httpx.Client(base_url=stack.api, timeout=30, headers=stack.h(kb)) as http:
        schema = http.get("/openapi.json").json()
        lists = 0
        for path, ops in schema["paths"].items():
            get = ops.get("get")
            if get is None or "{" in path:
                continue  # ids are swept by test_tenant_isolation_sweep.py
            params = [p["name"] for p in get.get("parameters", []) if p["in"] == "query"]
            clean(http.get(path), f"GET {path}")
            # Every query filter set to tenant A's values.
            for p in params:
                for value in {a_values.get(p, "a-secret-route"), *a_values.values()}:
                    clean(http.get(path, params={p: value}), f"GET {path}?{p}={value}")
            lists += 1
        assert lists >= 8
        # B's own rows do come back (the lists are not vacuously clean).
        own = http.get("/v1/routes").json()
        assert [r["name"] for r in own] == ["b-route"]
        # Pagination: B walks its logs one per page and sees exactly its own rows.
        seen: list[str] = []
        cursor = None
        while True:
            page = http.get(
                "/v1/logs", params={"limit": 1} | ({"cursor": cursor} if cursor else {})
            )
            clean(page, "GET /v1/logs page")
            body = page.json()
            seen += [r["request_id"] for r in body["data"]]
            assert all(r["tenant_id"] == stack.b["tenant"]["id"] for r in body["data"])
            cursor = body["next_cursor"]
            if not cursor:
                break
        assert set(seen) >= {str(r["request_id"]) for r in stack.b["logs"]}
        # A cursor is a position, not a permission: forged ones (before everything, or at one
        # of A's rows) and A's own cursor still give B only B's rows.
        a_first = stack.a["logs"][0]
        forged = [
            orjson.dumps(["1970-01-01T00:00:00+00:00", 0]),
            orjson.dumps([a_first["created_at"].isoformat(), a_first["id"] - 1]),
        ]
        cursors = [base64.urlsafe_b64encode(raw).decode().rstrip("=") for raw in forged]
        a_page = httpx.get(
            stack.api + "/v1/logs",
            params={"limit": 1},
            headers=stack.h(stack.keys_a["reader"]),
        ).json()
        assert a_page["next_cursor"] and a_page["data"][0]["tenant_id"] == stack.a["tenant"]["id"]
        cursors.append(a_page["next_cursor"])
        for cur in cursors:
            page = http.get("/v1/logs", params={"cursor": cur, "limit": 1000})
            clean(page, f"GET /v1/logs?cursor={cur}")
            assert page.status_code == 200
            assert all(r["tenant_id"] == stack.b["tenant"]["id"] for r in page.json()["data"])
        # Exports and writes that name A's things: 404 or refused, never A's rows.
        sa = stack.a["snapshot"]["id"]
        assert http.get(f"/v1/datasets/snapshots/{sa}/export").status_code == 404
        own_export = http.get(f"/v1/datasets/snapshots/{stack.b['snapshot']['id']}/export")
        assert own_export.status_code == 200
        clean(own_export, "B's export")
        for path, body in [
            ("/v1/datasets/snapshots", {"route": "a-secret-route", "method": "sft"}),
            (
                "/v1/training-runs",
                {"route": "a-secret-route", "method": "sft", "snapshot_id": str(sa)},
            ),
            (
                "/v1/eval-suites",
                {
                    "id": "b-suite",
                    "route": "a-secret-route",
                    "cases": [
                        {
                            "messages": [{"role": "user", "content": "q"}],
                            "check": "exact",
                            "expected": "a",
                        }
                    ],
                },
            ),
        ]:
            resp = http.post(path, json=body)
            assert 400 <= resp.status_code < 500, (
                f"POST {path}: {resp.status_code} {resp.text[:200]}"
            )
            clean(resp, f"POST {path}", sent=True)
        resp = http.put(
            "/v1/promotion-policy",
            json={
                "route": "a-secret-route",
                "rules": [{"suite_id": "s", "metric": "m", "direction": "higher"}],
            },
        )
        assert 400 <= resp.status_code < 500, resp.text
        # The dashboard, logged in as B (a reader key: admin keys are refused), shows nothing
        # of A either.
        assert dashboard.login(http, stack.keys_b["reader"]).status_code == 303
        for page_path in ("/dashboard", "/dashboard/experiments/a-secret-exp"):
            resp = http.get(page_path)
            clean(resp, page_path, sent=True)
    with stack.owner() as c:
        n = c.execute(
            "SELECT count(*) AS n FROM train.dataset_snapshot WHERE tenant_id = %s",
            (stack.b["tenant"]["id"],),
        ).fetchone()
        assert n is not None and n["n"] == 1
        assert (
            c.execute(
                "SELECT count(*) AS n FROM train.promotion_policy WHERE route = 'a-secret-route'"
            ).fetchone()
            or {}
        )["n"] == 0


def test_sql_injection_strings_are_stored_as_data(stack: Stack) -> None:
    ka = stack.keys_a
    with stack.owner() as c:
        before = {
            t: c.execute(f"SELECT count(*) AS n FROM {t}").fetchone()["n"]  # type: ignore[index]
            for t in ("serve.route", "serve.adapter", "tenant", "auth.api_key")
        }
    with httpx.Client(base_url=stack.api, timeout=30) as http:
        for i, s in enumerate(INJECTIONS):
            rid = str(uuid.uuid4())
            record = {
                "request_id": rid,
                "route": s,
                "adapter_id": s,
                "model": s,
                "experiment": s,
                "variant": s[:1],
                "messages": [
                    {"role": "user", "content": s},
                    {"role": "assistant", "content": [{"type": "text", "text": s}]},
                ],
                "completion": s,
                "user": s,
            }
            resp = http.post("/v1/logs", json=record, headers=stack.h(ka["ingest"]))
            assert resp.status_code == 200, f"{s!r}: {resp.text}"
            fb = http.post(
                f"/v1/logs/{rid}/feedback",
                json={"edited_completion": s},
                headers=stack.h(ka["ingest"]),
            )
            assert fb.status_code == 200, fb.text
            got = http.get(f"/v1/logs/{rid}", headers=stack.h(ka["reader"])).json()
            for name in (
                "route",
                "adapter_id",
                "model",
                "experiment",
                "completion",
                "edited_completion",
            ):
                assert got[name] == s, (name, got[name], s)
            assert got["variant"] == s[:1]
            assert got["messages"] == record["messages"]
            assert got["user_hash"] == hmac.digest(SECRET.encode(), s.encode(), "sha256").hex()
            # A filter with the string matches exactly that row.
            page = http.get(
                "/v1/logs", params={"route": s, "adapter_id": s}, headers=stack.h(ka["reader"])
            ).json()
            assert [r["request_id"] for r in page["data"]] == [rid], s
            # Other write endpoints: free-text fields of routes, suites, eval results, policies.
            # (A base model is one the platform serves: anything else is refused, as data.)
            refused = http.post(
                "/v1/routes",
                json={"name": f"inj-{i}", "base_model": s},
                headers=stack.h(ka["trainer"]),
            )
            assert refused.status_code == 422, refused.text
            route = http.post(
                "/v1/routes",
                json={"name": f"inj-{i}", "experiment": s[:128]},
                headers=stack.h(ka["trainer"]),
            )
            assert route.status_code == 201, route.text
            back = http.get(f"/v1/routes/inj-{i}", headers=stack.h(ka["reader"])).json()
            assert back["experiment"] == s[:128]
            suite = http.post(
                "/v1/eval-suites",
                json={
                    "id": f"inj-{i}",
                    "name": s,
                    "rubric": s,
                    "cases": [
                        {
                            "messages": [{"role": "user", "content": s}],
                            "check": "contains",
                            "expected": s,
                        }
                    ],
                },
                headers=stack.h(ka["trainer"]),
            )
            assert suite.status_code in (200, 201), suite.text
            suites = http.get("/v1/eval-suites", headers=stack.h(ka["reader"])).json()["data"]
            mine = next(x for x in suites if x["id"] == f"inj-{i}")
            assert mine["name"] == s and mine["rubric"] == s
            assert mine["cases"][0]["expected"] == s
            assert mine["cases"][0]["messages"][0]["content"] == s
            res = http.post(
                "/v1/adapters/a-secret-route-v1/eval-results",
                json={"results": [{"suite_id": s, "metric": s, "score": 0.5, "judge_model": s}]},
                headers=stack.h(ka["trainer"]),
            )
            assert res.status_code in (200, 201), res.text
            detail = http.get("/v1/adapters/a-secret-route-v1", headers=stack.h(ka["reader"]))
            assert any(
                r["suite_id"] == s and r["metric"] == s and r["judge_model"] == s
                for r in detail.json()["eval_results"]
            ), detail.text[:500]
        # The dashboard shows these strings (experiments, adapters of traffic) escaped.
        assert dashboard.login(http, ka["reader"]).status_code == 303
        html = http.get("/dashboard").text  # lists the experiments seen in traffic
        assert "<script>alert" not in html and "<img src=x" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert f"/dashboard/experiments/{quote(XSS, safe='')}" in html  # the link, encoded
        http.cookies.clear()
        # NUL cannot be stored in PostgreSQL text: a clear 4xx naming the problem, never a 5xx.
        nul = "a\x00b"
        cases: list[tuple[str, str, dict[str, Any], str]] = [
            (
                "POST",
                "/v1/logs",
                {
                    "request_id": str(uuid.uuid4()),
                    "route": nul,
                    "messages": [{"role": "user", "content": "x"}],
                },
                "ingest",
            ),
            (
                "POST",
                "/v1/logs",
                {
                    "request_id": str(uuid.uuid4()),
                    "route": "r",
                    "messages": [{"role": "user", "content": nul}],
                },
                "ingest",
            ),
            (
                "POST",
                "/v1/logs",
                {
                    "request_id": str(uuid.uuid4()),
                    "route": "r",
                    "completion": nul,
                    "messages": [{"role": "user", "content": "x"}],
                },
                "ingest",
            ),
            (
                "POST",
                f"/v1/logs/{stack.a['logs'][0]['request_id']}/feedback",
                {"edited_completion": nul},
                "ingest",
            ),
            ("POST", "/v1/routes", {"name": "nul-route", "experiment": nul}, "trainer"),
            (
                "POST",
                "/v1/eval-suites",
                {
                    "id": "nul",
                    "name": nul,
                    "cases": [
                        {
                            "messages": [{"role": "user", "content": "q"}],
                            "check": "exact",
                            "expected": "a",
                        }
                    ],
                },
                "trainer",
            ),
            (
                "POST",
                "/v1/adapters/a-secret-route-v1/eval-results",
                {"results": [{"suite_id": nul, "metric": "m", "score": 1}]},
                "trainer",
            ),
            ("POST", "/v1/users/forget", {"user": nul}, "admin"),
        ]
        for method, path, body, role in cases:
            resp = http.request(method, path, json=body, headers=stack.h(ka[role]))
            assert 400 <= resp.status_code < 500, f"{path}: {resp.status_code} {resp.text[:300]}"
            err = resp.json()["error"]
            assert "NUL" in err["message"] or "nul" in err["message"].lower(), err
    with stack.owner() as c:
        # Tables intact: nothing dropped, nothing deleted, every table still there.
        for t, n in before.items():
            now = c.execute(f"SELECT count(*) AS n FROM {t}").fetchone()
            assert now is not None and now["n"] >= n, t
        assert c.execute("SELECT to_regclass('obs.inference_log') AS t").fetchone()["t"]  # type: ignore[index]
        n = c.execute(
            "SELECT count(*) AS n FROM obs.inference_log WHERE route = ANY(%s)", (INJECTIONS,)
        ).fetchone()
        assert n is not None and n["n"] == len(INJECTIONS)


def test_bodies_and_headers_are_bounded_and_cors_is_closed(stack: Stack) -> None:
    ka = stack.keys_a
    big = {
        "request_id": str(uuid.uuid4()),
        "route": "r",
        "completion": "x" * (MAX_BODY + 1),
        "messages": [{"role": "user", "content": "x"}],
    }
    with httpx.Client(base_url=stack.api, timeout=30) as http:
        for path, role in [
            ("/v1/logs", "ingest"),
            ("/v1/chat/completions", "client"),
            ("/v1/routes", "trainer"),
            ("/v1/users/forget", "admin"),
        ]:
            resp = http.post(path, json=big, headers=stack.h(ka[role]))
            assert_openai_error(resp, 413, "invalid_request_error", path)
            # Chunked, with no Content-Length: counted as it streams.
            chunks = iter([b"{" + b" " * (MAX_BODY // 2), b" " * (MAX_BODY // 2), b" " * 64, b"}"])
            resp = http.post(
                path,
                content=chunks,
                headers=stack.h(ka[role], **{"Content-Type": "application/json"}),
            )
            assert_openai_error(resp, 413, "invalid_request_error", f"{path} chunked")
        # Headers: over the limit is 431 (OpenAI shape), on any method; under it works.
        for method, path in [("GET", "/v1/routes"), ("POST", "/v1/logs"), ("GET", "/healthz")]:
            resp = http.request(
                method,
                path,
                headers=stack.h(ka["admin"], **{"X-Big": "a" * (MAX_HEADER_BYTES + 1)}),
            )
            assert_openai_error(resp, 431, "invalid_request_error", f"{method} {path}")
        ok = http.get("/v1/routes", headers=stack.h(ka["reader"], **{"X-Fine": "a" * 4000}))
        assert ok.status_code == 200
        # CORS: no origin is allowed, preflight or not.
        for path in ("/v1/logs", "/v1/chat/completions", "/v1/routes", "/dashboard/login"):
            pre = http.options(
                path,
                headers={
                    "Origin": "https://evil.example",
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "authorization, content-type",
                },
            )
            assert pre.status_code >= 400 or not pre.headers.get("access-control-allow-origin")
            assert "access-control-allow-origin" not in pre.headers, (path, pre.headers)
            assert "access-control-allow-credentials" not in pre.headers
        resp = http.get("/v1/routes", headers=stack.h(ka["reader"], Origin="https://evil.example"))
        assert resp.status_code == 200 and "access-control-allow-origin" not in resp.headers


WRITES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")


def _tables(c: psycopg.Connection[Any]) -> list[str]:
    return [
        r["t"]
        for r in c.execute(
            "SELECT format('%I.%I', n.nspname, c.relname) AS t FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p', 'm', 'v') AND n.nspname NOT IN"
            " ('pg_catalog', 'information_schema', 'pg_toast') ORDER BY 1"
        ).fetchall()
    ]


def test_dashboard_role_cannot_write_and_app_role_cannot_bypass_rls(stack: Stack) -> None:
    with stack.owner() as c:
        tables = _tables(c)
        assert len(tables) > 25
        tried = 0
        for t in tables:
            for stmt in (
                f"INSERT INTO {t} DEFAULT VALUES",
                f"UPDATE {t} SET {_first_column(c, t)} = {_first_column(c, t)}",
                f"DELETE FROM {t}",
                f"TRUNCATE {t}",
            ):
                with (
                    pytest.raises(
                        (
                            pg_errors.InsufficientPrivilege,
                            pg_errors.WrongObjectType,
                            pg_errors.FeatureNotSupported,
                            pg_errors.ObjectNotInPrerequisiteState,
                        )
                    ) as exc,
                    c.transaction(),
                ):
                    c.execute("SET LOCAL ROLE cft_dashboard")
                    c.execute(stmt)
                if not isinstance(exc.value, pg_errors.InsufficientPrivilege):
                    # A view or materialised view that cannot be written anyway: still no right.
                    kind = stmt.split()[0]
                    assert not c.execute(
                        "SELECT has_table_privilege('cft_dashboard', %s, %s) AS p", (t, kind)
                    ).fetchone()["p"], (t, kind)  # type: ignore[index]
                tried += 1
            for kind in WRITES:
                assert not c.execute(
                    "SELECT has_table_privilege('cft_dashboard', %s, %s) AS p", (t, kind)
                ).fetchone()["p"], (t, kind)  # type: ignore[index]
        assert tried == 4 * len(tables)
        # Nor through a function with owner rights: the only SECURITY DEFINER functions it may
        # run are trigger functions (which cannot be called directly).
        definer = c.execute(
            "SELECT p.oid::regprocedure::text AS f FROM pg_proc p"
            " JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE p.prosecdef AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " AND has_function_privilege('cft_dashboard', p.oid, 'EXECUTE')"
            " AND p.prorettype <> 'trigger'::regtype"
        ).fetchall()
        assert definer == [], definer
        with pytest.raises(pg_errors.InsufficientPrivilege), c.transaction():
            c.execute("SET LOCAL ROLE cft_dashboard")
            c.execute("SELECT serve.check_canary_budget(1, 'a-secret-route', 'x', 0)")

        # cft_app: every table it can touch enforces row-level security, and it cannot turn it off.
        open_tables = c.execute(
            "SELECT format('%I.%I', n.nspname, c.relname) AS t FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p') AND NOT c.relrowsecurity"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " AND n.nspname NOT LIKE 'pg_temp%%'"  # sessions' own staging tables
            " AND (has_table_privilege('cft_app', c.oid, 'SELECT')"
            "   OR has_table_privilege('cft_app', c.oid, 'INSERT')"
            "   OR has_table_privilege('cft_app', c.oid, 'UPDATE')"
            "   OR has_table_privilege('cft_app', c.oid, 'DELETE'))"
        ).fetchall()
        assert open_tables == [], open_tables
        roles = c.execute(
            "SELECT rolname, rolsuper, rolbypassrls, rolcanlogin FROM pg_roles"
            " WHERE rolname IN ('cft_app', 'cft_dashboard', 'cft_release')"
        ).fetchall()
        assert len(roles) == 3 and not any(r["rolsuper"] or r["rolbypassrls"] for r in roles)
        ta, tb = stack.a["tenant"]["id"], stack.b["tenant"]["id"]
        rls_tables = [
            r["t"]
            for r in c.execute(
                "SELECT format('%I.%I', n.nspname, c.relname) AS t FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a"
                " ON a.attrelid = c.oid AND a.attname = 'tenant_id'"
                " WHERE c.relkind IN ('r', 'p') AND c.relrowsecurity AND NOT c.relispartition"
                " AND has_table_privilege('cft_app', c.oid, 'SELECT')"
            ).fetchall()
        ]
        assert "obs.inference_log" in rls_tables and len(rls_tables) >= 8
        for t in rls_tables:
            with c.transaction():
                c.execute("SET LOCAL ROLE cft_app")
                c.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(ta),))
                others = c.execute(
                    f"SELECT count(*) AS n FROM {t} WHERE tenant_id <> %s", (ta,)
                ).fetchone()
                assert others is not None and others["n"] == 0, t
            with c.transaction():
                c.execute("SET LOCAL ROLE cft_app")  # no tenant set: no tenant's row at all
                # (a row of no tenant is shared by all: the global promotion rules)
                n = c.execute(
                    f"SELECT count(*) AS n FROM {t} WHERE tenant_id IS NOT NULL"
                ).fetchone()
                assert n is not None and n["n"] == 0, t
        attempts = [
            "SET LOCAL row_security = off",  # then any read under a policy fails, not leaks
            "ALTER TABLE obs.inference_log DISABLE ROW LEVEL SECURITY",
            "ALTER TABLE obs.inference_log NO FORCE ROW LEVEL SECURITY",
            "DROP POLICY tenant_isolation ON obs.inference_log",
            "SELECT count(*) FROM train.sft_candidate",  # no RLS there: no access either
            "INSERT INTO auth.api_key (tenant_id, role, prefix, key_hash) VALUES (1, 'admin', 'x', 'x')",
        ]
        for stmt in attempts:
            with pytest.raises(psycopg.Error), c.transaction():
                c.execute("SET LOCAL ROLE cft_app")
                c.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(tb),))
                c.execute(stmt)
                c.execute("SELECT count(*) FROM obs.inference_log")
        # Writing a row for another tenant is refused by the policy's WITH CHECK.
        with pytest.raises(pg_errors.InsufficientPrivilege), c.transaction():
            c.execute("SET LOCAL ROLE cft_app")
            c.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(tb),))
            c.execute(
                "INSERT INTO obs.inference_log (request_id, tenant_id, route, adapter_id,"
                " messages) VALUES (gen_random_uuid(), %s, 'x', 'base', '[]')",
                (ta,),
            )
        with pytest.raises(pg_errors.InsufficientPrivilege), c.transaction():
            c.execute("SET LOCAL ROLE cft_app")
            c.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(tb),))
            c.execute("UPDATE serve.route SET tenant_id = %s WHERE tenant_id = %s", (ta, tb))


def _first_column(c: psycopg.Connection[Any], table: str) -> str:
    row = c.execute(
        "SELECT quote_ident(attname) AS a FROM pg_attribute WHERE attrelid = %s::regclass"
        " AND attnum > 0 AND NOT attisdropped AND attidentity = '' AND attgenerated = ''"
        " ORDER BY attnum LIMIT 1",
        (table,),
    ).fetchone()
    assert row is not None
    return str(row["a"])


def test_error_bodies_do_not_echo_keys(stack: Stack) -> None:
    """A rejected key is never echoed back (it might be a real key of another service)."""
    bad = auth.KEY_PREFIX + "Z" * 43
    with httpx.Client(base_url=stack.api, timeout=30) as http:
        for path in ("/v1/routes", "/v1/models"):
            resp = http.get(path, headers=stack.h(bad))
            assert resp.status_code == 401 and bad not in resp.text
            assert json.loads(resp.text)["error"]["code"] == "invalid_api_key"
