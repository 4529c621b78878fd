"""Hyperparameter validation and the per-device speed defaults (no model is loaded)."""

from __future__ import annotations

import logging
import math

import pytest
from pydantic import ValidationError

from app.training.methods import Hyperparameters
from tests.support.training import tiny_llama
from workers.trainer.base_cache import base_fingerprint, restore_dtypes
from workers.trainer.data import TrainingDataError, check_rows
from workers.trainer.plan import MIN_PACK_LENGTH, resolve_hyperparameters, speed_setup


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
    cpu = speed_setup("sft", Hyperparameters(), cuda=False)
    assert (cpu.packing, cpu.padding_free, cpu.liger) == (False, False, False)
    gpu = speed_setup("sft", Hyperparameters(), cuda=True)
    assert (gpu.packing, gpu.padding_free) == (True, True)
    assert speed_setup("dpo", Hyperparameters(), cuda=True).packing is False
    with caplog.at_level(logging.WARNING):
        forced = speed_setup("sft", Hyperparameters(use_liger_kernel=True), cuda=False)
    assert forced.liger is False and "need CUDA" in caplog.text


def test_compiled_layers_for_long_packed_cuda_runs(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.trainer.plan import COMPILE_MIN_STEPS

    long = Hyperparameters(max_steps=COMPILE_MIN_STEPS)
    gpu = speed_setup("sft", long, cuda=True)
    # compiled layers replace Liger's layer kernels (Dynamo cannot trace them)
    assert (gpu.packing, gpu.compile, gpu.liger) == (True, True, False)
    short = speed_setup("sft", Hyperparameters(max_steps=COMPILE_MIN_STEPS - 1), cuda=True)
    assert short.compile is False
    # epochs over the examples: 3 x ceil(n / 16) optimizer steps with the runbook's batch shape
    per_epoch = -(-COMPILE_MIN_STEPS // 3)
    assert speed_setup("sft", Hyperparameters(), cuda=True, n_train=16 * per_epoch).compile
    assert not speed_setup(
        "sft", Hyperparameters(), cuda=True, n_train=16 * (per_epoch - 2)
    ).compile
    assert not speed_setup("sft", Hyperparameters(), cuda=True).compile  # length unknown
    assert not speed_setup("dpo", long, cuda=True).compile  # unpacked: not measured
    assert not speed_setup("sft", long, cuda=False).compile
    assert not speed_setup("sft", Hyperparameters(max_steps=500, packing=False), cuda=True).compile
    # the caller's Liger wins over the default (liger-kernel is not installed on this CPU box)
    with pytest.raises(ValueError, match="liger-kernel is not installed"):
        speed_setup("sft", Hyperparameters(max_steps=500, use_liger_kernel=True), cuda=True)
    off = speed_setup("sft", Hyperparameters(max_steps=500, use_liger_kernel=False), cuda=True)
    assert (off.compile, off.liger) == (True, False)
    asked = speed_setup("dpo", Hyperparameters(compile_layers=True), cuda=True)
    assert (asked.compile, asked.liger) == (True, False)
    with caplog.at_level(logging.WARNING):
        cpu = speed_setup("sft", Hyperparameters(compile_layers=True), cuda=False)
    assert cpu.compile is False and "compiled layers need CUDA" in caplog.text
    with pytest.raises(ValidationError, match="exclude each other"):
        Hyperparameters(compile_layers=True, use_liger_kernel=True)
    # a rank of a DDP / FSDP run (accelerate launch): not by default (measured on one GPU)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert not speed_setup("sft", long, cuda=True).compile
    assert speed_setup("sft", Hyperparameters(compile_layers=True), cuda=True).compile


def test_sft_chats_become_prompt_completion_pairs() -> None:
    chat = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    (row,) = check_rows("sft", [{"messages": chat}], "train")
    assert row == {"prompt": chat[:3], "completion": chat[3:]}
    with pytest.raises(TrainingDataError, match="last message must be the assistant's"):
        check_rows("sft", [{"messages": chat[:3]}], "train")


def _tokenizer():  # type: ignore[no-untyped-def]
    """A real (tiny) fast tokenizer: one token per whitespace-separated word, ChatML template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
        "{% endfor %}"
    )
    return fast


def _sft_rows(lengths: list[int]) -> list[dict[str, object]]:
    chats = [
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": " ".join(["w"] * n)},
            ]
        }
        for n in lengths
    ]
    return check_rows("sft", chats, "train")


def test_packed_rows_follow_the_longest_example_and_keep_the_step_size() -> None:
    tok = _tokenizer()
    # 7 template tokens + n words per chat: longest 1207 -> rows of MIN_PACK_LENGTH (1536).
    rows = _sft_rows([200, 400, 1200])
    hp, speed = resolve_hyperparameters("sft", Hyperparameters(), True, rows, tok)
    assert speed.packing and speed.offload
    mean = (207 + 407 + 1207) / 3
    assert hp.max_length == MIN_PACK_LENGTH == 1536
    assert hp.grad_accum == math.ceil(16 * mean / 1536)
    # A longer example: rows as long as it (a multiple of 64), max_length stays the cap.
    long, _ = resolve_hyperparameters("sft", Hyperparameters(), True, _sft_rows([200, 1700]), tok)
    assert long.max_length == 1728
    short, _ = resolve_hyperparameters("sft", Hyperparameters(), True, _sft_rows([10, 20]), tok)
    assert short.max_length == MIN_PACK_LENGTH and short.grad_accum == 1
    # the resolved settings are written into the run's hyperparameters (the TRL config reads them)
    assert (hp.compile_layers, short.compile_layers) == (False, False)  # 3 examples: a short run
    steps = Hyperparameters(max_steps=400)
    compiled, speed = resolve_hyperparameters("sft", steps, True, rows, tok)
    assert compiled.compile_layers is True and speed.compile and compiled.use_liger_kernel is False
    # batch_size 2: two rows per micro-batch and the tokens of 2 x 16 examples per step.
    two, _ = resolve_hyperparameters("sft", Hyperparameters(batch_size=2), True, rows, tok)
    assert two.grad_accum == math.ceil(2 * 16 * mean / (2 * 1536))
    capped, _ = resolve_hyperparameters(
        "sft", Hyperparameters(max_length=512), True, _sft_rows([900]), tok
    )
    assert capped.max_length == 512 and capped.grad_accum == 16  # 16 x 512-token rows
    # What the caller set wins.
    given, _ = resolve_hyperparameters(
        "sft", Hyperparameters(max_length=832, grad_accum=8), True, rows, tok
    )
    assert (given.max_length, given.grad_accum) == (832, 8)
    # The CPU keeps the plain runbook batches.
    cpu, speed = resolve_hyperparameters("sft", Hyperparameters(), False, rows, tok)
    assert (
        not speed.packing
        and not speed.offload
        and (cpu.max_length, cpu.grad_accum)
        == (
            2048,
            16,
        )
    )


def test_preference_defaults_per_device() -> None:
    tok = _tokenizer()
    pairs = [{"prompt": [], "chosen": [], "rejected": []}] * 64
    hp, speed = resolve_hyperparameters("dpo", Hyperparameters(), True, pairs, tok)
    assert (hp.batch_size, hp.grad_accum) == (2, 8)
    assert speed.offload and speed.precompute and not speed.packing
    # A run shorter than one pass over the pairs keeps the reference forward per step.
    hp, speed = resolve_hyperparameters("dpo", Hyperparameters(max_steps=3), True, pairs, tok)
    assert not speed.precompute
    hp, speed = resolve_hyperparameters("dpo", Hyperparameters(max_steps=4), True, pairs, tok)
    assert speed.precompute  # 4 steps x 16 pairs = the whole set
    hp, _ = resolve_hyperparameters("dpo", Hyperparameters(batch_size=1), True, pairs, tok)
    assert (hp.batch_size, hp.grad_accum) == (1, 16)
    hp, speed = resolve_hyperparameters("dpo", Hyperparameters(), False, pairs, tok)
    assert (hp.batch_size, hp.grad_accum, speed.precompute, speed.offload) == (1, 16, False, False)
    # TRL's KTO needs two examples per micro-batch, on any device.
    hp, _ = resolve_hyperparameters("kto", Hyperparameters(), False, pairs, tok)
    assert (hp.batch_size, hp.grad_accum) == (2, 8)
    with pytest.raises(ValueError, match="kto needs batch_size >= 2"):
        Hyperparameters(batch_size=1).check_method("kto")
    with pytest.raises(ValueError, match="precompute_ref_log_probs is for dpo and kto"):
        Hyperparameters(precompute_ref_log_probs=True).check_method("orpo")
    with pytest.raises(ValueError, match="activation_offloading is for sft, dpo and kto"):
        Hyperparameters(activation_offloading=True).check_method("simpo")


def test_a_trainer_upcast_is_undone_bit_exactly() -> None:
    import torch

    model = tiny_llama(vocab_size=64, kv_heads=1).to(torch.bfloat16)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    before = base_fingerprint(model)
    for p in model.parameters():  # what prepare_model_for_kbit_training does (ORPO, CPO)
        p.data = p.data.to(torch.float32)
    assert base_fingerprint(model) != before
    restore_dtypes(model, dtypes)
    assert base_fingerprint(model) == before
