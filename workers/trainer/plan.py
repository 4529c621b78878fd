"""The plan of one run: device, optimizer and speed settings, and the batch shape it trains with."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any

from app.training.methods import Hyperparameters

log = logging.getLogger(__name__)


def device_setup(hp: Hyperparameters) -> tuple[bool, str, bool]:
    """(CUDA available, optimizer, gradient checkpointing) for this machine."""
    import torch

    cuda = torch.cuda.is_available()
    optim = hp.optim or ("paged_adamw_8bit" if cuda else "adamw_torch")
    checkpointing = cuda if hp.gradient_checkpointing is None else hp.gradient_checkpointing
    return cuda, optim, checkpointing


@dataclass(frozen=True)
class SpeedSetup:
    """Packing, padding-free batching and Liger kernels as resolved for one run."""

    packing: bool
    padding_free: bool
    liger: bool
    offload: bool = False
    precompute: bool = False
    compile: bool = False


# Packed CUDA SFT runs of at least this many optimizer steps compile their decoder layers by
# default: compiling costs ~40-60 s and saves ~0.4-0.5 s per step of ~7,400 tokens of a 1B model
# (1.30-1.43x the tokens/s; BENCHMARKS.md "QLoRA against Unsloth", round 5), so it pays back after
# ~80-120 steps; shorter runs keep eager layers with Liger's kernels.
COMPILE_MIN_STEPS = 200


def planned_steps(hp: Hyperparameters, n_train: int | None) -> int | None:
    """Optimizer steps the run will take (max_steps, else epochs over n_train), None if unknown.

    Counted in examples before packing: an unset grad_accum of a packed run is scaled to keep a
    step at about batch_size x grad_accum examples' tokens, so the count holds for packed runs too.
    """
    if hp.max_steps > 0:
        return hp.max_steps
    if n_train is None:
        return None
    return math.ceil(hp.epochs * math.ceil(n_train / (hp.batch_size * hp.grad_accum)))


def speed_setup(
    method: str, hp: Hyperparameters, cuda: bool, n_train: int | None = None
) -> SpeedSetup:
    """Resolve the speed settings: measured defaults on CUDA, plain batches on the CPU.

    CUDA defaults (BENCHMARKS.md "QLoRA on GPU (issue 5)"): SFT packs (BFD, padding-free); SFT and
    DPO use Liger's layer kernels and activation offloading; DPO precomputes the reference
    log-probs when the run covers the training set at least once (n_train examples); packed SFT
    runs of COMPILE_MIN_STEPS or more compile their decoder layers instead of using Liger's.
    """
    import importlib.util

    hp.check_method(method)
    packing = (method == "sft" and cuda) if hp.packing is None else hp.packing
    padding_free = packing if hp.padding_free is None else hp.padding_free
    compiled = hp.compile_layers
    if compiled is None:
        steps = planned_steps(hp, n_train)
        compiled = (
            cuda
            and packing
            and hp.use_liger_kernel is not True
            and steps is not None
            and steps >= COMPILE_MIN_STEPS
            # measured on one GPU; under DDP/FSDP (accelerate launch sets WORLD_SIZE) not yet
            and int(os.environ.get("WORLD_SIZE", "1")) == 1
        )
    elif compiled and not cuda:
        log.warning("compile_layers=true ignored: compiled layers need CUDA (this run is on CPU)")
        compiled = False
    liger = hp.use_liger_kernel
    if liger is None:
        liger = (
            cuda
            and not compiled
            and method in ("sft", "dpo")
            and bool(importlib.util.find_spec("liger_kernel"))
        )
    elif liger and not cuda:
        log.warning("use_liger_kernel=true ignored: Liger kernels need CUDA (this run is on CPU)")
        liger = False
    elif liger and not importlib.util.find_spec("liger_kernel"):
        raise ValueError("use_liger_kernel=true but liger-kernel is not installed on this worker")
    offload = hp.activation_offloading
    if offload is None:
        offload = cuda and method in ("sft", "dpo")
    elif offload and not cuda:
        log.warning("activation_offloading=true ignored: it moves CUDA activations (run is on CPU)")
        offload = False
    precompute = hp.precompute_ref_log_probs
    if precompute is None:
        # One reference forward per pair, done once: it pays off from the first full epoch on.
        per_step = hp.batch_size * hp.grad_accum
        covers_epoch = hp.max_steps < 0 or (
            n_train is not None and hp.max_steps * per_step >= n_train
        )
        precompute = cuda and method == "dpo" and covers_epoch
    return SpeedSetup(
        packing, padding_free, liger, offload=offload, precompute=precompute, compile=compiled
    )


# The shortest packed SFT row on CUDA. Rows follow the data (as long as the longest example, up to
# max_length) so peak memory follows it as the plain QLoRA recipe's does (batch 1 x grad-accum 16
# of unpacked rows, bench/gpu_qlora.py's RUNBOOK), with this floor: fewer, longer micro-batches
# train faster at this size (BENCHMARKS.md "QLoRA on GPU (issue 5)": 1536-token rows 3896 tok/s vs
# 1024-token rows 3149, 2048 no faster at 3937), and 2048-token rows went 2.4 % over that recipe's
# peak VRAM (BENCHMARKS.md "QLoRA against Unsloth").
MIN_PACK_LENGTH = 1536


def _token_lengths(rows: list[dict[str, Any]], tokenizer: Any) -> list[int]:
    """Tokens of each prompt-completion row as the chat template renders it."""
    texts = [
        tokenizer.apply_chat_template(r["prompt"] + r["completion"], tokenize=False) for r in rows
    ]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def resolve_hyperparameters(
    method: str, hp: Hyperparameters, cuda: bool, rows: list[dict[str, Any]], tokenizer: Any
) -> tuple[Hyperparameters, SpeedSetup]:
    """The settings a run trains with: what the caller set, else the measured CUDA defaults.

    Packed SFT rows are as long as the longest example (at least MIN_PACK_LENGTH tokens, at most
    max_length) unless max_length was given; grad_accum, unless given, keeps an optimizer step at
    about the tokens of `batch_size x grad_accum` examples. DPO on CUDA with batch_size and
    grad_accum left unset runs 2 pairs per micro-batch and half the accumulation (the same pairs
    per step); KTO with batch_size unset runs 2 examples per micro-batch (TRL's KTO needs 2 or
    more).
    """
    speed = speed_setup(method, hp, cuda, n_train=len(rows))
    given = hp.model_fields_set
    update: dict[str, Any] = {
        "packing": speed.packing,
        "padding_free": speed.padding_free,
        "use_liger_kernel": speed.liger,
        "activation_offloading": speed.offload,
        "precompute_ref_log_probs": speed.precompute,
        "compile_layers": speed.compile,
    }
    if speed.packing and rows:
        lengths = [min(n, hp.max_length) for n in _token_lengths(rows, tokenizer)]
        row = hp.max_length
        if "max_length" not in given:
            row = min(hp.max_length, max(MIN_PACK_LENGTH, -(-max(lengths) // 64) * 64))
            update["max_length"] = row
        if "grad_accum" not in given:
            tokens_per_step = hp.grad_accum * hp.batch_size * sum(lengths) / len(lengths)
            update["grad_accum"] = max(1, math.ceil(tokens_per_step / (row * hp.batch_size)))
    elif (
        method == "dpo"
        and cuda
        and not given & {"batch_size", "grad_accum"}
        and hp.grad_accum % 2 == 0
    ):
        update["batch_size"], update["grad_accum"] = hp.batch_size * 2, hp.grad_accum // 2
    elif method == "kto" and "batch_size" not in given and hp.batch_size < 2:
        # TRL's KTO estimates its KL term across the micro-batch and refuses one example.
        update["batch_size"] = 2
        if "grad_accum" not in given:
            update["grad_accum"] = max(1, hp.grad_accum // 2)
    return hp.model_copy(update=update), speed
