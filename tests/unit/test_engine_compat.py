"""The engines' adapter contract (app/engines/compat.py) on synthetic PEFT directories.

The artefacts the trainer really produces (all five methods) are checked where they are made:
tests/integration/test_training_methods.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.engines import compat
from app.engines.compat import NotLoadable, check, check_or_raise
from tests.support.engines import write_adapter


def test_a_plain_lora_adapter_passes(tmp_path: Path) -> None:
    report = check(write_adapter(tmp_path / "a", rank=8, modules=("q_proj", "k_proj", "v_proj")))
    assert report.ok, report.problems
    assert report.rank == 8 and report.modules == {"q_proj", "k_proj", "v_proj"}
    # rsLoRA only changes the scale vLLM computes: still loadable.
    assert check(write_adapter(tmp_path / "b", use_rslora=True)).ok
    # So does an init that only set the starting weights.
    assert check(write_adapter(tmp_path / "c", init_lora_weights="gaussian")).ok
    assert check(write_adapter(tmp_path / "d", init_lora_weights=False)).ok


@pytest.mark.parametrize(
    ("over", "expected"),
    [
        ({"use_dora": True}, "vLLM does not yet support DoRA"),
        ({"modules_to_save": ["lm_head"]}, "vLLM only supports modules_to_save being None"),
        ({"bias": "lora_only"}, "Adapter bias is not supported"),
        ({"peft_type": "IA3"}, "only LoRA adapters are served"),
        ({"alpha_pattern": {"q_proj": 32}}, "alpha_pattern is set"),
        ({"lora_bias": True}, "lora_bias is set"),
        ({"init_lora_weights": "pissa"}, "does not support init_lora_weights='pissa'"),
        ({"alora_invocation_tokens": [1, 2]}, "alora_invocation_tokens is set"),
        ({"layer_replication": [[0, 4]]}, "does not support layer_replication"),
    ],
)
def test_config_extras_vllm_refuses_fail(tmp_path: Path, over: dict, expected: str) -> None:
    with pytest.raises(NotLoadable) as caught:
        check_or_raise(write_adapter(tmp_path / "a", **over))
    assert expected in str(caught.value), caught.value.problems


def test_rank_above_the_engines_max_fails(tmp_path: Path) -> None:
    path = write_adapter(tmp_path / "a", rank=32)
    assert check(path, max_lora_rank=32).ok
    problems = check(path, max_lora_rank=16).problems
    assert problems == [
        "LoRA rank 32 is greater than max_lora_rank 16 (raise the engine's --max-lora-rank"
        " or train a smaller rank)"
    ]
    assert "not a vLLM --max-lora-rank value" in check(path, max_lora_rank=24).problems[0]


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["model.layers.0.self_attn.q_proj.weight"], "unsupported LoRA weight"),
        (["layers.0.q_proj.lora_A.weight", "layers.0.q_proj.lora_B.weight"], "start with"),
        (
            ["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"],
            "lora_B.weight is missing",
        ),
        (
            [
                "base_model.model.model.layers.0.mlp.router.lora_A.weight",
                "base_model.model.model.layers.0.mlp.router.lora_B.weight",
            ],
            "but received ['model.layers.0.mlp.router']",
        ),
        (
            [
                "base_model.model.model.embed_tokens.lora_embedding_A",
                "base_model.model.model.embed_tokens.lora_embedding_B",
            ],
            "embedding / lm_head adapters are not served",
        ),
        (["base_model.model.lm_head.base_layer.weight"], "new tokens"),
        (
            ["base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"],
            "unsupported LoRA weight",
        ),
    ],
)
def test_wrong_tensor_names_fail(tmp_path: Path, names: list[str], expected: str) -> None:
    problems = check(write_adapter(tmp_path / "a", names=names)).problems
    assert any(expected in p for p in problems), problems


def test_missing_or_broken_files_fail(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert check(empty).problems == [
        "adapter_config.json is missing",
        "adapter_model.safetensors is missing",
    ]
    path = write_adapter(tmp_path / "a")
    cfg = json.loads((path / "adapter_config.json").read_text())
    del cfg["lora_alpha"]
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    (path / "adapter_model.safetensors").write_bytes(b"\x00" * 4)
    problems = check(path).problems
    assert "adapter_config.json lacks required field(s) lora_alpha" in problems
    assert any("too short to be a safetensors file" in p for p in problems), problems


def test_rank_in_the_weights_must_match_r(tmp_path: Path) -> None:
    path = write_adapter(tmp_path / "a", rank=8)
    cfg = json.loads((path / "adapter_config.json").read_text()) | {"r": 4}
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    assert any("differs from r=4" in p for p in check(path).problems)
    assert compat.DEFAULT_MAX_LORA_RANK == 16  # vllm/config/lora.py
