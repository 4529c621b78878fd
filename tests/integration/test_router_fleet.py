"""The router over several engine replicas (real router, real PostgreSQL, real HTTP; the engines
are tests/support/engines.py's vLLM stand-ins): an adapter sticks to its rendezvous engine, a
busy or refusing replica passes the call on, an adapter no engine has is never answered by
another model unless the route's fallback policy says so, and the reconciler places each
adapter on the replica the router sends it to, within each replica's capacity and base."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fastapi.responses import JSONResponse, Response
from psycopg.rows import dict_row

from app.core.auth import create_key
from app.core.config import get_settings
from app.core.metrics import REGISTRY
from app.engines.placement import affinity
from app.main import create_app
from cft import serve
from tests.support.engines import FakeVLLM
from tests.support.factories import make_adapter, make_route, make_tenant
from tests.support.servers import serve_app
from tests.support.stack import Stack, wait_until

BASE = "smollm2-135m-instruct"
LOAD_WAIT = 1.5


class Replica(FakeVLLM):
    """A vLLM stand-in that can be made to answer 429 (its scheduler full)."""

    def __init__(self) -> None:
        super().__init__(BASE)
        self.busy = False
        inner = self._generate

        def generate(body: dict[str, Any], kind: str) -> Response:
            if self.busy:
                return JSONResponse(
                    {"error": {"message": "busy", "type": "RateLimitError", "code": 429}},
                    status_code=429,
                    headers={"Retry-After": "1"},
                )
            return inner(body, kind)

        self._generate = generate  # type: ignore[method-assign]


@pytest.fixture
def fleet(db_url: str) -> Iterator[dict[str, Any]]:
    """Two replicas, twelve routes each with a prod adapter loaded on both, keys, the API."""
    replicas = [Replica(), Replica()]
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        tenant = make_tenant(c)
        routes = [make_route(c, tenant_id=tenant["id"], base_model=BASE) for _ in range(12)]
        prods = [make_adapter(c, route=r, status="prod", traffic_pct=100)["id"] for r in routes]
        client = create_key(c, tenant_id=tenant["id"], role="client")
        release = create_key(c, tenant_id=tenant["id"], role="release")
    for replica in replicas:
        replica.loras.update({p: f"/srv/{p}" for p in prods})
    settings = get_settings().model_copy(update={"router_load_wait": LOAD_WAIT})
    with (
        serve_app(replicas[0].app, ready_path="/health") as e0,
        serve_app(replicas[1].app, ready_path="/health") as e1,
    ):
        app = create_app(settings, db_url=db_url, engine_urls=[f"vllm+{e0}", f"vllm+{e1}"])
        with serve_app(app) as api:
            yield {
                "api": api,
                "db_url": db_url,
                "replicas": replicas,
                "routes": routes,
                "prods": prods,
                "client": client,
                "release": release,
            }


def call(fleet: dict[str, Any], route: dict[str, Any], user: str = "u1") -> httpx.Response:
    return httpx.post(
        f"{fleet['api']}/v1/chat/completions",
        json={
            "model": route["name"],
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2,
            "user": user,
        },
        headers={"Authorization": f"Bearer {fleet['client']}"},
        timeout=30,
    )


def served_by(fleet: dict[str, Any], adapter: str) -> set[int]:
    return {i for i, r in enumerate(fleet["replicas"]) if adapter in r.served}


def test_an_adapter_sticks_to_one_replica_and_adapters_spread(fleet: dict[str, Any]) -> None:
    for route, prod in zip(fleet["routes"], fleet["prods"], strict=True):
        for user in ("a", "b", "c"):
            resp = call(fleet, route, user)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-cft-adapter"] == prod
            assert "x-cft-fallback" not in resp.headers
        assert len(served_by(fleet, prod)) == 1, prod  # every call of it on the same replica
    per_replica = Counter(next(iter(served_by(fleet, p))) for p in fleet["prods"])
    assert set(per_replica) == {0, 1}, per_replica  # each replica caches a share


def test_a_busy_or_refusing_replica_passes_the_call_on(fleet: dict[str, Any]) -> None:
    route, prod = fleet["routes"][0], fleet["prods"][0]
    assert call(fleet, route).status_code == 200
    first = next(iter(served_by(fleet, prod)))
    other = fleet["replicas"][1 - first]
    # Its first replica answers 429: the other takes the call, with the same adapter.
    fleet["replicas"][first].busy = True
    resp = call(fleet, route)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-cft-adapter"] == prod and "x-cft-fallback" not in resp.headers
    assert other.served[-1] == prod
    # Both busy: a 429 with Retry-After that says so.
    other.busy = True
    resp = call(fleet, route)
    assert resp.status_code == 429 and resp.headers["retry-after"]
    assert resp.json()["error"]["code"] == "engine_busy"
    other.busy = fleet["replicas"][first].busy = False
    # Its first replica lost it (restart, eviction): vLLM's 404; the other replica answers.
    del fleet["replicas"][first].loras[prod]
    resp = call(fleet, route)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-cft-adapter"] == prod and "x-cft-fallback" not in resp.headers
    assert other.served[-1] == prod


def _log_row(db_url: str, request_id: str) -> dict[str, Any]:
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        deadline = time.monotonic() + 15
        while True:
            row = c.execute(
                "SELECT status, adapter_id, variant FROM obs.inference_log WHERE request_id = %s",
                (request_id,),
            ).fetchone()
            if row is not None or time.monotonic() > deadline:
                assert row is not None, f"no log row for {request_id}"
                return row
            time.sleep(0.1)


def test_no_silent_base_answer_unless_the_route_says_so(fleet: dict[str, Any]) -> None:
    route, prod = fleet["routes"][1], fleet["prods"][1]
    for replica in fleet["replicas"]:
        del replica.loras[prod]
    # No engine has it: the call waits for the load, then a 503 that says so; its log row
    # names the adapter it was for, never the base.
    started = time.monotonic()
    resp = call(fleet, route)
    waited = time.monotonic() - started
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "adapter_not_loaded"
    assert resp.headers["retry-after"] and LOAD_WAIT <= waited < LOAD_WAIT + 5
    assert prod in resp.json()["error"]["message"]
    row = _log_row(fleet["db_url"], resp.headers["x-request-id"])
    assert row["status"] == "error" and row["adapter_id"] == prod
    assert BASE not in {m for r in fleet["replicas"] for m in r.served}

    # Loaded while the call waits (the reconciler's load landing): the adapter answers.
    def load_later() -> None:
        time.sleep(0.4)
        fleet["replicas"][0].loras[prod] = f"/srv/{prod}"

    threading.Thread(target=load_later, daemon=True).start()
    resp = call(fleet, route)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-cft-adapter"] == prod and "x-cft-fallback" not in resp.headers

    # A release key lets the base answer meanwhile (fallback 'base'); the answer says so and
    # its log row names the base, in no arm.
    del fleet["replicas"][0].loras[prod]
    headers = {"Authorization": f"Bearer {fleet['release']}"}
    patched = httpx.patch(
        f"{fleet['api']}/v1/routes/{route['name']}",
        json={"fallback": "base"},
        headers=headers,
        timeout=10,
    )
    assert patched.status_code == 200 and patched.json()["fallback"] == "base", patched.text
    client_key = {"Authorization": f"Bearer {fleet['client']}"}
    assert (
        httpx.patch(
            f"{fleet['api']}/v1/routes/{route['name']}",
            json={"fallback": "none"},
            headers=client_key,
            timeout=10,
        ).status_code
        == 403
    )
    bad = httpx.patch(
        f"{fleet['api']}/v1/routes/{route['name']}",
        json={"fallback": "anything"},
        headers=headers,
        timeout=10,
    )
    assert bad.status_code in (400, 422) and "fallback" in bad.text
    deadline = time.monotonic() + 10
    while (resp := call(fleet, route)).status_code != 200:  # the route's NOTIFY reaching it
        assert time.monotonic() < deadline, resp.text
        time.sleep(0.1)
    assert resp.headers["x-cft-adapter"] == BASE
    # not_loaded, or adapter_error when a replica still listed it and refused it first.
    assert resp.headers["x-cft-fallback"] in ("not_loaded", "adapter_error")
    row = _log_row(fleet["db_url"], resp.headers["x-request-id"])
    assert row["adapter_id"] == BASE and row["variant"] is None


def test_fallback_is_part_of_the_route(fleet: dict[str, Any]) -> None:
    api, route = fleet["api"], fleet["routes"][2]
    got = httpx.get(
        f"{api}/v1/routes/{route['name']}",
        headers={"Authorization": f"Bearer {fleet['release']}"},
        timeout=10,
    )
    assert got.status_code == 200 and got.json()["fallback"] == "none"


def test_each_replica_loads_its_share_within_capacity_and_the_rest_on_first_call(
    db_url: str, tmp_path: Path
) -> None:
    """Two replicas of the route's base that each keep 2 adapters, and one of another base:
    each adapter goes to its rendezvous-first replica of its base (the router's order too),
    at most 2 ahead per replica, the others loaded by their first call; the replica of the
    other base gets no adapter and no call."""
    stack = Stack(db_url, tmp_path, BASE)
    stack.settings = stack.settings.model_copy(
        update={"engine_adapter_slots": 2, "router_load_wait": 10.0}
    )
    routes = [stack.route] + [stack.add_route() for _ in range(7)]
    prods = [stack.adapter(status="prod", pct=100, route=r) for r in routes]
    same = [FakeVLLM(BASE), FakeVLLM(BASE)]
    other = FakeVLLM("another-base")
    with (
        serve_app(same[0].app, ready_path="/health") as e0,
        serve_app(same[1].app, ready_path="/health") as e1,
        serve_app(other.app, ready_path="/health") as e2,
    ):
        urls = [e0, e1]
        app = serve.create_app(
            stack.settings, db_url=db_url, engine_urls=[f"vllm+{u}" for u in (e0, e1, e2)]
        )
        with serve_app(app) as api:
            homes = {p: max(urls, key=lambda u, p=p: affinity(u, p)) for p in prods}
            ahead = {u: min(2, sum(1 for h in homes.values() if h == u)) for u in urls}
            wait_until(
                lambda: all(len(r.loras) == ahead[u] for r, u in zip(same, urls, strict=True)),
                "the hot sets loaded ahead",
            )
            cold_before = first_token_count()
            for route, prod in zip(routes, prods, strict=True):
                resp = stack.call(api, route=route)
                assert resp.status_code == 200, resp.text
                assert resp.headers["x-cft-adapter"] == prod
                assert same[urls.index(homes[prod])].served[-1] == prod
            # The calls that waited for their adapter's load are the cold starts' first tokens.
            assert first_token_count() - cold_before == len(prods) - sum(ahead.values())
            for replica, url in zip(same, urls, strict=True):
                assert set(replica.loras) == {p for p, h in homes.items() if h == url}
                assert replica.loads == len(replica.loras)  # each loaded once, nowhere else
            assert other.loras == {} and other.served == []


def first_token_count() -> float:
    """Calls whose first token came after a cold start (cft_cold_start_seconds, first_token)."""
    sample = REGISTRY.get_sample_value("cft_cold_start_seconds_count", {"stage": "first_token"})
    return sample or 0.0


def test_a_hot_adapter_is_widened_to_a_second_replica_and_a_cold_one_is_not(
    db_url: str, tmp_path: Path
) -> None:
    """An adapter called faster than CFT_ENGINE_WIDEN_RATE is loaded on the second replica of
    its rendezvous order too, and its calls go to both, turn about; one called seldom stays on
    its first; one whose replica answered 429 is widened as well."""
    stack = Stack(db_url, tmp_path, BASE)
    stack.settings = stack.settings.model_copy(
        update={"engine_widen_rate": 0.3, "router_load_wait": 10.0}
    )
    hot_route, cold_route, busy_route = stack.route, stack.add_route(), stack.add_route()
    hot = stack.adapter(status="prod", pct=100, route=hot_route)
    cold = stack.adapter(status="prod", pct=100, route=cold_route)
    busy = stack.adapter(status="prod", pct=100, route=busy_route)
    replicas = [Replica(), Replica()]
    with (
        serve_app(replicas[0].app, ready_path="/health") as e0,
        serve_app(replicas[1].app, ready_path="/health") as e1,
    ):
        urls = [e0, e1]
        app = serve.create_app(
            stack.settings, db_url=db_url, engine_urls=[f"vllm+{u}" for u in urls]
        )
        with serve_app(app) as api:

            def holders(adapter: str) -> set[int]:
                return {i for i, r in enumerate(replicas) if adapter in r.loras}

            def home(adapter: str) -> int:
                return urls.index(max(urls, key=lambda u: affinity(u, adapter)))

            wait_until(
                lambda: all(holders(a) == {home(a)} for a in (hot, cold, busy)),
                "each adapter loaded ahead on its first replica",
            )
            # 12 calls in a moment: above 0.3 calls/s (one call, as the cold one gets: ~0.12).
            for _ in range(12):
                assert stack.call(api, route=hot_route).status_code == 200
            assert stack.call(api, route=cold_route).status_code == 200
            wait_until(lambda: holders(hot) == {0, 1}, "the hot adapter on both replicas")
            served = [sum(1 for m in r.served if m == hot) for r in replicas]
            for _ in range(10):
                resp = stack.call(api, route=hot_route)
                assert resp.status_code == 200 and resp.headers["x-cft-adapter"] == hot
            now = [sum(1 for m in r.served if m == hot) for r in replicas]
            assert [b - a for a, b in zip(served, now, strict=True)] == [5, 5]  # turn about
            # The cold one: on its first replica only, every call answered there.
            assert holders(cold) == {home(cold)}
            assert {i for i, r in enumerate(replicas) if cold in r.served} == {home(cold)}
            # Its first replica answers 429: the call waits for no one and gets a 429 (no other
            # replica holds it yet); the adapter is widened, and the next call is answered.
            first = replicas[home(busy)]
            first.busy = True
            assert stack.call(api, route=busy_route).status_code == 429
            wait_until(lambda: holders(busy) == {0, 1}, "the busy adapter on both replicas")
            resp = stack.call(api, route=busy_route)
            assert resp.status_code == 200 and resp.headers["x-cft-adapter"] == busy
            assert replicas[1 - home(busy)].served[-1] == busy
            first.busy = False
