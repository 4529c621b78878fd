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

from app.training.methods import METHODS, Hyperparameters

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
    offload: bool = False
    precompute: bool = False


def _speed_setup(
    method: str, hp: Hyperparameters, cuda: bool, n_train: int | None = None
) -> SpeedSetup:
    """Resolve the speed settings: measured defaults on CUDA, plain batches on the CPU.

    CUDA defaults (BENCHMARKS.md "QLoRA on GPU (issue 5)"): SFT packs (BFD, padding-free); SFT and
    DPO use Liger's layer kernels and activation offloading; DPO precomputes the reference
    log-probs when the run covers the training set at least once (n_train examples).
    """
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
    return SpeedSetup(packing, padding_free, liger, offload=offload, precompute=precompute)


MIN_PACK_LENGTH = 1024


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
    max_length) unless max_length was given, so peak memory follows the data as it does unpacked;
    grad_accum, unless given, keeps an optimizer step at about the tokens of `batch_size x
    grad_accum` examples. DPO on CUDA with batch_size and grad_accum left unset runs 2 pairs per
    micro-batch and half the accumulation (the same pairs per step); KTO with batch_size unset
    runs 2 examples per micro-batch (TRL's KTO needs 2 or more).
    """
    speed = _speed_setup(method, hp, cuda, n_train=len(rows))
    given = hp.model_fields_set
    update: dict[str, Any] = {
        "packing": speed.packing,
        "padding_free": speed.padding_free,
        "use_liger_kernel": speed.liger,
        "activation_offloading": speed.offload,
        "precompute_ref_log_probs": speed.precompute,
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


def _checkpointing_off(model: Any) -> None:
    # transformers 5 renamed it activation checkpointing; the old names warn.
    if getattr(model, "is_activation_checkpointing", False):
        model.activation_checkpointing_disable()


def _restore_dtypes(model: Any, dtypes: dict[str, Any]) -> None:
    """Cast parameters a trainer upcast back to their loaded dtype (bf16 -> fp32 -> bf16 is exact).

    TRL's ORPO and CPO (SimPO) trainers call prepare_model_for_kbit_training on a 4-bit model,
    which upcasts the shared bf16 base's embeddings, head and norms to fp32.
    """
    for name, param in model.named_parameters():
        want = dtypes.get(name)
        if want is not None and param.dtype != want:
            param.data = param.data.to(want)


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
        import torch
        from peft import prepare_model_for_kbit_training

        from workers import base_model as bm

        started = time.monotonic()
        _, revision = bm.resolve(name, models_dir)
        tokenizer = bm.load_tokenizer(name, models_dir)
        if not tokenizer.chat_template:
            raise TrainingDataError(f"base model {name} has no chat template")
        model = bm.load_model(name, models_dir, quantize_4bit=True)
        # Freezes once; each run's trainer turns gradient checkpointing on or off. A bf16 base
        # (CUDA) is only frozen: prepare_model_for_kbit_training would also upcast the embeddings,
        # LM head and norms to fp32 (+0.4 GiB and an fp32 LM head on a 1B model with a 49k
        # vocabulary), which the runbook does not do and bf16 does not need. On the CPU the
        # base is fp32 already and the call changes nothing else.
        if model.dtype == torch.bfloat16:
            model.requires_grad_(False)
        else:
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
        _checkpointing_off(model)
        _restore_dtypes(model, base.dtypes)
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
    callbacks: list[Any] | None = None,
) -> TrainResult:
    """Train one QLoRA adapter from JSONL examples; write adapter files + manifest to out_dir.

    `callbacks` are extra transformers TrainerCallbacks (benchmarks time steps with them).
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    hp = params if isinstance(params, Hyperparameters) else Hyperparameters(**(params or {}))
    hp.check_method(method)
    train_rows = _check_rows(method, _read_jsonl(train_path), "train")
    eval_rows = _check_rows(method, _read_jsonl(eval_path), "eval")
    if not train_rows:
        raise TrainingDataError(f"no training examples in {train_path}")

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import set_seed

    set_seed(hp.seed)
    requested = hp
    cuda, _, _ = _device_setup(hp)
    out_dir.mkdir(parents=True, exist_ok=True)
    callback = _progress_callback(progress_cb)
    with (bases or BASES).lease(base_model, models_dir) as base:
        hp, speed = resolve_hyperparameters(method, requested, cuda, train_rows, base.tokenizer)
        return _train(
            method,
            train_rows,
            eval_rows,
            out_dir,
            hp,
            requested,
            speed,
            base,
            [callback, *(callbacks or [])],
            provenance,
        )


def _train(
    method: str,
    train_rows: list[dict[str, Any]],
    eval_rows: list[dict[str, Any]],
    out_dir: Path,
    hp: Hyperparameters,
    requested: Hyperparameters,
    speed: SpeedSetup,
    base: LoadedBase,
    callbacks: list[Any],
    provenance: dict[str, Any] | None,
) -> TrainResult:
    import torch

    cuda, optim, checkpointing = _device_setup(hp)
    callback = callbacks[0]
    log.info(
        "training %s on %s: device=%s optimizer=%s%s gradient_checkpointing=%s packing=%s"
        " padding_free=%s liger=%s activation_offloading=%s precompute_ref_log_probs=%s"
        " batch_size=%d grad_accum=%d max_length=%d",
        method,
        base.name,
        "cuda" if cuda else "cpu",
        optim,
        "" if cuda or hp.optim else " (paged 8-bit AdamW needs CUDA)",
        checkpointing,
        speed.packing,
        speed.padding_free,
        speed.liger,
        speed.offload,
        speed.precompute,
        hp.batch_size,
        hp.grad_accum,
        hp.max_length,
    )
    with build_trainer(method, train_rows, eval_rows, out_dir, hp, base, callbacks) as trainer:
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
            "activation_offloading": speed.offload,
            "precompute_ref_log_probs": speed.precompute,
            "batch_size": hp.batch_size,
            "grad_accum": hp.grad_accum,
            "max_length": hp.max_length,
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
        "base_model": base.name,
        "base_revision": revision,
        "method": method,
        "snapshot_id": (provenance or {}).get("snapshot_id"),
        "set_hash": (provenance or {}).get("set_hash"),
        "training_run_id": (provenance or {}).get("training_run_id"),
        "hyperparameters": requested.model_dump(),
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
