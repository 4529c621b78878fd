"""Continuous batching in the local engine: same tokens as alone, bounded queue, live unload.

Real bundled model, real PEFT adapters, real HTTP server; generations are kept short.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from safetensors.torch import load_file, save_file

from cft.engine.cli import add_arguments
from cft.engine.core import Engine
from cft.engine.request import GenRequest, Sampling
from cft.engine.server import create_app
from tests.support.lora import make_adapter_dir
from tests.support.servers import serve_app
from workers import base_model

pytestmark = pytest.mark.slow

BASE = base_model.BUNDLED


def scaled_copy(source: Path, target: Path, factor: float) -> Path:
    """A copy of an adapter with lora_B scaled by factor (another adapter, no model load)."""
    shutil.copytree(source, target)
    weights = target / "adapter_model.safetensors"
    tensors = load_file(weights)
    save_file({k: v * factor if "lora_B" in k else v for k, v in tensors.items()}, weights)
    return target


@pytest.fixture(scope="module")
def adapter_dirs(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two random adapters that change the text but keep it readable (lora_B / 4 and -lora_B / 4
    of the shared test adapter): near ties in the logits make token equality a sharp test."""
    root = tmp_path_factory.mktemp("batching-adapters")
    strong = make_adapter_dir(models_dir, root / "strong", seed=1)
    return {"a": scaled_copy(strong, root / "a", 0.25), "b": scaled_copy(strong, root / "b", -0.25)}


@pytest.fixture(scope="module")
def engine(models_dir: Path, adapter_dirs: dict[str, Path]) -> Iterator[Engine]:
    eng = Engine(BASE, models_dir, max_loras=4, max_cpu_loras=4)
    for name, path in adapter_dirs.items():
        eng.load_adapter(name, str(path))
    yield eng
    eng.close()


def sample(engine: Engine, name: str) -> float:
    return engine.metrics.registry.get_sample_value(name) or 0.0


def steps(engine: Engine) -> float:
    """Decode steps so far (one batch_size observation per step)."""
    return sample(engine, "cft_engine_batch_size_count")


class Run:
    """One request through the engine, as the HTTP layer sends it."""

    def __init__(self, prompt: list[int], adapter: str | None, max_tokens: int, **over: Any):
        self.prompt, self.adapter, self.max_tokens, self.over = prompt, adapter, max_tokens, over
        self.text = ""
        self.done: dict[str, Any] = {}
        self.req: GenRequest | None = None
        self.finished = 0.0

    async def __call__(self, engine: Engine, delay: float = 0.0) -> Run:
        await asyncio.sleep(delay)
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.req = GenRequest(
            prompt_ids=self.prompt,
            adapter=self.adapter,
            sampling=Sampling(max_tokens=self.max_tokens, temperature=0, **self.over),
            loop=asyncio.get_running_loop(),
            queue=queue,
        )
        engine.submit(self.req)
        while True:
            kind, payload = await queue.get()
            if kind == "delta":
                self.text += payload
            elif kind == "error":
                raise payload
            else:
                self.done = payload
                self.finished = time.monotonic()
                return self

    @property
    def tokens(self) -> list[int]:
        assert self.req is not None
        return self.req.token_ids


def test_continuous_batch_equals_each_alone(engine: Engine) -> None:
    """Mixed adapters, prompt lengths and max_tokens; requests join a running batch.

    (Stop strings in a batch: test_http_streaming_and_stop_in_a_batch.)
    """
    topics = [
        "cats",
        "the long history of sailing ships in the cold northern seas",
        "bread",
        "why the sky is blue, for a child",
        "owls",
    ]
    models = [None, "a", "b", "a", "b"]
    lengths = [7, 4, 8, 5, 6]
    specs = [
        (engine.model.chat_prompt_ids([{"role": "user", "content": f"Write about {t}."}]), m, n)
        for t, m, n in zip(topics, models, lengths, strict=True)
    ]

    def runs() -> list[Run]:
        return [Run(p, m, n) for p, m, n in specs]

    async def alone() -> list[Run]:
        return [await r(engine) for r in runs()]

    async def together() -> list[Run]:
        # Staggered: later requests arrive while earlier ones are decoding.
        return await asyncio.gather(*(r(engine, delay=0.12 * i) for i, r in enumerate(runs())))

    steps_before = steps(engine)
    one = asyncio.run(alone())
    steps_alone = steps(engine) - steps_before
    assert len({r.text for r in one}) == len(one)  # adapters and prompts differ
    both = asyncio.run(together())
    steps_together = steps(engine) - steps_before - steps_alone
    for a, b in zip(one, both, strict=True):
        assert b.tokens == a.tokens and b.text == a.text and b.done == a.done
        assert b.done["completion_tokens"] == len(b.tokens) <= b.max_tokens
    assert all(r.done["finish_reason"] == "length" for r in one)
    # Some request was admitted while another was decoding, and left before the rest ended.
    reqs = [(r.req.admitted, r.finished) for r in both if r.req and r.req.admitted]
    assert any(s1 < s2 < f1 for s1, f1 in reqs for s2, _ in reqs)
    assert min(f for _, f in reqs) < max(f for _, f in reqs)
    assert steps_together < steps_alone  # decode steps carried several requests


def test_http_streaming_and_stop_in_a_batch(engine: Engine) -> None:
    """Streaming and non-streaming over HTTP, with usage and stop, while batched."""
    with serve_app(create_app(engine), ready_path="/health") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
        msgs = [{"role": "user", "content": "Count from one to ten in words."}]

        def chat(model: str) -> tuple[str, Any]:
            r = client.chat.completions.create(
                model=model,
                messages=msgs,
                max_tokens=6,
                temperature=0,  # type: ignore[arg-type]
            )
            return r.choices[0].message.content or "", r.usage

        def stream(model: str) -> tuple[str, Any]:
            chunks = list(
                client.chat.completions.create(
                    model=model,
                    messages=msgs,  # type: ignore[arg-type]
                    max_tokens=6,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            return text, chunks[-1].usage

        def complete(stop: list[str] | None) -> tuple[str, str | None]:
            r = client.completions.create(
                model="b", prompt="1, 2, 3, 4,", max_tokens=8, temperature=0, stop=stop
            )
            return r.choices[0].text, r.choices[0].finish_reason

        alone = {m: chat(m) for m in (BASE, "a")}
        whole, _ = complete(None)
        assert "6" in whole
        with ThreadPoolExecutor(5) as pool:
            futures = [
                pool.submit(stream, "a"),
                pool.submit(chat, BASE),
                pool.submit(complete, ["6"]),
                pool.submit(stream, BASE),
                pool.submit(chat, "a"),
            ]
            (s_a, u_a), (c_b, u_b), (stopped, why), (s_b, _), (c_a, _) = [
                f.result() for f in futures
            ]
        assert s_a == c_a == alone["a"][0] and c_b == s_b == alone[BASE][0]
        assert u_a == alone["a"][1] and u_b == alone[BASE][1]
        assert stopped == whole[: whole.index("6")] and why == "stop"
        text = httpx.get(url + "/metrics").text
        assert "cft_engine_queue_time_seconds_count" in text


def test_full_queue_answers_429_with_retry_after(engine: Engine) -> None:
    eng = engine
    eng.scheduler.max_waiting = 2
    try:
        with serve_app(create_app(eng), ready_path="/health") as url:
            body = {"model": BASE, "prompt": "Hello", "max_tokens": 2, "temperature": 0}
            with ThreadPoolExecutor(2) as pool:
                with eng.model.lock:  # the scheduler cannot take anything off the queue
                    waiting = [
                        pool.submit(httpx.post, url + "/v1/completions", json=body, timeout=120)
                        for _ in range(2)
                    ]
                    while sample(eng, "cft_engine_requests_waiting") < 2:
                        time.sleep(0.01)
                    full = httpx.post(url + "/v1/completions", json=body, timeout=30)
                assert [f.result().status_code for f in waiting] == [200, 200]
            assert full.status_code == 429 and full.headers["retry-after"] == "1"
            err = full.json()["error"]
            assert err["type"] == "TooManyRequestsError" and err["code"] == 429
            assert "2 requests are waiting" in err["message"]
            assert "--max-waiting-queue-length 2" in err["message"]
            text = httpx.get(url + "/metrics").text
            assert "cft_engine_requests_rejected_total 1.0" in text
            assert 'status="429"' in text
    finally:
        eng.scheduler.max_waiting = 256


def test_unload_while_decoding_finishes_on_the_old_weights(
    engine: Engine, adapter_dirs: dict[str, Path]
) -> None:
    prompt = engine.model.chat_prompt_ids(
        [{"role": "user", "content": "Describe a quiet morning."}]
    )
    engine.load_adapter("live", str(adapter_dirs["a"]))
    alone = asyncio.run(Run(prompt, "live", 24)(engine))

    async def unload_midway() -> Run:
        run = Run(prompt, "live", 24)
        task = asyncio.create_task(run(engine))
        while not (run.req and run.req.token_ids):
            await asyncio.sleep(0.005)

        def swap() -> None:
            # Under the model lock no decode step runs, so the request is still decoding with the
            # old weights while the name is unloaded and loaded again (without it, a fast machine
            # finished the request between the two calls).
            with engine.model.lock:
                assert run.req is not None and run.req.finish_reason is None
                engine.unload_adapter("live")
                # Loaded again under the same name while the old one still decodes: its own key.
                engine.load_adapter("live", str(adapter_dirs["b"]))
                assert engine.adapters.by_name["live"].key != "live"
                assert "live" in engine.adapters.retired

        await asyncio.to_thread(swap)
        return await task

    during = asyncio.run(unload_midway())
    assert during.tokens == alone.tokens and during.done == alone.done
    deadline = time.monotonic() + 10
    while "live" in engine.adapters.resident and time.monotonic() < deadline:
        time.sleep(0.01)
    # Freed once it finished.
    assert "live" not in engine.adapters.resident and not engine.adapters.retired
    b_alone = asyncio.run(Run(prompt, "b", 4)(engine))
    assert asyncio.run(Run(prompt, "live", 4)(engine)).tokens == b_alone.tokens
    engine.unload_adapter("live")


def test_batch_and_queue_flags_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    assert (args.max_num_seqs, args.max_waiting_queue_length) == (16, 256)
