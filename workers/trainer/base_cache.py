"""The NF4 base a worker process keeps loaded, and the checks that it stays pristine across runs.

The NF4 base is loaded once per process (`BaseCache`, default `BASES`) and reused by every run:
each run's trainer wraps a fresh LoRA around it, and afterwards PEFT's `unload()` removes the
LoRA layers again; a fingerprint of every base tensor (taken at load) is checked after each run,
and a base that changed or still holds adapter layers is dropped and reloaded by the next run.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.trainer.data import TrainingDataError

log = logging.getLogger(__name__)


@dataclass
class LoadedBase:
    """An NF4 base model held by a worker process, with what proves it is still pristine."""

    name: str
    revision: str
    model: Any
    tokenizer: Any
    fingerprint: str
    load_seconds: float
    runs: int = 0
    dtypes: dict[str, Any] = field(default_factory=dict)


def base_fingerprint(model: Any) -> str:
    """sha256 over every tensor of the model's state dict (NF4 bytes, quant states, norms)."""
    import torch

    h = hashlib.sha256()
    for key, value in model.state_dict().items():
        if not isinstance(value, torch.Tensor):
            continue
        h.update(key.encode())
        t = value.detach().contiguous().cpu()
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def checkpointing_off(model: Any) -> None:
    """Turn gradient checkpointing off if a run turned it on."""
    # transformers 5 renamed it activation checkpointing; the old names warn.
    if getattr(model, "is_activation_checkpointing", False):
        model.activation_checkpointing_disable()


def restore_dtypes(model: Any, dtypes: dict[str, Any]) -> None:
    """Cast parameters a trainer upcast back to their loaded dtype (bf16 -> fp32 -> bf16 is exact).

    TRL's ORPO and CPO (SimPO) trainers call prepare_model_for_kbit_training on a 4-bit model,
    which upcasts the shared bf16 base's embeddings, head and norms to fp32.
    """
    for name, param in model.named_parameters():
        want = dtypes.get(name)
        if want is not None and param.dtype != want:
            param.data = param.data.to(want)


def keep_nf4_layout(model: Any) -> None:
    """Keep bitsandbytes from repacking the NF4 weights for CPU inference.

    On a CPU with AVX512-BF16, a Linear4bit in eval mode rewrites its weight and quant state
    into a CPU GEMM layout on its first forward without grad (the in-trainer evaluation does
    that): the packed state no longer matches the fingerprint taken at load, so every run with
    an eval split dropped the shared base and failed. Training never uses that layout.
    """
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def has_adapter_layers(model: Any) -> bool:
    """True while any PEFT tuner layer is left in the model."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(m, BaseTunerLayer) for m in model.modules())


class BaseCache:
    """NF4 bases loaded once per process and reused across runs (one run at a time)."""

    def __init__(self, quant_storage: str | None = None) -> None:
        self._lock = threading.Lock()
        self.current: LoadedBase | None = None
        self.loads = 0
        # "bfloat16" under FSDP: NF4 weights packed in a float dtype so FSDP can shard them.
        self.quant_storage = quant_storage

    def _load(self, name: str, models_dir: Path) -> LoadedBase:
        import torch
        from peft import prepare_model_for_kbit_training

        from workers import base_model as bm

        started = time.monotonic()
        _, revision = bm.resolve(name, models_dir)
        tokenizer = bm.load_tokenizer(name, models_dir)
        if not tokenizer.chat_template:
            raise TrainingDataError(f"base model {name} has no chat template")
        storage = getattr(torch, self.quant_storage) if self.quant_storage else None
        model = bm.load_model(name, models_dir, quantize_4bit=True, quant_storage=storage)
        # Freezes once; each run's trainer turns gradient checkpointing on or off. A bf16 base
        # (CUDA) is only frozen: prepare_model_for_kbit_training would also upcast the embeddings,
        # LM head and norms to fp32 (+0.4 GiB and an fp32 LM head on a 1B model with a 49k
        # vocabulary), which the plain QLoRA recipe does not do and bf16 does not need. On the CPU
        # the base is fp32 already and the call changes nothing else.
        if model.dtype == torch.bfloat16:
            model.requires_grad_(False)
        else:
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        model.config.use_cache = False
        keep_nf4_layout(model)
        self.loads += 1
        loaded = LoadedBase(
            name=name,
            revision=revision,
            model=model,
            tokenizer=tokenizer,
            fingerprint=base_fingerprint(model),
            load_seconds=round(time.monotonic() - started, 3),
            dtypes={n: p.dtype for n, p in model.named_parameters()},
        )
        log.info("loaded base %s (%s) in NF4 in %.1f s", name, revision, loaded.load_seconds)
        return loaded

    @contextmanager
    def lease(self, name: str, models_dir: Path) -> Iterator[LoadedBase]:
        """The base for one run; afterwards check it is unchanged (else drop it)."""
        with self._lock:
            cur = self.current
            if cur is None or cur.name != name:
                self.current = None  # one base per process: free the old one first
                cur = self.current = self._load(name, models_dir)
            try:
                yield cur
            except BaseException:
                cur.runs += 1
                if not self._clean(cur):
                    self.current = None  # keep the run's own error; reload next time
                raise
            cur.runs += 1
            if not self._clean(cur):
                self.current = None
                raise RuntimeError(f"the reused base {name} was modified by a run; dropped it")

    def _clean(self, base: LoadedBase) -> bool:
        """Undo per-run switches, then check the base holds no adapter and the same tensors."""
        model = base.model
        if hasattr(model, "disable_input_require_grads"):
            with suppress(AttributeError, RuntimeError):  # no hook registered this run
                model.disable_input_require_grads()
        checkpointing_off(model)
        restore_dtypes(model, base.dtypes)
        if has_adapter_layers(model) or base_fingerprint(model) != base.fingerprint:
            log.error(
                "base %s changed during a run: dropping it; the next run reloads it", base.name
            )
            return False
        return True

    def drop(self) -> None:
        """Forget the loaded base (the next run loads it again)."""
        with self._lock:
            self.current = None


BASES = BaseCache()
