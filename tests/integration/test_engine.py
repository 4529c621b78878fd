"""The local engine against vLLM's HTTP contract: real model, real server, real adapters."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from cft.engine.core import Engine
from cft.engine.server import create_app
from tests.support.lora import make_adapter_dir
from tests.support.servers import serve_app
from workers import base_model

pytestmark = pytest.mark.slow

BASE = base_model.BUNDLED
PROMPT = [{"role": "user", "content": "Tell me a short story about a cat."}]
MAX = 6


@pytest.fixture(scope="module")
def adapters(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two adapters for the bundled base, and one that claims another base."""
    root = tmp_path_factory.mktemp("adapters")
    a = make_adapter_dir(models_dir, root / "a", seed=1)
    b = make_adapter_dir(models_dir, root / "b", seed=2)
    foreign = root / "foreign"
    shutil.copytree(a, foreign)
    cfg = json.loads((foreign / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "meta-llama/Llama-3.1-8B-Instruct"
    (foreign / "adapter_config.json").write_text(json.dumps(cfg))
    return {"a": a, "b": b, "foreign": foreign}


@pytest.fixture(scope="module")
def engine(models_dir: Path) -> Iterator[Engine]:
    eng = Engine(BASE, models_dir, max_loras=4, max_cpu_loras=4)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def url(engine: Engine) -> Iterator[str]:
    with serve_app(create_app(engine), ready_path="/health") as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)


def chat(client: openai.OpenAI, model: str, **over: Any) -> str:
    params: dict[str, Any] = {"max_tokens": MAX, "temperature": 0, **over}
    resp = client.chat.completions.create(model=model, messages=PROMPT, **params)
    return resp.choices[0].message.content or ""


def load(url: str, name: str, path: Path) -> httpx.Response:
    return httpx.post(
        url + "/v1/load_lora_adapter",
        json={"lora_name": name, "lora_path": str(path)},
        timeout=60,
    )


def unload(url: str, name: str) -> httpx.Response:
    return httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def test_health_and_models_list_the_base(url: str) -> None:
    assert httpx.get(url + "/health").status_code == 200
    body = httpx.get(url + "/v1/models").json()
    assert body["object"] == "list"
    base = body["data"][0]
    assert base["id"] == BASE and base["object"] == "model" and base["parent"] is None
    assert Path(base["root"]).is_dir()


def test_chat_completion_shape_through_openai_client(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=BASE, messages=PROMPT, max_tokens=MAX, temperature=0
    )
    assert resp.id.startswith("chatcmpl-") and resp.object == "chat.completion"
    assert resp.model == BASE
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert resp.usage is not None
    assert 0 < resp.usage.completion_tokens <= MAX
    assert resp.usage.prompt_tokens > 10  # the chat template is applied
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_chat_streaming_matches_non_streaming(client: openai.OpenAI, url: str) -> None:
    whole = chat(client, BASE)
    stream = client.chat.completions.create(
        model=BASE,
        messages=PROMPT,
        max_tokens=MAX,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    # The raw stream is SSE and ends with [DONE].
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        json={"model": BASE, "messages": PROMPT, "max_tokens": 2, "stream": True},
        timeout=60,
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"


def test_completions_plain_and_streaming(client: openai.OpenAI) -> None:
    resp = client.completions.create(
        model=BASE, prompt="The capital of France is", max_tokens=MAX, temperature=0
    )
    assert resp.object == "text_completion" and resp.id.startswith("cmpl-")
    assert resp.choices[0].text and resp.usage is not None
    assert resp.usage.completion_tokens <= MAX
    stream = client.completions.create(
        model=BASE, prompt="The capital of France is", max_tokens=MAX, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream) == resp.choices[0].text


def test_stop_and_seed(client: openai.OpenAI) -> None:
    whole = client.completions.create(
        model=BASE, prompt="1, 2, 3, 4,", max_tokens=MAX, temperature=0
    ).choices[0]
    stopped = client.completions.create(
        model=BASE, prompt="1, 2, 3, 4,", max_tokens=MAX, temperature=0, stop=["6"]
    ).choices[0]
    assert "6" in whole.text and stopped.text == whole.text[: whole.text.index("6")]
    assert stopped.finish_reason == "stop"
    sampled = [
        chat(client, BASE, temperature=0.9, top_p=0.95, seed=7, max_tokens=6) for _ in range(2)
    ]
    assert sampled[0] == sampled[1]


def test_load_unload_and_vllm_errors(url: str, adapters: dict[str, Path]) -> None:
    r = load(url, "lu-a", adapters["a"])
    assert r.status_code == 200 and "added successfully" in r.text
    models = {m["id"]: m for m in httpx.get(url + "/v1/models").json()["data"]}
    assert models["lu-a"]["parent"] == BASE and models["lu-a"]["root"] == str(adapters["a"])

    dup = load(url, "lu-a", adapters["b"])
    assert dup.status_code == 400
    assert dup.json()["error"] == {
        "message": "The lora adapter 'lu-a' has already been loaded.",
        "type": "InvalidUserInput",
        "param": None,
        "code": 400,
    }
    foreign = load(url, "lu-foreign", adapters["foreign"])
    assert foreign.status_code == 400 and "Llama-3.1-8B" in foreign.json()["error"]["message"]
    missing = load(url, "lu-missing", adapters["a"].parent / "nope")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"

    assert unload(url, "lu-a").status_code == 200
    gone = unload(url, "lu-a")
    assert gone.status_code == 404
    assert gone.json()["error"]["message"] == "The lora adapter 'lu-a' cannot be found."
    ids = {m["id"] for m in httpx.get(url + "/v1/models").json()["data"]}
    assert not ids & {"lu-a", "lu-foreign", "lu-missing"}


def test_unknown_model_and_validation_errors(client: openai.OpenAI, url: str) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        chat(client, "no-such-adapter")
    assert nf.value.body["message"] == "The model `no-such-adapter` does not exist."  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="n=1"):
        chat(client, BASE, n=2)
    for bad in (
        {"model": BASE},  # no messages
        {"model": BASE, "messages": PROMPT, "temperature": 5},
        {"model": BASE, "messages": PROMPT, "max_tokens": 0},
        {"model": BASE, "messages": [{"role": "wizard", "content": "hi"}]},
        {"model": BASE, "messages": PROMPT, "max_tokens": 10**6},
    ):
        r = httpx.post(url + "/v1/chat/completions", json=bad, timeout=30)
        assert r.status_code == 400, (bad, r.text)
        err = r.json()["error"]
        assert err["message"] and err["type"] and err["code"] == 400
    r = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "x"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path"


def test_adapter_changes_output_and_not_the_base(
    client: openai.OpenAI, url: str, adapters: dict[str, Path]
) -> None:
    before = chat(client, BASE)
    assert load(url, "chg-a", adapters["a"]).status_code == 200
    try:
        with_adapter = chat(client, "chg-a")
        assert with_adapter != before
        assert chat(client, BASE) == before
    finally:
        unload(url, "chg-a")


def test_mixed_adapter_batch_equals_each_alone(
    client: openai.OpenAI, url: str, adapters: dict[str, Path]
) -> None:
    assert load(url, "mix-a", adapters["a"]).status_code == 200
    assert load(url, "mix-b", adapters["b"]).status_code == 200
    try:
        models = [BASE, "mix-a", "mix-b", "mix-a"]
        alone = {m: chat(client, m) for m in set(models)}
        assert len(set(alone.values())) == 3  # three different models
        batches = metric(url, "cft_engine_batch_size_count")
        singles = metric(url, 'cft_engine_batch_size_bucket{le="1.0"}')
        with ThreadPoolExecutor(len(models)) as pool:
            together = list(pool.map(lambda m: chat(client, m), models))
        assert together == [alone[m] for m in models]
        new_batches = metric(url, "cft_engine_batch_size_count") - batches
        new_singles = metric(url, 'cft_engine_batch_size_bucket{le="1.0"}') - singles
        # Some decode step carried several requests.
        assert new_batches - new_singles >= 1
        assert metric(url, "cft_engine_generation_tokens_total") > 0
        ttft = metric(url, "cft_engine_time_to_first_token_seconds_count")
        assert ttft >= len(models)
    finally:
        unload(url, "mix-a")
        unload(url, "mix-b")


def test_lru_eviction_reloads_from_path(models_dir: Path, adapters: dict[str, Path]) -> None:
    eng = Engine(BASE, models_dir, max_loras=1, max_cpu_loras=1)
    try:
        with serve_app(create_app(eng), ready_path="/health") as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
            assert load(url, "lru-a", adapters["a"]).status_code == 200
            first_a = chat(client, "lru-a")
            assert load(url, "lru-b", adapters["b"]).status_code == 200
            assert list(eng.adapters.resident) == ["lru-b"]  # a was evicted from memory
            assert metric(url, "cft_engine_adapter_evictions_total") == 1
            assert metric(url, "cft_engine_loaded_adapters") == 2
            ids = {m["id"] for m in httpx.get(url + "/v1/models").json()["data"]}
            assert {"lru-a", "lru-b"} <= ids  # still known, as in vLLM
            assert chat(client, "lru-a") == first_a  # reloaded from its path
            assert list(eng.adapters.resident) == ["lru-a"]
            assert metric(url, "cft_engine_resident_adapters") == 1
    finally:
        eng.close()
