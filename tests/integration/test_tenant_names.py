"""Names are unique per tenant: two tenants each create a route `support` and an eval suite
`smoke`, and each works on its own, over REST, through the router and in the loop, with the
other's never in the way; a name taken only by another tenant is free (no 409, nothing of the
other told); a second one of the same tenant is a 409."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from app.core import auth
from app.core.artefacts import LocalStore
from app.core.config import Settings, get_settings
from cft import cli
from cft.serve import create_app
from tests.support.engines import FakeVLLM, write_adapter
from tests.support.factories import make_adapter, make_log, make_route, make_tenant
from tests.support.loop import refresh, set_policy, trigger
from tests.support.servers import serve_app

ROUTE = "support"
SUITE = "smoke"
BASE = "smollm2-135m-instruct"


def h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


@pytest.fixture
def tenants(conn: Any) -> dict[str, dict[str, Any]]:
    """alpha and beta, each with an admin key (every role of its tenant)."""
    out = {}
    for name in ("alpha", "beta"):
        t = make_tenant(conn, name=f"{name}-{uuid.uuid4().hex[:6]}")
        out[name] = t | {"key": auth.create_key(conn, tenant_id=t["id"], role="admin")}
    return out


def _post(api: str, path: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{api}{path}", json=body, headers=h(key), timeout=30)


def _get(api: str, path: str, key: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{api}{path}", params=params, headers=h(key), timeout=30)


def _suite(expected: str) -> dict[str, Any]:
    return {
        "id": SUITE,
        "route": ROUTE,
        "cases": [
            {"messages": [{"role": "user", "content": "Who?"}], "check": "contains",
             "expected": expected}
        ],
    }  # fmt: skip


def _scores(conn: Any, **scores: float) -> None:
    """pass_rate on the suite, written as the owner (an author the gate trusts)."""
    for adapter_id, score in scores.items():
        conn.execute(
            "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
            " VALUES (%s, %s, 'pass_rate', %s)",
            (adapter_id, SUITE, score),
        )


def test_two_tenants_use_the_same_names_each_on_its_own(
    db_url: str, conn: Any, tmp_path: Path, tenants: dict[str, dict[str, Any]]
) -> None:
    a, b = tenants["alpha"], tenants["beta"]
    with serve_app(create_app(Settings(home=tmp_path), db_url=db_url, engine_urls=[])) as api:
        # Routes: a name another tenant has is free, and nothing of the other is told.
        ra = _post(api, "/v1/routes", a["key"], {"name": ROUTE})
        assert ra.status_code == 201, ra.text
        rb = _post(api, "/v1/routes", b["key"], {"name": ROUTE, "experiment": "beta-exp"})
        assert rb.status_code == 201, rb.text
        assert (ra.json()["tenant_id"], rb.json()["tenant_id"]) == (a["id"], b["id"])
        # beta's answer is beta's route, nothing of alpha's.
        assert set(rb.json()) == {
            "name",
            "tenant_id",
            "base_model",
            "experiment",
            "fallback",
            "created_at",
        }
        assert a["name"] not in rb.text and rb.json()["created_at"] != ra.json()["created_at"]
        dup = _post(api, "/v1/routes", a["key"], {"name": ROUTE})
        assert dup.status_code == 409 and dup.json()["error"]["code"] == "route_exists", dup.text
        assert f"a route named {ROUTE!r} already exists" in dup.json()["error"]["message"]
        for t, experiment in ((a, None), (b, "beta-exp")):
            mine = _get(api, f"/v1/routes/{ROUTE}", t["key"]).json()
            assert (mine["tenant_id"], mine["experiment"]) == (t["id"], experiment)
            assert [r["tenant_id"] for r in _get(api, "/v1/routes", t["key"]).json()] == [t["id"]]

        # Eval suites: the same id for both, each with its own cases.
        for t in (a, b):
            got = _post(api, "/v1/eval-suites", t["key"], _suite(f"{t['name']}-answer"))
            assert got.status_code == 201, got.text
            assert got.json()["cases"][0]["expected"] == f"{t['name']}-answer"
        dup = _post(api, "/v1/eval-suites", b["key"], _suite("again"))
        assert dup.status_code == 409 and dup.json()["error"]["code"] == "suite_exists", dup.text
        for t in (a, b):
            [suite] = _get(api, "/v1/eval-suites", t["key"], route=ROUTE).json()["data"]
            assert suite["id"] == SUITE
            assert [c["expected"] for c in suite["cases"]] == [f"{t['name']}-answer"]

        # The loop policy of each tenant's route is its own.
        for t, n, enabled in ((a, 7, True), (b, 9, False)):
            put = httpx.put(
                f"{api}/v1/routes/{ROUTE}/loop",
                json={"enabled": enabled, "min_new_examples": n},
                headers=h(t["key"]),
                timeout=30,
            )
            assert put.status_code == 200, put.text
        for t, n, enabled in ((a, 7, True), (b, 9, False)):
            p = _get(api, f"/v1/routes/{ROUTE}/loop", t["key"]).json()["policy"]
            assert (p["tenant_id"], p["min_new_examples"], p["enabled"]) == (t["id"], n, enabled)

        # The gate's rules of each tenant's route are its own.
        for t, direction in ((a, "higher"), (b, "lower")):
            rule = {"suite_id": SUITE, "metric": "pass_rate", "direction": direction}
            put = httpx.put(
                f"{api}/v1/promotion-policy",
                json={"route": ROUTE, "rules": [rule]},
                headers=h(t["key"]),
                timeout=30,
            )
            assert put.status_code == 200, put.text
            assert [(r["route"], r["direction"]) for r in put.json()["data"]] == [
                (ROUTE, direction)
            ]
        for t, direction in ((a, "higher"), (b, "lower")):
            rules = _get(api, "/v1/promotion-policy", t["key"], route=ROUTE).json()["data"]
            assert [r["direction"] for r in rules if r["route"]] == [direction]

        # Snapshots and training runs of the route are the caller's.
        runs = {}
        for t in (a, b):
            snap = _post(api, "/v1/datasets/snapshots", t["key"], {"route": ROUTE, "method": "sft"})
            assert snap.status_code == 201, snap.text
            assert (snap.json()["tenant_id"], snap.json()["route"]) == (t["id"], ROUTE)
            run = _post(
                api,
                "/v1/training-runs",
                t["key"],
                {"route": ROUTE, "method": "sft", "snapshot_id": snap.json()["id"]},
            )
            assert run.status_code == 201, run.text
            runs[t["id"]] = run.json()["id"]
        for t in (a, b):
            listed = _get(api, "/v1/training-runs", t["key"], route=ROUTE).json()["data"]
            assert [r["id"] for r in listed] == [runs[t["id"]]]

        # Adapters: each route has a prod; alpha's candidate is promoted and rolled back
        # without touching beta's prod (one prod per tenant's route).
        routes = {
            t["id"]: {"name": ROUTE, "tenant_id": t["id"], "base_model": BASE} for t in (a, b)
        }
        prod_a = make_adapter(conn, route=routes[a["id"]], status="prod", traffic_pct=100)["id"]
        prod_b = make_adapter(conn, route=routes[b["id"]], status="prod", traffic_pct=100)["id"]
        cand_a = make_adapter(conn, route=routes[a["id"]])["id"]
        _scores(conn, **{prod_a: 0.5, cand_a: 0.8, prod_b: 0.9})
        check = _get(api, f"/v1/adapters/{cand_a}/promotion-check", a["key"]).json()
        assert (check["current"], check["allowed"]) == (prod_a, True), check
        canary = _post(api, f"/v1/adapters/{cand_a}/canary", a["key"], {"traffic_pct": 10})
        assert canary.status_code == 200, canary.text
        promoted = _post(api, f"/v1/adapters/{cand_a}/promote", a["key"], {"reason": "better"})
        assert promoted.status_code == 200, promoted.text
        assert promoted.json()["previous_prod_id"] == prod_a

        def status(t: dict[str, Any], adapter_id: str) -> str:
            return str(_get(api, f"/v1/adapters/{adapter_id}", t["key"]).json()["status"])

        assert (status(a, cand_a), status(a, prod_a), status(b, prod_b)) == (
            "prod",
            "retired",
            "prod",
        )
        back = _post(api, f"/v1/adapters/{cand_a}/rollback", a["key"], {"reason": "worse"})
        assert back.status_code == 200 and back.json()["id"] == prod_a, back.text
        assert (status(a, prod_a), status(b, prod_b)) == ("prod", "prod")
        for t, mine in ((a, {prod_a, cand_a}), (b, {prod_b})):
            listed = _get(api, "/v1/adapters", t["key"], route=ROUTE).json()["data"]
            assert {x["id"] for x in listed} == mine
            # The other tenant's adapters stay out of sight by id too.
            other = prod_b if t is a else prod_a
            assert _get(api, f"/v1/adapters/{other}", t["key"]).status_code == 404


class Stack:
    """A fake vLLM engine and an artefact store; routes and adapters per tenant."""

    def __init__(self, db_url: str, tmp_path: Path) -> None:
        self.db_url = db_url
        self.tmp = tmp_path
        self.store = LocalStore(tmp_path / "store")
        self.settings = get_settings().model_copy(
            update={"serving_dir": tmp_path / "serving", "reconcile_interval": 0.2}
        )

    def prod(self, tenant_id: int) -> str:
        """A stored, verified prod adapter of the tenant's route."""
        version = f"{ROUTE}-t{tenant_id}-{uuid.uuid4().hex[:8]}"
        src = write_adapter(self.tmp / "src" / version)
        stored = self.store.put_dir(src, ROUTE, version)
        with psycopg.connect(self.db_url, autocommit=True, row_factory=dict_row) as c:
            row = make_adapter(
                c,
                route={"name": ROUTE, "tenant_id": tenant_id, "base_model": BASE},
                id=version,
                status="prod",
                traffic_pct=100,
                weights_uri=stored.uri,
                sha256=stored.sha256,
            )
        return str(row["id"])

    def loaded(self, adapter_id: str) -> bool:
        with psycopg.connect(self.db_url, autocommit=True, row_factory=dict_row) as c:
            row = c.execute(
                "SELECT state FROM serve.adapter_deployment WHERE adapter_id = %s", (adapter_id,)
            ).fetchone()
        return bool(row and row["state"] == "loaded")


@pytest.fixture
def stack(db_url: str, tmp_path: Path) -> Stack:
    return Stack(db_url, tmp_path)


def _chat(api: str, key: str) -> httpx.Response:
    return httpx.post(
        f"{api}/v1/chat/completions",
        json={"model": ROUTE, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        headers=h(key),
        timeout=30,
    )


def test_the_router_serves_each_tenant_its_own_route_of_the_same_name(
    stack: Stack, tenants: dict[str, dict[str, Any]]
) -> None:
    a, b = tenants["alpha"], tenants["beta"]
    fake = FakeVLLM(BASE)
    with serve_app(fake.app, ready_path="/health") as engine:
        app = create_app(stack.settings, db_url=stack.db_url, engine_urls=[f"vllm+{engine}"])
        with serve_app(app) as api:
            for t in (a, b):  # the same name, created over REST by each tenant
                made = _post(api, "/v1/routes", t["key"], {"name": ROUTE, "base_model": BASE})
                assert made.status_code == 201, made.text
            # beta's route serves its bare base; alpha's its prod.
            prod_a = stack.prod(a["id"])
            wait_until(lambda: stack.loaded(prod_a), "alpha's prod loaded")
            for _ in range(3):
                got_a, got_b = _chat(api, a["key"]), _chat(api, b["key"])
                assert got_a.status_code == 200 and got_b.status_code == 200, got_b.text
                assert got_a.headers["x-cft-adapter"] == prod_a
                assert got_a.json()["choices"][0]["message"]["content"] == f"served by {prod_a}"
                assert got_b.headers["x-cft-adapter"] == BASE
                assert got_b.json()["choices"][0]["message"]["content"] == f"served by {BASE}"
            # beta's own prod: each tenant now gets its own adapter, whichever asks first.
            prod_b = stack.prod(b["id"])
            wait_until(lambda: stack.loaded(prod_b), "beta's prod loaded")
            wait_until(lambda: _chat(api, b["key"]).headers["x-cft-adapter"] == prod_b, "beta")
            assert _chat(api, a["key"]).headers["x-cft-adapter"] == prod_a
            assert fake.served[-2:] == [prod_b, prod_a]
            # Retiring alpha's prod sends alpha to the base and leaves beta's prod serving.
            with psycopg.connect(stack.db_url, autocommit=True) as c:
                c.execute(
                    "UPDATE serve.adapter SET status = 'retired', traffic_pct = 0 WHERE id = %s",
                    (prod_a,),
                )
            wait_until(lambda: _chat(api, a["key"]).headers["x-cft-adapter"] == BASE, "alpha")
            assert _chat(api, b["key"]).headers["x-cft-adapter"] == prod_b
    # Each call is logged for its own tenant's route, served by that route's adapter or base.
    served = {(a["id"], prod_a), (a["id"], BASE), (b["id"], BASE), (b["id"], prod_b)}

    def logged() -> set[tuple[int, str, str]]:
        with psycopg.connect(stack.db_url, autocommit=True, row_factory=dict_row) as c:
            rows = c.execute("SELECT tenant_id, route, adapter_id FROM obs.inference_log")
            return {(r["tenant_id"], r["route"], r["adapter_id"]) for r in rows.fetchall()}

    rows = wait_until(lambda: (got := logged()) >= {(t, ROUTE, x) for t, x in served} and got,
                      "every kind of call logged")  # fmt: skip
    assert {(t, x) for t, _, x in rows} == served and {r for _, r, _ in rows} == {ROUTE}
    # Per tenant and route, what each adapter served: SQL over the log (obs.adapter_serving_7d;
    # the router's metrics stay a few series at any number of routes).
    with psycopg.connect(stack.db_url, autocommit=True, row_factory=dict_row) as c:
        rows = c.execute(
            "SELECT tenant_id, adapter_id, n FROM obs.adapter_serving_7d WHERE route = %s",
            (ROUTE,),
        ).fetchall()
    n = {(r["tenant_id"], r["adapter_id"]): r["n"] for r in rows}
    assert n.get((a["id"], prod_a), 0) >= 3 and n.get((b["id"], prod_b), 0) >= 1
    assert n.get((b["id"], BASE), 0) >= 3
    assert (a["id"], prod_b) not in n and (b["id"], prod_a) not in n


def _cft(monkeypatch: pytest.MonkeyPatch, db_url: str, *argv: str) -> int:
    monkeypatch.setenv("CFT_DATABASE_URL", db_url)
    get_settings.cache_clear()
    try:
        return cli.main(list(argv))
    finally:
        get_settings.cache_clear()


def test_commands_that_see_every_tenant_ask_which_one_when_a_name_is_shared(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    db_url: str,
    conn: Any,
    tenants: dict[str, dict[str, Any]],
) -> None:
    a, b = tenants["alpha"], tenants["beta"]
    for t in (a, b):
        conn.execute(
            "INSERT INTO serve.route (name, tenant_id, base_model) VALUES (%s, %s, %s)",
            (ROUTE, t["id"], BASE),
        )
    assert _cft(monkeypatch, db_url, "loop", "status", ROUTE) == 1
    assert "2 tenants have a route named 'support': name one with --tenant" in (
        capsys.readouterr().err
    )
    assert _cft(monkeypatch, db_url, "loop", "enable", ROUTE, "--tenant", b["name"]) == 0
    enabled = conn.execute("SELECT tenant_id FROM loop.policy WHERE enabled").fetchall()
    assert [r["tenant_id"] for r in enabled] == [b["id"]]
    capsys.readouterr()
    assert _cft(monkeypatch, db_url, "rollback", ROUTE, "--reason", "x") == 1
    assert "name one with --tenant" in capsys.readouterr().err
    assert (
        _cft(monkeypatch, db_url, "rollback", ROUTE, "--tenant", str(a["id"]), "--reason", "x") == 1
    )
    assert f"route {ROUTE} has no prod adapter" in capsys.readouterr().err


def test_the_loop_counts_and_starts_each_tenants_route_of_one_name_on_its_own(
    conn: Any, tenants: dict[str, dict[str, Any]]
) -> None:
    """The loop worker sees every tenant: each tenant's `support` has its own signal, its own
    cycle, and a cycle in flight of one never holds the other's back."""
    routes = {}
    for name, t in tenants.items():
        routes[name] = make_route(conn, tenant_id=t["id"], name=ROUTE)
        set_policy(conn, routes[name], min_new_examples=2, min_interval=timedelta(0))

    def edit(name: str, text: str) -> None:
        make_log(conn, tenant_id=tenants[name]["id"], route=ROUTE, fb_edited=True,
                 edited_completion=f"better {text}",
                 messages=[{"role": "user", "content": text}])  # fmt: skip

    edit("alpha", "q1")
    edit("alpha", "q2")
    edit("beta", "q3")
    refresh(conn)
    assert trigger(conn, routes["alpha"], "volume")["value"] == 2
    assert trigger(conn, routes["beta"], "volume")["value"] == 1
    [first] = conn.execute("SELECT * FROM loop.start_due_cycles()").fetchall()
    assert (first["tenant_id"], first["route"]) == (tenants["alpha"]["id"], ROUTE)
    edit("beta", "q4")
    refresh(conn)
    [second] = conn.execute("SELECT * FROM loop.start_due_cycles()").fetchall()
    assert (second["tenant_id"], second["route"]) == (tenants["beta"]["id"], ROUTE)
    in_flight = conn.execute(
        "SELECT tenant_id FROM loop.cycle WHERE route = %s AND state = 'triggered' ORDER BY id",
        (ROUTE,),
    ).fetchall()
    assert [c["tenant_id"] for c in in_flight] == [tenants["alpha"]["id"], tenants["beta"]["id"]]
