"""QLoRA training of one adapter: JSONL files in, an adapter directory out (no queue imports).

One code path for every method and device: the base is loaded in NF4 with double quantisation
(bitsandbytes quantises on the CPU too), prepared for k-bit training, and a PEFT LoRA adapter is
trained by TRL's SFTTrainer, DPOTrainer, KTOTrainer, ORPOTrainer or CPOTrainer (SimPO). DPO and
KTO get `ref_model=None`: with a PEFT model TRL uses the adapter-disabled base as the
reference, so no second copy of the base is held. The tokenizer (and its chat template) is the
base's own, the one the engine serves with.

The NF4 base is loaded once per process (`BaseCache`, default `BASES`) and reused by every run:
each run's trainer wraps a fresh LoRA around it, and afterwards PEFT's `unload()` removes the
LoRA layers again; a fingerprint of every base tensor (taken at load) is checked after each run,
and a base that changed or still holds adapter layers is dropped and reloaded by the next run.

SFT trains on the answer only: `{"messages": [...]}` becomes TRL's conversational
prompt-completion format (prompt = every turn before the last, completion = the last assistant
turn), which SFTTrainer trains with completion-only loss. (`assistant_only_loss` would need
`{% generation %}` markers, which SmolLM2's ChatML template lacks.)
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workers.trainer.hyperparams import METHODS, Hyperparameters

log = logging.getLogger(__name__)

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Progress:
    """Where a training run is: optimizer step, total steps, last loss, seconds left."""

    step: int
    total: int
    loss: float | None
    eta_s: float | None
    tokens_per_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON form stored in train.training_run.progress."""
        return asdict(self)


@dataclass
class TrainResult:
    """What train_adapter produced."""

    out_dir: Path
    manifest: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)


class TrainingCancelled(Exception):
    """The progress callback asked training to stop."""


class TrainingDataError(ValueError):
    """The examples do not fit the method's format."""


# Returning True from the callback asks training to stop (raises TrainingCancelled).
ProgressCallback = Callable[[Progress], bool | None]


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_jsonl(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.exists():
        return []
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise TrainingDataError(f"{path.name} line {n}: not JSON ({exc})") from exc
    return rows


_KEYS = {
    "sft": ("messages",),
    "dpo": ("prompt", "chosen", "rejected"),
    "orpo": ("prompt", "chosen", "rejected"),
    "simpo": ("prompt", "chosen", "rejected"),
    "kto": ("prompt", "completion", "label"),
}


def _check_rows(method: str, rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    keys = _KEYS[method]
    out = []
    for n, row in enumerate(rows, 1):
        missing = [k for k in keys if k not in row]
        if missing:
            raise TrainingDataError(
                f"{name} example {n} lacks {', '.join(missing)} for method {method}"
                f" (expected keys: {', '.join(keys)})"
            )
        out.append({k: row[k] for k in keys})
    if method == "kto" and rows and len({bool(r["label"]) for r in out}) < 2:
        log.warning("kto: every example has the same label; TRL needs both to weigh them")
    if method == "sft":
        out = [_prompt_completion(r["messages"], n, name) for n, r in enumerate(out, 1)]
    return out


def _prompt_completion(messages: Any, n: int, name: str) -> dict[str, Any]:
    """A chat as TRL's prompt-completion pair, so that only the last answer is trained on."""
    if (
        not isinstance(messages, list)
        or len(messages) < 2
        or not all(isinstance(m, dict) for m in messages)
    ):
        raise TrainingDataError(f"{name} example {n}: messages must be a list of 2+ turns")
    if messages[-1].get("role") != "assistant":
        raise TrainingDataError(f"{name} example {n}: the last message must be the assistant's")
    return {"prompt": messages[:-1], "completion": messages[-1:]}


def _device_setup(hp: Hyperparameters) -> tuple[bool, str, bool]:
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


def _speed_setup(method: str, hp: Hyperparameters, cuda: bool) -> SpeedSetup:
    """Resolve the speed settings: measured defaults on CUDA, plain batches on the CPU."""
    import importlib.util

    hp.check_method(method)
    packing = (method == "sft" and cuda) if hp.packing is None else hp.packing
    padding_free = packing if hp.padding_free is None else hp.padding_free
    liger = hp.use_liger_kernel
    if liger is None:
        liger = cuda and method in ("sft", "dpo") and bool(importlib.util.find_spec("liger_kernel"))
    elif liger and not cuda:
        log.warning("use_liger_kernel=true ignored: Liger kernels need CUDA (this run is on CPU)")
        liger = False
    elif liger and not importlib.util.find_spec("liger_kernel"):
        raise ValueError("use_liger_kernel=true but liger-kernel is not installed on this worker")
    return SpeedSetup(packing=packing, padding_free=padding_free, liger=liger)


def _config(method: str, hp: Hyperparameters, out_dir: Path, has_eval: bool) -> Any:
    cuda, optim, checkpointing = _device_setup(hp)
    speed = _speed_setup(method, hp, cuda)
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
        )
    if method == "dpo":
        from trl.trainer.dpo_config import DPOConfig

        return DPOConfig(**common, beta=hp.beta)
    if method == "kto":
        from trl.trainer.kto_config import KTOConfig

        return KTOConfig(**common, beta=hp.beta)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if method == "orpo":
        from trl.experimental.orpo import ORPOConfig

        return ORPOConfig(**common, beta=hp.beta)
    from trl.experimental.cpo import CPOConfig

    return CPOConfig(
        **common, beta=hp.beta, loss_type="simpo", cpo_alpha=0.0, simpo_gamma=hp.simpo_gamma
    )


def _trainer_class(method: str) -> Any:
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


def _progress_callback(cb: ProgressCallback | None) -> Any:
    from transformers import TrainerCallback

    class _Cb(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.start = time.monotonic()
            self.loss: float | None = None
            self.cancelled = False

        def _report(self, state: Any, control: Any) -> Any:
            step, total = int(state.global_step), int(state.max_steps or 0)
            elapsed = time.monotonic() - self.start
            eta = elapsed / step * max(total - step, 0) if step else None
            tokens = getattr(state, "num_input_tokens_seen", 0) or 0
            tps = tokens / elapsed if elapsed > 0 and tokens else None
            if step:
                log.info(
                    "step %d/%d loss %s eta %s tokens/s %s",
                    step,
                    total,
                    f"{self.loss:.4f}" if self.loss is not None else "-",
                    f"{eta:.0f}s" if eta is not None else "-",
                    f"{tps:.0f}" if tps is not None else "-",
                )
            if cb is not None and cb(Progress(step, total, self.loss, eta, tps)):
                self.cancelled = True
                control.should_training_stop = True
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> Any:
            if logs and "loss" in logs and math.isfinite(float(logs["loss"])):
                self.loss = float(logs["loss"])
            return self._report(state, control)

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            self.start = time.monotonic()
            return self._report(state, control)

    return _Cb()


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


def _checkpointing_off(model: Any) -> None:
    # transformers 5 renamed it activation checkpointing; the old names warn.
    if getattr(model, "is_activation_checkpointing", False):
        model.activation_checkpointing_disable()


def _has_adapter_layers(model: Any) -> bool:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(m, BaseTunerLayer) for m in model.modules())


class BaseCache:
    """NF4 bases loaded once per process and reused across runs (one run at a time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current: LoadedBase | None = None
        self.loads = 0

    def _load(self, name: str, models_dir: Path) -> LoadedBase:
        from peft import prepare_model_for_kbit_training

        from workers import base_model as bm

        started = time.monotonic()
        _, revision = bm.resolve(name, models_dir)
        tokenizer = bm.load_tokenizer(name, models_dir)
        if not tokenizer.chat_template:
            raise TrainingDataError(f"base model {name} has no chat template")
        model = bm.load_model(name, models_dir, quantize_4bit=True)
        # Casts and freezes once; each run's trainer turns gradient checkpointing on or off.
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        model.config.use_cache = False
        self.loads += 1
        loaded = LoadedBase(
            name=name,
            revision=revision,
            model=model,
            tokenizer=tokenizer,
            fingerprint=base_fingerprint(model),
            load_seconds=round(time.monotonic() - started, 3),
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
        _checkpointing_off(model)
        if _has_adapter_layers(model) or base_fingerprint(model) != base.fingerprint:
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

    _, _, checkpointing = _device_setup(hp)
    model = base.model
    if not checkpointing:
        _checkpointing_off(model)  # a previous run on this base may have turned it on
    lora = LoraConfig(
        r=hp.rank,
        lora_alpha=hp.alpha,
        lora_dropout=hp.dropout,
        bias="none",
        task_type="CAUSAL_LM",
        target_modules=list(hp.target_modules),
    )
    config = _config(method, hp, out_dir, bool(eval_rows))
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
        trainer = _trainer_class(method)(**kwargs)
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


def train_adapter(
    method: str,
    train_path: Path,
    eval_path: Path | None,
    out_dir: Path,
    *,
    base_model: str,
    models_dir: Path,
    params: Hyperparameters | dict[str, Any] | None = None,
    progress_cb: ProgressCallback | None = None,
    provenance: dict[str, Any] | None = None,
    bases: BaseCache | None = None,
) -> TrainResult:
    """Train one QLoRA adapter from JSONL examples; write adapter files + manifest to out_dir."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    hp = params if isinstance(params, Hyperparameters) else Hyperparameters(**(params or {}))
    hp.check_method(method)
    train_rows = _check_rows(method, _read_jsonl(train_path), "train")
    eval_rows = _check_rows(method, _read_jsonl(eval_path), "eval")
    if not train_rows:
        raise TrainingDataError(f"no training examples in {train_path}")

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from transformers import set_seed

    set_seed(hp.seed)
    cuda, optim, checkpointing = _device_setup(hp)
    speed = _speed_setup(method, hp, cuda)
    log.info(
        "training %s on %s: device=%s optimizer=%s%s gradient_checkpointing=%s packing=%s"
        " padding_free=%s liger=%s",
        method,
        base_model,
        "cuda" if cuda else "cpu",
        optim,
        "" if cuda or hp.optim else " (paged 8-bit AdamW needs CUDA)",
        checkpointing,
        speed.packing,
        speed.padding_free,
        speed.liger,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    callback = _progress_callback(progress_cb)
    with (
        (bases or BASES).lease(base_model, models_dir) as base,
        build_trainer(method, train_rows, eval_rows, out_dir, hp, base, [callback]) as trainer,
    ):
        revision, tokenizer = base.revision, base.tokenizer
        started = time.monotonic()
        output = trainer.train()
        elapsed = time.monotonic() - started
        if callback.cancelled:
            raise TrainingCancelled(f"cancelled at step {trainer.state.global_step}")
        tokens = int(getattr(trainer.state, "num_input_tokens_seen", 0) or 0)
        metrics: dict[str, Any] = {
            "train_loss": float(output.training_loss),
            "steps": int(trainer.state.global_step),
            "train_seconds": round(elapsed, 3),
            "train_tokens": tokens,
            "tokens_per_s": round(tokens / elapsed, 2) if elapsed > 0 and tokens else None,
            "n_train": len(train_rows),
            "n_eval": len(eval_rows),
            "device": "cuda" if cuda else "cpu",
            "optimizer": optim,
            "packing": speed.packing,
            "liger": speed.liger,
            "base_reused": base.runs > 0,
        }
        if eval_rows:
            with torch.no_grad():
                ev = trainer.evaluate()
            metrics.update({k: float(v) for k, v in ev.items() if isinstance(v, int | float)})
        trainer.model.save_pretrained(str(out_dir), safe_serialization=True)
    for name in ADAPTER_FILES:
        if not (out_dir / name).exists():
            raise RuntimeError(f"training finished but {name} was not written to {out_dir}")
    manifest = {
        "format": "cft-adapter/1",
        "base_model": base_model,
        "base_revision": revision,
        "method": method,
        "snapshot_id": (provenance or {}).get("snapshot_id"),
        "set_hash": (provenance or {}).get("set_hash"),
        "training_run_id": (provenance or {}).get("training_run_id"),
        "hyperparameters": hp.model_dump(),
        "metrics": metrics,
        "chat_template_sha256": hashlib.sha256(str(tokenizer.chat_template).encode()).hexdigest(),
        "files": {
            name: {
                "sha256": sha256_file(out_dir / name),
                "size_bytes": (out_dir / name).stat().st_size,
            }
            for name in ADAPTER_FILES
        },
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    _remove_tree(out_dir / ".checkpoints")
    log.info("trained %s adapter in %.1f s: %s", method, elapsed, metrics)
    return TrainResult(out_dir=out_dir, manifest=manifest, metrics=metrics)


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
