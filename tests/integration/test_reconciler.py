"""The reconciler and the gateway's failure behaviour: real engine, real API, real PostgreSQL."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from app.core.artefacts import WEIGHTS_FILE, LocalStore
from app.core.auth import create_key
from app.core.config import get_settings
from cft.engine.core import Engine
from cft.engine.server import create_app as create_engine_app
from cft.serve import create_app
from tests.support.factories import make_adapter, make_route, make_tenant
from tests.support.lora import make_adapter_dir
from tests.support.servers import free_port, metrics_text, serve_app
from workers import base_model

pytestmark = pytest.mark.slow
BASE = base_model.BUNDLED


@contextmanager
def engine_server(models_dir: Path, port: int) -> Iterator[str]:
    eng = Engine(BASE, models_dir, max_loras=4)
    try:
        with serve_app(create_engine_app(eng), ready_path="/health", port=port) as url:
            yield url
    finally:
        eng.close()


@pytest.fixture(scope="module")
def adapter_dirs(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("adapters")
    return [
        make_adapter_dir(
            models_dir, root / f"a{i}", seed=10 + i, target_modules=("q_proj", "v_proj")
        )
        for i in range(2)
    ]


@pytest.fixture(scope="module")
def engine(models_dir: Path) -> Iterator[str]:
    port = free_port()
    with engine_server(models_dir, port) as url:
        yield url


def engine_models(url: str) -> set[str]:
    return {m["id"] for m in httpx.get(url + "/v1/models", timeout=5).json()["data"]}


def wait_until(predicate, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def deployment(db_url: str, adapter_id: str) -> dict | None:
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
        return c.execute(
            "SELECT * FROM serve.adapter_deployment WHERE adapter_id = %s", (adapter_id,)
        ).fetchone()


class World:
    def __init__(self, db_url: str, tmp_path: Path, adapter_dirs: list[Path]):
        self.db_url = db_url
        self.store = LocalStore(tmp_path / "store")
        self.dirs = adapter_dirs
        with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
            self.tenant = make_tenant(c)
            self.route = make_route(c, tenant_id=self.tenant["id"], base_model=BASE)
            self.key = create_key(c, tenant_id=self.tenant["id"], role="client")
            c.execute(
                "INSERT INTO train.promotion_policy (tenant_id, route, suite_id, metric, direction)"
                " VALUES (%s, %s, 'tasks', 'accuracy', 'higher')",
                (self.route["tenant_id"], self.route["name"]),
            )
        self.settings = get_settings().model_copy(
            update={
                "serving_dir": tmp_path / "serving",
                "reconcile_interval": 0.3,
                "router_load_wait": 0.5,
            }
        )

    def adapter(self, which: int, *, status: str, pct: int = 0, tamper: bool = False, score=0.5):
        version = f"v-{uuid.uuid4().hex[:8]}"
        stored = self.store.put_dir(self.dirs[which], self.route["name"], version)
        if tamper:
            weights = Path(stored.uri[len("file://") :]) / WEIGHTS_FILE
            weights.chmod(0o644)
            data = bytearray(weights.read_bytes())
            data[-1] ^= 0xFF
            weights.write_bytes(bytes(data))
        with psycopg.connect(self.db_url, autocommit=True, row_factory=dict_row) as c:
            row = make_adapter(
                c,
                route=self.route,
                id=f"{self.route['name']}-{version}",
                status=status,
                traffic_pct=pct,
                weights_uri=stored.uri,
                sha256=stored.sha256,
            )
            c.execute(
                "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
                " VALUES (%s, 'tasks', 'accuracy', %s)",
                (row["id"], score),
            )
        return row["id"]

    def sql(self, query: str, *args) -> None:
        with psycopg.connect(self.db_url, autocommit=True) as c:
            c.execute(query, args)

    def call(self, api: str, user: str = "u1", **over) -> httpx.Response:
        body = {"model": self.route["name"], "prompt": "Hi", "max_tokens": 2, "user": user} | over
        return httpx.post(
            f"{api}/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=60,
        )


@pytest.fixture
def world(db_url: str, tmp_path: Path, adapter_dirs: list[Path]) -> World:
    return World(db_url, tmp_path, adapter_dirs)


def test_loads_refuses_tampered_falls_back_and_unloads_on_retire(world: World, engine: str):
    prod = world.adapter(0, status="prod", pct=100)
    bad = world.adapter(1, status="canary", pct=100, tamper=True)
    app = create_app(world.settings, db_url=world.db_url, engine_urls=[engine])
    with serve_app(app) as api:
        wait_until(
            lambda: (deployment(world.db_url, prod) or {}).get("state") == "loaded", what="load"
        )
        assert prod in engine_models(engine)
        assert (world.settings.serving_path / prod / WEIGHTS_FILE).is_file()
        refused = wait_until(lambda: deployment(world.db_url, bad), what="refusal")
        assert refused["state"] == "failed" and "sha256" in refused["error"]
        assert bad not in engine_models(engine)
        # The canary holds 100 % of users but is not loaded: with no fallback (the default),
        # a 503 that says so; with the route's fallback 'prod', they get prod, and it shows.
        refused = world.call(api)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "adapter_not_loaded"
        assert refused.headers["retry-after"]
        world.sql("UPDATE serve.route SET fallback = 'prod' WHERE name = %s", world.route["name"])
        wait_until(lambda: world.call(api).status_code == 200, what="fallback applied")
        resp = world.call(api)
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-cft-adapter"] == prod
        assert resp.headers["x-cft-fallback"] == "not_loaded"
        metrics = metrics_text()
        assert 'cft_reconciler_errors_total{reason="sha256"}' in metrics
        assert 'cft_router_fallbacks_total{reason="not_loaded"}' in metrics
        # Retire the canary and the prod (rollback leaves no prod): both leave the engine.
        world.sql("UPDATE serve.adapter SET status = 'retired', traffic_pct = 0 WHERE id = %s", bad)
        world.sql(
            "UPDATE serve.adapter SET status = 'retired', traffic_pct = 0 WHERE id = %s", prod
        )
        wait_until(lambda: prod not in engine_models(engine), what="unload")
        wait_until(
            lambda: deployment(world.db_url, prod)["state"] == "unloaded", what="unload recorded"
        )
        resp = world.call(api)
        assert resp.status_code == 200 and resp.headers["x-cft-adapter"] == BASE


def test_promotion_and_rollback_by_sql_reach_routing(world: World, engine: str):
    old = world.adapter(0, status="prod", pct=100, score=0.5)
    new = world.adapter(1, status="candidate", score=0.9)
    app = create_app(world.settings, db_url=world.db_url, engine_urls=[engine])
    with serve_app(app) as api:
        wait_until(
            lambda: (deployment(world.db_url, old) or {}).get("state") == "loaded", what="load"
        )
        assert world.call(api).headers["x-cft-adapter"] == old
        # A canary for every user (the route's ceiling raised from its default 50 %): loaded
        # by the reconciler on NOTIFY, then routed to.
        world.sql(
            "UPDATE serve.route SET max_canary_pct = 100"
            " WHERE name = (SELECT route FROM serve.adapter WHERE id = %s)",
            new,
        )
        world.sql(
            "UPDATE serve.adapter SET status = 'canary', traffic_pct = 100 WHERE id = %s", new
        )
        wait_until(lambda: world.call(api).headers["x-cft-adapter"] == new, what="canary routing")
        world.sql("UPDATE serve.adapter SET status = 'prod', traffic_pct = 100 WHERE id = %s", new)
        resp = world.call(api)
        assert resp.headers["x-cft-adapter"] == new and resp.headers.get("x-cft-variant") == "A"
        # Rollback: retiring the new prod restores the previous one, at once.
        world.sql("UPDATE serve.adapter SET status = 'retired', traffic_pct = 0 WHERE id = %s", new)
        assert world.call(api).headers["x-cft-adapter"] == old


def test_engine_down_is_503_and_a_restarted_engine_gets_its_adapters_back(
    world: World, models_dir: Path
):
    port = free_port()
    prod = world.adapter(0, status="prod", pct=100)
    app = create_app(world.settings, db_url=world.db_url, engine_urls=[f"http://127.0.0.1:{port}"])
    with serve_app(app) as api:
        with engine_server(models_dir, port) as url:
            wait_until(lambda: prod in engine_models(url), what="load")
            wait_until(lambda: world.call(api).headers.get("x-cft-adapter") == prod, what="route")
        # Engine gone: a 503 in OpenAI shape, with Retry-After.
        resp = world.call(api)
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["type"] == "service_unavailable"
        assert resp.headers["retry-after"]
        # A new engine process on the same address has none of our adapters: the reconciler
        # notices and loads them again, and routing goes back to the adapter.
        with engine_server(models_dir, port) as url:
            assert prod not in engine_models(url)
            wait_until(lambda: prod in engine_models(url), what="reload after restart")
            wait_until(lambda: world.call(api).headers.get("x-cft-adapter") == prod, what="route")


def test_second_engine_takes_over_when_one_is_down(world: World, engine: str):
    prod = world.adapter(0, status="prod", pct=100)
    dead = f"http://127.0.0.1:{free_port()}"
    app = create_app(world.settings, db_url=world.db_url, engine_urls=[dead, engine])
    with serve_app(app) as api:
        wait_until(lambda: prod in engine_models(engine), what="load")
        for user in ("a", "b", "c"):
            resp = world.call(api, user=user)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-cft-adapter"] == prod
        metrics = metrics_text()
        assert "cft_router_active_adapters" in metrics and "cft_router_decisions_total" in metrics


def test_client_disconnect_mid_stream_logs_partial_and_models_lists_routes(
    world: World, engine: str
):
    prod = world.adapter(0, status="prod", pct=100)
    app = create_app(world.settings, db_url=world.db_url, engine_urls=[engine])
    with serve_app(app) as api:
        wait_until(lambda: world.call(api).headers.get("x-cft-adapter") == prod, what="routing")
        models = httpx.get(api + "/v1/models", headers={"Authorization": f"Bearer {world.key}"})
        assert [m["id"] for m in models.json()["data"]] == [world.route["name"]]
        body = {
            "model": world.route["name"],
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 200,
            "stream": True,
            "user": "leaver",
        }
        with httpx.stream(
            "POST",
            api + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {world.key}"},
            timeout=60,
        ) as resp:
            rid = resp.headers["x-request-id"]
            seen = b""
            for chunk in resp.iter_bytes():
                seen += chunk
                if seen.count(b'"content"') >= 3:
                    break  # hang up mid-stream
        with psycopg.connect(world.db_url, autocommit=True, row_factory=dict_row) as c:
            row = wait_until(
                lambda: c.execute(
                    "SELECT * FROM obs.inference_log WHERE request_id = %s", (rid,)
                ).fetchone(),
                what="log row",
            )
        assert row["status"] == "partial"
        assert row["completion"] and row["adapter_id"] == prod
