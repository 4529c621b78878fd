"""QLoRA training of one adapter: JSONL files in, an adapter directory out (no queue imports).

One code path for every method and device: the base is loaded in NF4 with double quantisation
(bitsandbytes quantises on the CPU too), prepared for k-bit training, and a PEFT LoRA adapter is
trained by TRL (`trl_factory`). The tokenizer (and its chat template) is the base's own, the one
the engine serves with. The seams: `data` (rows in the method's format), `plan` (device and speed
settings, batch shape), `trl_factory` (configs and trainers), `base_cache` (the NF4 base kept
loaded between runs) and `manifest` (what the adapter directory says about itself).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.datasets.methods import METHODS
from app.training.methods import Hyperparameters
from workers.trainer.base_cache import BASES, BaseCache, LoadedBase
from workers.trainer.data import TrainingDataError, check_rows, read_jsonl
from workers.trainer.manifest import write_manifest
from workers.trainer.plan import SpeedSetup, device_setup, resolve_hyperparameters
from workers.trainer.trl_factory import build_trainer

log = logging.getLogger(__name__)

# The loss history kept in progress: at most this many (step, loss) points, spread evenly over
# the whole run (when full, every other point is dropped and the stride doubles).
HISTORY_POINTS = 500


@dataclass(frozen=True)
class Progress:
    """Where a training run is: optimizer step, total steps, last loss, seconds left."""

    step: int
    total: int
    loss: float | None
    eta_s: float | None
    tokens_per_s: float | None = None
    loss_history: list[list[float]] = field(default_factory=list)  # [[step, loss], ...]

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


# Returning True from the callback asks training to stop (raises TrainingCancelled).
ProgressCallback = Callable[[Progress], bool | None]


def progress_callback(cb: ProgressCallback | None) -> Any:
    """A TrainerCallback that logs each step and gives cb its Progress; cb True stops the run."""
    from transformers import TrainerCallback

    class _Cb(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.start = time.monotonic()
            self.loss: float | None = None
            self.cancelled = False
            self.history: list[list[float]] = []
            self.stride = 1

        def _keep(self, step: int, loss: float) -> None:
            if step % self.stride:
                return
            self.history.append([step, loss])
            if len(self.history) > HISTORY_POINTS:
                self.stride *= 2
                self.history = [p for p in self.history if p[0] % self.stride == 0]

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
            progress = Progress(step, total, self.loss, eta, tps, list(self.history))
            if cb is not None and cb(progress):
                self.cancelled = True
                control.should_training_stop = True
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> Any:
            if logs and "loss" in logs and math.isfinite(float(logs["loss"])):
                self.loss = float(logs["loss"])
                self._keep(int(state.global_step), self.loss)
            return self._report(state, control)

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            self.start = time.monotonic()
            return self._report(state, control)

    return _Cb()


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
    train_rows = check_rows(method, read_jsonl(train_path), "train")
    eval_rows = check_rows(method, read_jsonl(eval_path), "eval")
    if not train_rows:
        raise TrainingDataError(f"no training examples in {train_path}")

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import set_seed

    set_seed(hp.seed)
    requested = hp
    cuda, _, _ = device_setup(hp)
    out_dir.mkdir(parents=True, exist_ok=True)
    callback = progress_callback(progress_cb)
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

    cuda, optim, checkpointing = device_setup(hp)
    callback = callbacks[0]
    log.info(
        "training %s on %s: device=%s optimizer=%s%s gradient_checkpointing=%s packing=%s"
        " padding_free=%s liger=%s activation_offloading=%s precompute_ref_log_probs=%s"
        " compile_layers=%s batch_size=%d grad_accum=%d max_length=%d",
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
        speed.compile,
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
        # Under accelerate launch (gpus > 1) every rank runs this; rank 0 writes the artefact.
        world_size = int(trainer.accelerator.num_processes)
        fsdp = bool(getattr(trainer, "is_fsdp_enabled", False))
        strategy = "fsdp" if fsdp else ("ddp" if world_size > 1 else "single")
        main = bool(trainer.is_world_process_zero())
        peak = _peak_vram_gib(trainer, cuda, world_size)
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
            "compile_layers": speed.compile,
            "batch_size": hp.batch_size,
            "grad_accum": hp.grad_accum,
            "max_length": hp.max_length,
            "base_reused": base.runs > 0,
            "world_size": world_size,
            "strategy": strategy,
            # The first and last logged loss (under DDP / FSDP the mean over the ranks).
            "loss_first": callback.history[0][1] if callback.history else None,
            "loss_last": callback.loss,
            # torch.cuda.max_memory_allocated of each rank's GPU (None on the CPU).
            "peak_vram_gib": peak,
        }
        if eval_rows:
            with torch.no_grad():
                ev = trainer.evaluate()
            metrics.update({k: float(v) for k, v in ev.items() if isinstance(v, int | float)})
        if fsdp:
            # The LoRA weights are sharded: gather a full state dict (collective), rank 0 writes.
            trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
            trainer.save_model(str(out_dir))
            if main:
                (out_dir / "training_args.bin").unlink(missing_ok=True)
        elif main:
            trainer.model.save_pretrained(str(out_dir), safe_serialization=True)
        if world_size > 1:
            trainer.accelerator.wait_for_everyone()
    if not main:
        return TrainResult(out_dir=out_dir, manifest={}, metrics=metrics)
    manifest = write_manifest(
        out_dir,
        base_name=base.name,
        revision=revision,
        method=method,
        provenance=provenance,
        requested=requested,
        metrics=metrics,
        tokenizer=tokenizer,
        world_size=world_size,
        strategy=strategy,
    )
    _remove_tree(out_dir / ".checkpoints")
    log.info("trained %s adapter in %.1f s: %s", method, elapsed, metrics)
    return TrainResult(out_dir=out_dir, manifest=manifest, metrics=metrics)


def _peak_vram_gib(trainer: Any, cuda: bool, world_size: int) -> list[float] | None:
    """Peak allocated GiB of every rank's GPU, rank order (a collective when distributed)."""
    if not cuda:
        return None
    import torch

    peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**30], device="cuda")
    if world_size > 1:
        peak = trainer.accelerator.gather(peak)
    return [round(float(x), 3) for x in peak.tolist()]


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
