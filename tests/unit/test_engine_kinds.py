"""Engine kinds in CFT_ENGINE_URLS, and how the router names adapters on each kind."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.core.config import Settings
from app.engines.kinds import KINDS, EngineSpec, kind_of, parse_engine_url, parse_engine_urls
from app.engines.state import EngineState


def test_every_kind_has_its_rules() -> None:
    assert [kind_of(k).name for k in KINDS] == ["vllm", "sglang", "lorax", "local", "vllm-lazy"]
    assert [k for k in KINDS if not kind_of(k).loads_adapters] == ["lorax", "vllm-lazy"]
    assert [k for k in KINDS if kind_of(k).vllm_api] == ["vllm", "local", "vllm-lazy"]
    assert kind_of("lorax").probe_path == "/health" and kind_of("sglang").probe_path == "/v1/models"
    assert kind_of("vllm-lazy").probe_path == "/health"
    assert [k for k in KINDS if kind_of(k).unloads_staged] == ["vllm-lazy"]


def test_kinds_are_set_per_url() -> None:
    assert parse_engine_urls("sglang+http://h:30000/, http://vllm:8000,lorax+https://l") == [
        EngineSpec("sglang", "http://h:30000"),
        EngineSpec("vllm", "http://vllm:8000"),
        EngineSpec("lorax", "https://l"),
    ]
    assert parse_engine_url("LOCAL+http://127.0.0.1:8001").kind == "local"
    assert parse_engine_url("vllm-lazy+http://vllm:8000") == EngineSpec(
        "vllm-lazy", "http://vllm:8000"
    )
    engine = EngineState.parse("sglang+http://h:30000")
    assert (engine.kind, engine.url) == ("sglang", "http://h:30000")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("tgi+http://h:80", "unknown engine kind 'tgi'"),
        ("sglang+h:30000", "is not an http(s) URL"),
        ("vllm:8000", "is not an http(s) URL"),
    ],
)
def test_a_bad_entry_is_a_readable_startup_error(raw: str, expected: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(engine_urls=f"http://ok:8000,{raw}")
    message = str(caught.value)
    assert "engine_urls" in message and f"engine {raw!r}" in message and expected in message
    # It says what to write instead.
    assert "sglang+http://sglang:30000" in message


def test_how_each_kind_names_the_adapter() -> None:
    def fields(kind: str, model: str) -> dict[str, str]:
        return kind_of(kind).model_fields(model, base_model="base", adapter_path="/srv/a/ad-1")

    assert fields("vllm", "ad-1") == {"model": "ad-1"} == fields("local", "ad-1")
    assert fields("vllm-lazy", "ad-1") == {"model": "ad-1"}
    assert fields("sglang", "ad-1") == {"model": "base:ad-1"}
    assert fields("sglang", "base") == {"model": "base"}
    assert fields("lorax", "ad-1") == {"model": "/srv/a/ad-1", "adapter_source": "local"}
    assert fields("lorax", "base") == {"model": ""}


def test_which_answers_mean_the_adapter_is_not_there() -> None:
    def adapter_refused(kind: str, status: int, body: bytes) -> bool:
        return kind_of(kind).adapter_refused(status, body)

    assert adapter_refused("vllm", 404, b"") and adapter_refused("lorax", 502, b"")
    assert not adapter_refused("vllm", 400, b"bad temperature")
    # vLLM's resolver found the adapter but the engine refused it (a call's first use).
    found = b"LoRA adapter 'a' was found but could not be loaded."
    assert adapter_refused("vllm-lazy", 400, found) and adapter_refused("vllm", 400, found)
    assert adapter_refused("sglang", 400, b"The following requested LoRA adapters are not loaded")
    assert not adapter_refused("sglang", 400, b"max_tokens must be positive")
    assert adapter_refused("lorax", 424, b'{"error_type": "generation"}')
    assert not adapter_refused("lorax", 422, b"validation")
