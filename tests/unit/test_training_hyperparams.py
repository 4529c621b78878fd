"""Hyperparameter validation and the per-device speed defaults (no model is loaded)."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from workers.trainer.hyperparams import Hyperparameters
from workers.trainer.train import TrainingDataError, _check_rows, _speed_setup


def test_runbook_defaults_and_non_reentrant_checkpointing() -> None:
    hp = Hyperparameters()
    assert (hp.rank, hp.alpha, hp.grad_accum, hp.max_length) == (8, 16, 16, 2048)
    assert hp.gradient_checkpointing_kwargs == {"use_reentrant": False}
    assert Hyperparameters(
        gradient_checkpointing_kwargs={"preserve_rng_state": False}
    ).gradient_checkpointing_kwargs == {"use_reentrant": False, "preserve_rng_state": False}
    with pytest.raises(ValidationError, match="unknown gradient_checkpointing_kwargs"):
        Hyperparameters(gradient_checkpointing_kwargs={"bogus": True})


def test_speed_settings_are_validated_per_method() -> None:
    with pytest.raises(ValidationError, match="padding_free needs packing"):
        Hyperparameters(packing=False, padding_free=True)
    with pytest.raises(ValidationError, match="always padding-free"):
        Hyperparameters(packing=True, padding_free=False)
    Hyperparameters(packing=True).check_method("sft")
    with pytest.raises(ValueError, match="packing is for sft only"):
        Hyperparameters(packing=True).check_method("dpo")
    with pytest.raises(ValueError, match="DPOTrainer disables it"):
        Hyperparameters(padding_free=True).check_method("dpo")


def test_speed_defaults_per_device(caplog: pytest.LogCaptureFixture) -> None:
    cpu = _speed_setup("sft", Hyperparameters(), cuda=False)
    assert (cpu.packing, cpu.padding_free, cpu.liger) == (False, False, False)
    gpu = _speed_setup("sft", Hyperparameters(), cuda=True)
    assert (gpu.packing, gpu.padding_free) == (True, True)
    assert _speed_setup("dpo", Hyperparameters(), cuda=True).packing is False
    with caplog.at_level(logging.WARNING):
        forced = _speed_setup("sft", Hyperparameters(use_liger_kernel=True), cuda=False)
    assert forced.liger is False and "need CUDA" in caplog.text


def test_sft_chats_become_prompt_completion_pairs() -> None:
    chat = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    (row,) = _check_rows("sft", [{"messages": chat}], "train")
    assert row == {"prompt": chat[:3], "completion": chat[3:]}
    with pytest.raises(TrainingDataError, match="last message must be the assistant's"):
        _check_rows("sft", [{"messages": chat[:3]}], "train")
