"""TRL configs and trainers per method, each with a fresh LoRA around the shared base.

SFT, DPO and KTO use TRL's SFTTrainer, DPOTrainer and KTOTrainer; ORPO and SimPO its
experimental ORPOTrainer and CPOTrainer (loss_type="simpo"). DPO and KTO get `ref_model=None`:
with a PEFT model TRL uses the adapter-disabled base as the reference, so no second copy of the
base is held.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.training.methods import Hyperparameters
from workers.trainer.base_cache import LoadedBase, checkpointing_off
from workers.trainer.plan import device_setup, speed_setup

log = logging.getLogger(__name__)

# Vocabulary columns per logit tile of TRL's fused LM head (SFT, DPO, KTO). TRL's 32768 made the
# tile [scored tokens x 32768] bf16, up to 128 MiB at 2048 tokens: the largest transient of a
# 1B QLoRA step. 8192 columns cost a few more, still large GEMMs and leave room for longer
# micro-batches under the same peak (BENCHMARKS.md "QLoRA against Unsloth"). CUDA only: the CPU
# keeps TRL's own.
LM_HEAD_TILE = 8192


def narrow_lm_head_tile(cuda: bool) -> None:
    """Set TRL's fused-LM-head tile width for this process (read by TRL at each forward)."""
    if cuda:
        import trl.trainer.utils as trl_utils

        # A private TRL constant (1.16): if a TRL upgrade drops it, say so instead of silently
        # training with TRL's wider tile (more peak VRAM).
        if not hasattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE"):
            log.warning("TRL has no _CHUNKED_LOGPROB_CHUNK_SIZE: the LM-head tile stays TRL's own")
            return
        trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = LM_HEAD_TILE


class _KeepAllocatorCache:
    """A device module (torch.cuda) whose `empty_cache` does nothing; all else is the module's."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def empty_cache(self) -> None:
        pass


def keep_allocator_cache(trainer: Any) -> None:
    """Stop TRL's activation offloading from emptying the CUDA allocator's cache every micro-batch.

    TRL 1.16's `OffloadActivations.__enter__` (huggingface/trl#5730) clears its own stale
    state and then calls `empty_cache()` whenever bitsandbytes is imported, i.e. in every QLoRA
    micro-batch: each one then gives all cached blocks back to the driver (cudaFree waits for
    the device) and cudaMallocs them again, in a step that is host-bound. Clearing the stale
    state is what frees the leaked tensors; the cache it empties holds only free blocks, which
    the next micro-batch reuses (allocated memory, the peak VRAM cft reports, does not change).
    """
    ctx: Any = getattr(trainer, "maybe_activation_offload_context", None)
    module = getattr(ctx, "device_module", None)
    if module is not None and not isinstance(module, _KeepAllocatorCache):
        ctx.device_module = _KeepAllocatorCache(module)


@contextmanager
def training_attention(packed_on_cuda: bool) -> Iterator[None]:
    """SDPA without its cuDNN backend while a run trains packed rows on CUDA.

    A packed QLoRA SFT step of a 1B model is host-bound (the GPU busy ~10 % of it): on
    padding-free rows of a different length each micro-batch, cuDNN's SDPA spent ~1.6 ms of CPU
    per call, a quarter of the step; PyTorch's memory-efficient kernel takes ~50 us of CPU for
    ~2.5x the GPU time. SFT 3478 -> 4645-5163 tok/s at the same peak VRAM (BENCHMARKS.md "QLoRA
    against Unsloth", round 4). Unpacked runs (DPO, KTO, ORPO, SimPO) keep PyTorch's choice:
    not measured (DPO's forward-only reference pass gives the GPU more of the step). The flags
    are global in PyTorch, so they are restored on exit; a worker trains one run at a time.
    """
    if not packed_on_cuda:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    with sdpa_kernel(backends):
        yield


@contextmanager
def compiled_layers(model: Any, enabled: bool) -> Iterator[None]:
    """Each decoder layer of model under torch.compile (dynamic shapes) while a run trains.

    A packed 1B QLoRA step is host-bound; a compiled layer runs as one graph (the norm, RoPE,
    attention, SwiGLU and the LoRA and NF4 ops of its projections, under gradient checkpointing)
    instead of hundreds of eager op dispatches: SFT 4204-4521 -> 5881-5998 tok/s in one call on an
    H200 (BENCHMARKS.md "QLoRA against Unsloth", round 5). The layers (transformers' gradient
    checkpointing layers) belong to the shared base: their eager call is restored on exit. A speed
    setting must not fail a run: while it trains, a graph the compiler cannot build runs eager
    (Dynamo's suppress_errors, with its error logged) instead of raising.
    """
    if not enabled:
        yield
        return
    import torch._dynamo
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        log.warning("compile_layers: no decoder layers found in %s; training eager", type(model))
    for layer in layers:
        layer.compile(dynamic=True)
    suppress = torch._dynamo.config.suppress_errors
    torch._dynamo.config.suppress_errors = True
    try:
        yield
    finally:
        torch._dynamo.config.suppress_errors = suppress
        for layer in layers:
            # nn.Module.compile keeps the compiled call here; None is the eager call again.
            layer._compiled_call_impl = None


def trl_config(method: str, hp: Hyperparameters, out_dir: Path) -> Any:
    """The TRL config of the method's trainer for one run."""
    cuda, optim, checkpointing = device_setup(hp)
    speed = speed_setup(method, hp, cuda)
    common: dict[str, Any] = {
        "output_dir": str(out_dir / ".checkpoints"),
        "per_device_train_batch_size": hp.batch_size,
        "per_device_eval_batch_size": hp.batch_size,
        "gradient_accumulation_steps": hp.grad_accum,
        "gradient_checkpointing": checkpointing,
        "gradient_checkpointing_kwargs": dict(hp.gradient_checkpointing_kwargs),
        "use_liger_kernel": speed.liger,
        "optim": optim,
        "learning_rate": hp.learning_rate,
        "lr_scheduler_type": hp.lr_scheduler,
        # transformers 5 dropped warmup_ratio: a float below 1 here is a ratio.
        "warmup_steps": hp.warmup,
        "num_train_epochs": hp.epochs,
        "max_steps": hp.max_steps,
        "weight_decay": hp.weight_decay,
        "max_grad_norm": hp.max_grad_norm,
        "bf16": cuda,
        # Under accelerate launch on CPUs this makes the ranks one gloo group (MULTI_CPU).
        "use_cpu": not cuda,
        "seed": hp.seed,
        "data_seed": hp.seed,
        "logging_steps": 1,
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "max_length": hp.max_length,
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": cuda,
        "include_num_input_tokens_seen": "non_padding",
        "remove_unused_columns": False,
    }
    if method == "sft":
        from trl.trainer.sft_config import SFTConfig

        # Prompt-completion rows: completion_only_loss=True masks the prompt out of the loss.
        return SFTConfig(
            **common,
            assistant_only_loss=False,
            completion_only_loss=True,
            packing=speed.packing,
            packing_strategy="bfd",
            padding_free=speed.padding_free,
            activation_offloading=speed.offload,
        )
    reference: dict[str, Any] = {
        "activation_offloading": speed.offload,
        "precompute_ref_log_probs": speed.precompute,
        "precompute_ref_batch_size": hp.precompute_ref_batch_size,
    }
    if method == "dpo":
        from trl.trainer.dpo_config import DPOConfig

        return DPOConfig(**common, **reference, beta=hp.beta)
    if method == "kto":
        from trl.trainer.kto_config import KTOConfig

        return KTOConfig(**common, **reference, beta=hp.beta)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if method == "orpo":
        from trl.experimental.orpo import ORPOConfig

        return ORPOConfig(**common, beta=hp.beta)
    from trl.experimental.cpo import CPOConfig

    return CPOConfig(
        **common, beta=hp.beta, loss_type="simpo", cpo_alpha=0.0, simpo_gamma=hp.simpo_gamma
    )


def trainer_class(method: str) -> Any:
    """The TRL trainer class of the method (SimPO: CPOTrainer)."""
    if method == "sft":
        from trl.trainer.sft_trainer import SFTTrainer

        return SFTTrainer
    if method == "dpo":
        from trl.trainer.dpo_trainer import DPOTrainer

        return DPOTrainer
    if method == "kto":
        from trl.trainer.kto_trainer import KTOTrainer

        return KTOTrainer
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if method == "orpo":
        from trl.experimental.orpo import ORPOTrainer

        return ORPOTrainer
    from trl.experimental.cpo import CPOTrainer

    return CPOTrainer


@contextmanager
def build_trainer(
    method: str,
    train_rows: list[dict[str, Any]],
    eval_rows: list[dict[str, Any]],
    out_dir: Path,
    hp: Hyperparameters,
    base: LoadedBase,
    callbacks: list[Any] | None = None,
) -> Iterator[Any]:
    """A TRL trainer with a fresh LoRA around the shared base; the LoRA is unloaded on exit."""
    from datasets import Dataset
    from peft import LoraConfig

    cuda, _, checkpointing = device_setup(hp)
    narrow_lm_head_tile(cuda)
    model = base.model
    if not checkpointing:
        checkpointing_off(model)  # a previous run on this base may have turned it on
    lora = LoraConfig(
        r=hp.rank,
        lora_alpha=hp.alpha,
        lora_dropout=hp.dropout,
        bias="none",
        task_type="CAUSAL_LM",
        target_modules=list(hp.target_modules),
    )
    config = trl_config(method, hp, out_dir)
    kwargs: dict[str, Any] = {
        "model": model,
        "args": config,
        "train_dataset": Dataset.from_list(train_rows),
        "eval_dataset": Dataset.from_list(eval_rows) if eval_rows else None,
        "processing_class": base.tokenizer,
        "peft_config": lora,
        "callbacks": callbacks or [],
    }
    if method in ("dpo", "kto"):
        kwargs["ref_model"] = None  # the adapter-disabled model is the reference
    trainer = None
    try:
        trainer = trainer_class(method)(**kwargs)
        keep_allocator_cache(trainer)
        with (
            training_attention(cuda and bool(hp.packing)),
            compiled_layers(trainer.model, cuda and bool(hp.compile_layers)),
        ):
            yield trainer
    finally:
        _unwrap(trainer.model if trainer is not None else None, base)


def _unwrap(peft_model: Any, base: LoadedBase) -> None:
    """Remove this run's LoRA layers from the shared base (PEFT unload, no merge)."""
    if peft_model is not None and hasattr(peft_model, "unload"):
        restored = peft_model.unload()
        if restored is not base.model:
            log.warning("PEFT unload returned another module than the shared base")
    for attr in ("peft_config", "_hf_peft_config_loaded"):
        if attr in vars(base.model):
            delattr(base.model, attr)
