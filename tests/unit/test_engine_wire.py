"""The local engine's wire format, byte for byte, over a stub engine (no model).

Clients and the cft router parse these as vLLM's answers: whole responses, streamed chunks (with
`"usage": null` only when a usage chunk was asked for), the usage chunk, and errors mid-stream.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from fastapi.testclient import TestClient

from cft.engine.metrics import EngineMetrics
from cft.engine.request import EngineError, GenRequest
from cft.engine.server import create_app

DONE = {"finish_reason": "length", "completion_tokens": 2}


class StubEngine:
    """What the HTTP layer uses of an engine; each request gets the events in `script`."""

    def __init__(self) -> None:
        self.metrics = EngineMetrics()
        self.model = SimpleNamespace(
            name="base",
            path="/models/base",
            max_model_len=2048,
            chat_prompt_ids=lambda messages: [1, 2, 3],
            text_prompt_ids=lambda prompt: [1, 2],
        )
        self.adapters = SimpleNamespace(by_name={})
        self.default_max_tokens = 16
        self.script: list[tuple[str, Any]] = [("delta", "Hé"), ("delta", "!"), ("done", DONE)]
        self.submitted: list[GenRequest] = []

    def model_exists(self, name: str) -> bool:
        return name == "base"

    def submit(self, req: GenRequest) -> None:
        self.submitted.append(req)
        for kind, payload in self.script:
            req.emit(kind, payload)
        req.finish_reason = "length"


@pytest.fixture
def stub() -> StubEngine:
    return StubEngine()


@pytest.fixture
def client(stub: StubEngine) -> Any:
    fixed_id = mock.patch("uuid.uuid4", return_value=SimpleNamespace(hex="0" * 31 + "7"))
    fixed_time = mock.patch("time.time", return_value=1700000000.5)
    with fixed_id, fixed_time, TestClient(create_app(stub)) as c:  # type: ignore[arg-type]
        yield c


def events(obj: str, choices: list[str], usage: str | None, stream_usage: bool) -> str:
    """The expected SSE body: one chunk per choice, then the usage chunk, then [DONE]."""
    rid = ("chatcmpl-" if obj.startswith("chat") else "cmpl-") + "0" * 31 + "7"
    head = f'data: {{"id": "{rid}", "object": "{obj}", "created": 1700000000, "model": "base", '
    tail = ', "usage": null}' if stream_usage else "}"
    out = [f'{head}"choices": [{c}]{tail}\n\n' for c in choices]
    if usage is not None:
        out.append(f'{head}"choices": [], "usage": {usage}}}\n\n')
    return "".join(out) + "data: [DONE]\n\n"


def test_whole_chat_and_completion(client: Any) -> None:
    r = client.post("/v1/chat/completions", json={"model": "base", "messages": [{"role": "user"}]})
    assert r.content.decode() == (
        '{"id":"chatcmpl-00000000000000000000000000000007","object":"chat.completion",'
        '"created":1700000000,"model":"base","choices":[{"index":0,"logprobs":null,'
        '"finish_reason":"length","stop_reason":null,"message":{"role":"assistant",'
        '"content":"Hé!","tool_calls":[]}}],'
        '"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'
    )
    r = client.post("/v1/completions", json={"model": "base", "prompt": "x"})
    assert r.content.decode() == (
        '{"id":"cmpl-00000000000000000000000000000007","object":"text_completion",'
        '"created":1700000000,"model":"base","choices":[{"index":0,"logprobs":null,'
        '"finish_reason":"length","stop_reason":null,"text":"Hé!"}],'
        '"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}'
    )


@pytest.mark.parametrize("stream_usage", [False, True])
def test_streamed_chat(client: Any, stream_usage: bool) -> None:
    body = {"model": "base", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    body["stream_options"] = {"include_usage": stream_usage}
    r = client.post("/v1/chat/completions", json=body)
    assert r.headers["content-type"].startswith("text/event-stream")
    choice = '{"index": 0, "logprobs": null, "finish_reason": %s, "delta": %s}'
    assert r.content.decode() == events(
        "chat.completion.chunk",
        [
            choice % ("null", '{"role": "assistant", "content": ""}'),
            choice % ("null", '{"content": "H\\u00e9"}'),
            choice % ("null", '{"content": "!"}'),
            choice % ('"length"', "{}"),
        ],
        '{"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}' if stream_usage else None,
        stream_usage,
    )


@pytest.mark.parametrize("stream_usage", [False, True])
def test_streamed_completion(client: Any, stream_usage: bool) -> None:
    body = {"model": "base", "prompt": "x", "stream": True}
    body["stream_options"] = {"include_usage": stream_usage}
    r = client.post("/v1/completions", json=body)
    choice = '{"index": 0, "logprobs": null, "finish_reason": %s, "text": "%s"}'
    assert r.content.decode() == events(
        "text_completion",
        [choice % ("null", "H\\u00e9"), choice % ("null", "!"), choice % ('"length"', "")],
        '{"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}' if stream_usage else None,
        stream_usage,
    )


def test_error_mid_stream_is_an_error_event_then_done(client: Any, stub: StubEngine) -> None:
    stub.script = [("delta", "Hi"), ("error", EngineError("generation failed: x", status=500))]
    r = client.post("/v1/completions", json={"model": "base", "prompt": "x", "stream": True})
    chunks = r.content.decode().split("\n\n")
    assert json.loads(chunks[1].removeprefix("data: ")) == {
        "error": {
            "message": "generation failed: x",
            "type": "BadRequestError",
            "param": None,
            "code": 500,
        }
    }
    assert chunks[2:] == ["data: [DONE]", ""]
    r = client.post("/v1/completions", json={"model": "base", "prompt": "x"})
    assert r.status_code == 500
    assert r.content == (
        b'{"error":{"message":"generation failed: x","type":"BadRequestError","param":null,'
        b'"code":500}}'
    )


def test_sampling_from_the_body(client: Any, stub: StubEngine) -> None:
    body = {"model": "base", "prompt": "x", "temperature": 0, "seed": 3, "stop": ["a", ""]}
    client.post("/v1/completions", json=body)
    client.post("/v1/chat/completions", json={"model": "base", "messages": [{"role": "user"}],
                                              "max_tokens": 4, "max_completion_tokens": 5})  # fmt: skip
    completion, chat = (r.sampling for r in stub.submitted)
    assert (completion.max_tokens, completion.temperature, completion.top_p) == (16, 0, 1.0)
    assert (completion.seed, completion.stop) == (3, ["a"])
    assert (chat.max_tokens, chat.temperature, chat.seed, chat.stop) == (5, 1.0, None, [])
