"""Each engine kind driven through the real router and reconciler (real PostgreSQL, real HTTP).

The engines are tests/support/engines.py's protocol-faithful stand-ins for vLLM, SGLang and
LoRAX (written from their source; the real engines cannot run here): load, route, serve and
unload for each kind, and the reconciler's reading of vLLM's error answers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from app.core.artefacts import WEIGHTS_FILE, LocalStore
from app.core.auth import create_key
from app.core.config import get_settings
from app.engines.base import Outcome
from app.engines.vllm import KIND as VLLM
from tests.support.engines import FakeLoRAX, FakeSGLang, FakeVLLM, write_adapter
from tests.support.factories import make_adapter, make_route, make_tenant
from tests.support.servers import serve_app
from workers.api import create_app

BASE = "smollm2-135m-instruct"


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


class Stack:
    """A tenant with a route, its key, an artefact store and the router's settings."""

    def __init__(self, db_url: str, tmp_path: Path) -> None:
        self.db_url = db_url
        self.tmp = tmp_path
        self.store = LocalStore(tmp_path / "store")
        with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
            tenant = make_tenant(c)
            self.route = make_route(c, tenant_id=tenant["id"], base_model=BASE)
            self.key = create_key(c, tenant_id=tenant["id"], role="client")
            c.execute(
                "INSERT INTO train.promotion_policy (tenant_id, route, suite_id, metric, direction)"
                " VALUES (%s, %s, 'tasks', 'accuracy', 'higher')",
                (self.route["tenant_id"], self.route["name"]),
            )
        self.settings = get_settings().model_copy(
            update={"serving_dir": tmp_path / "serving", "reconcile_interval": 0.2}
        )

    def adapter(self, *, status: str, pct: int = 0, rank: int = 8, tamper: bool = False) -> str:
        version = f"v-{uuid.uuid4().hex[:8]}"
        src = write_adapter(self.tmp / "src" / version, rank=rank)
        stored = self.store.put_dir(src, self.route["name"], version)
        if tamper:
            weights = Path(stored.uri.removeprefix("file://")) / WEIGHTS_FILE
            weights.chmod(0o644)
            weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")
        with psycopg.connect(self.db_url, autocommit=True, row_factory=dict_row) as c:
            row = make_adapter(
                c,
                route=self.route,
                id=f"{self.route['name']}-{version}",
                status=status,
                traffic_pct=pct,
                rank=rank,
                weights_uri=stored.uri,
                sha256=stored.sha256,
            )
            c.execute(
                "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
                " VALUES (%s, 'tasks', 'accuracy', 0.5)",
                (row["id"],),
            )
        return str(row["id"])

    def retire(self, adapter_id: str) -> None:
        with psycopg.connect(self.db_url, autocommit=True) as c:
            c.execute(
                "UPDATE serve.adapter SET status = 'retired', traffic_pct = 0 WHERE id = %s",
                (adapter_id,),
            )

    def deployment(self, adapter_id: str) -> dict[str, Any]:
        with psycopg.connect(self.db_url, autocommit=True, row_factory=dict_row) as c:
            row = c.execute(
                "SELECT * FROM serve.adapter_deployment WHERE adapter_id = %s", (adapter_id,)
            ).fetchone()
        return row or {}

    def call(self, api: str, user: str = "u1") -> httpx.Response:
        return httpx.post(
            f"{api}/v1/completions",
            json={"model": self.route["name"], "prompt": "Hi", "max_tokens": 2, "user": user},
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=30,
        )


@pytest.fixture
def stack(db_url: str, tmp_path: Path) -> Stack:
    return Stack(db_url, tmp_path)


def test_vllm_answers_as_vllm_does_and_the_reconciler_reads_each(tmp_path: Path) -> None:
    """Load/unload requests and every documented error shape, without the router."""
    adapter = str(write_adapter(tmp_path / "a", rank=8))
    big = str(write_adapter(tmp_path / "big", rank=32))
    dora = str(write_adapter(tmp_path / "dora", use_dora=True))
    with httpx.Client(timeout=10) as client:
        fake = FakeVLLM(BASE, max_lora_rank=16)
        with serve_app(fake.app, ready_path="/health") as url:
            assert VLLM.load(client, url, "a", adapter).outcome is Outcome.DONE
            assert fake.requests[-1] == (
                "/v1/load_lora_adapter",
                {"lora_name": "a", "lora_path": adapter},
            )
            again = VLLM.load(client, url, "a", adapter)
            assert again.outcome is Outcome.ALREADY and "already been loaded" in again.message
            refused = VLLM.load(client, url, "big", big)
            assert refused.outcome is Outcome.REFUSED
            assert "LoRA rank 32 is greater than max_lora_rank 16" in refused.message
            assert "DoRA" in VLLM.load(client, url, "d", dora).message
            missing = VLLM.load(client, url, "m", str(tmp_path / "nowhere"))
            assert missing.outcome is Outcome.NO_PATH and "No adapter found" in missing.message
            assert VLLM.unload(client, url, "a").outcome is Outcome.DONE
            assert fake.requests[-1] == ("/v1/unload_lora_adapter", {"lora_name": "a"})
            gone = VLLM.unload(client, url, "a")
            assert gone.outcome is Outcome.ALREADY and "cannot be found" in gone.message
        closed = FakeVLLM(BASE, runtime_lora_updating=False)
        with serve_app(closed.app, ready_path="/health") as url:
            off = VLLM.load(client, url, "a", adapter)
            assert off.outcome is Outcome.NO_API
            assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in off.message
            # A 404 for the route is not "already unloaded": the adapter is still there.
            assert VLLM.unload(client, url, "a").outcome is Outcome.NO_API


def test_vllm_kind_load_route_refuse_unload(stack: Stack) -> None:
    fake = FakeVLLM(BASE, max_lora_rank=16)
    prod = stack.adapter(status="prod", pct=100)
    with serve_app(fake.app, ready_path="/health") as engine:
        app = create_app(stack.settings, db_url=stack.db_url, engine_urls=[f"vllm+{engine}"])
        with serve_app(app) as api:
            wait_until(lambda: stack.deployment(prod).get("state") == "loaded", "load")
            assert fake.loras == {prod: str(stack.settings.serving_path / prod)}
            resp = stack.call(api)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-cft-adapter"] == prod and fake.served[-1] == prod
            # A canary above the engine's --max-lora-rank: vLLM's 400, recorded, not routed.
            big = stack.adapter(status="canary", pct=50, rank=32)
            failed = wait_until(lambda: stack.deployment(big).get("state") == "failed", "refusal")
            assert failed and "LoRA rank 32 is greater than max_lora_rank 16" in str(
                stack.deployment(big)["error"]
            )
            assert {stack.call(api, f"u{i}").headers["x-cft-adapter"] for i in range(8)} == {prod}
            stack.retire(prod)
            wait_until(lambda: prod not in fake.loras, "unload")
            wait_until(lambda: stack.deployment(prod)["state"] == "unloaded", "unload recorded")
            assert stack.call(api).headers["x-cft-adapter"] == BASE


def test_vllm_without_runtime_lora_updating_is_a_readable_failure(stack: Stack) -> None:
    fake = FakeVLLM(BASE, runtime_lora_updating=False)
    prod = stack.adapter(status="prod", pct=100)
    with serve_app(fake.app, ready_path="/health") as engine:
        app = create_app(stack.settings, db_url=stack.db_url, engine_urls=[engine])
        with serve_app(app) as api:
            row = wait_until(lambda: stack.deployment(prod).get("error"), "failure")
            assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in row
            resp = stack.call(api)
            assert resp.headers["x-cft-adapter"] == BASE
            assert resp.headers["x-cft-fallback"] == "not_loaded"


def test_sglang_kind_loads_names_base_colon_adapter_and_unloads(stack: Stack) -> None:
    fake = FakeSGLang(BASE)
    # Passes only on start, NOTIFY and the router's kick: the eviction below stays unseen
    # until the router meets it.
    stack.settings = stack.settings.model_copy(update={"reconcile_interval": 60.0})
    prod = stack.adapter(status="prod", pct=100)
    with serve_app(fake.app, ready_path="/health") as engine:
        app = create_app(stack.settings, db_url=stack.db_url, engine_urls=[f"sglang+{engine}"])
        with serve_app(app) as api:
            wait_until(lambda: stack.deployment(prod).get("state") == "loaded", "load")
            assert (
                "/load_lora_adapter",
                {"lora_name": prod, "lora_path": str(stack.settings.serving_path / prod)},
            ) in fake.requests
            resp = stack.call(api)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-cft-adapter"] == prod
            assert fake.served[-1] == f"{BASE}:{prod}"
            assert resp.json()["model"] == stack.route["name"]
            # Evicted behind the reconciler's back (--max-loaded-loras): SGLang's 400 "not
            # loaded" makes the router fall back at once, and the reconciler loads it again.
            del fake.loras[prod]
            resp = stack.call(api)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-cft-adapter"] == BASE
            assert resp.headers["x-cft-fallback"] == "adapter_error"
            wait_until(lambda: prod in fake.loras, "reload")
            wait_until(lambda: stack.call(api).headers["x-cft-adapter"] == prod, "route back")
            stack.retire(prod)
            wait_until(lambda: prod not in fake.loras, "unload")
            assert ("/unload_lora_adapter", {"lora_name": prod}) in fake.requests
            wait_until(lambda: stack.deployment(prod)["state"] == "unloaded", "unload recorded")
            assert stack.call(api).headers["x-cft-adapter"] == BASE
            assert fake.served[-1] == BASE


def test_lorax_kind_stages_verified_files_and_names_the_adapter_per_request(
    stack: Stack,
) -> None:
    fake = FakeLoRAX(BASE)
    prod = stack.adapter(status="prod", pct=100)
    bad = stack.adapter(status="canary", pct=50, tamper=True)
    with serve_app(fake.app, ready_path="/health") as engine:
        app = create_app(stack.settings, db_url=stack.db_url, engine_urls=[f"lorax+{engine}"])
        with serve_app(app) as api:
            row = wait_until(
                lambda: (d := stack.deployment(prod)).get("state") == "loaded" and d, "staging"
            )
            assert row["sha256_checked_at"] is not None
            staged = stack.settings.serving_path / prod
            assert (staged / WEIGHTS_FILE).is_file()
            refused = wait_until(lambda: stack.deployment(bad).get("error"), "refusal")
            assert "sha256" in refused and not (stack.settings.serving_path / bad).exists()
            # No load call: the adapter is named in the call and loaded on first use.
            assert not any("load" in p for p in fake.paths())
            assert fake.loaded == {}
            for i in range(6):
                resp = stack.call(api, f"user-{i}")
                assert resp.status_code == 200, resp.text
                assert resp.headers["x-cft-adapter"] == prod  # the tampered canary never
            assert fake.loaded == {str(staged): 6}
            body = next(b for p, b in reversed(fake.requests) if p == "/v1/completions")
            assert body["model"] == str(staged) and body["adapter_source"] == "local"
            stack.retire(prod)
            wait_until(lambda: stack.deployment(prod)["state"] == "unloaded", "unload recorded")
            resp = stack.call(api)
            assert resp.headers["x-cft-adapter"] == BASE and fake.served[-1] == ""
