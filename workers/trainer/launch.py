"""A run with gpus > 1: `accelerate launch` of `workers.trainer.distributed` on its devices.

The worker stays the only process that talks to the database: it writes the run's spec, launches
one rank per device (DDP, or FSDP for a base too large to copy to every GPU), relays rank 0's
progress to its heartbeat, stops the ranks on cancel or a lost lease, and reads rank 0's result
(the adapter directory and its manifest, the same form as a single-device run). A rank that
crashes makes `accelerate launch` (torchrun) stop the others and exit non-zero: the run fails
with the rank, its exit code and the last error of the log.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.training.methods import Hyperparameters
from workers.trainer.train import Progress, ProgressCallback, TrainingCancelled, TrainResult

log = logging.getLogger(__name__)

# FSDP when the base's NF4 weights would take more than this share of one GPU under DDP (each
# rank holds a whole copy, beside activations, LoRA gradients and optimizer state).
FSDP_ABOVE_SHARE = 0.4
NF4_BYTES_PER_PARAM = 0.5625  # 4 bits + double-quantised absmax per 64 weights
LOG_TAIL = 1500


class DistributedTrainingFailed(RuntimeError):
    """accelerate launch exited non-zero: a rank crashed (the message says which and why)."""


def base_nf4_gb(base_model: str, models_dir: Path) -> float | None:
    """Estimated NF4 size of a local base in GiB (from its safetensors and dtype), or None."""
    from workers import base_model as bm

    path = Path(bm.resolve(base_model, models_dir)[0])
    files = list(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        return None
    dtype = "bfloat16"
    config = path / "config.json"
    if config.exists():
        meta = json.loads(config.read_text())
        dtype = str(meta.get("dtype") or meta.get("torch_dtype") or dtype)
    per_param = 4 if dtype == "float32" else 2
    params = sum(f.stat().st_size for f in files) / per_param
    return params * NF4_BYTES_PER_PARAM / 2**30


def choose_strategy(
    hp: Hyperparameters,
    *,
    kind: str,
    gpu_memory_gb: float | None,
    base_model: str,
    models_dir: Path,
) -> str:
    """ddp or fsdp for a multi-device run: as set, else by whether the NF4 base fits a GPU."""
    if hp.distributed_strategy is not None:
        if hp.distributed_strategy == "fsdp" and kind == "cpu":
            raise ValueError("distributed_strategy fsdp needs GPUs; this worker's devices are cpu")
        return hp.distributed_strategy
    if kind == "cpu" or not gpu_memory_gb:
        return "ddp"
    size = base_nf4_gb(base_model, models_dir)
    if size is not None and size > FSDP_ABOVE_SHARE * gpu_memory_gb:
        return "fsdp"
    return "ddp"


def _libc() -> Any:
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _libc()  # resolved before any fork: the child only makes the call


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere).

    The launch gets it from the worker, each rank from the launch: a worker killed mid-run (by
    its supervisor after the stop grace, or SIGKILL) leaves no rank training on its GPUs.
    """
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_command(world_size: int, strategy: str, kind: str, spec_path: Path) -> list[str]:
    """The `accelerate launch` command line of one run's ranks."""
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        str(world_size),
        "--num_machines",
        "1",
        "--main_process_port",
        str(_free_port()),
        "--mixed_precision",
        "bf16" if kind == "cuda" else "no",
        "--dynamo_backend",
        "no",
    ]
    if strategy == "fsdp":
        # FSDP + QLoRA (NF4 stored as bf16, PEFT's wrap policy set by the Trainer).
        cmd += [
            "--use_fsdp",
            "--fsdp_version",
            "1",
            "--fsdp_sharding_strategy",
            "FULL_SHARD",
            "--fsdp_auto_wrap_policy",
            "TRANSFORMER_BASED_WRAP",
            "--fsdp_state_dict_type",
            "FULL_STATE_DICT",
            "--fsdp_use_orig_params",
            "false",
            # Every rank loads (and quantises) the base itself onto its GPU: no meta-device
            # loading on the other ranks, nothing to broadcast from rank 0.
            "--fsdp_cpu_ram_efficient_loading",
            "false",
            "--fsdp_sync_module_states",
            "false",
            "--fsdp_offload_params",
            "false",
        ]
    else:
        cmd += ["--multi_gpu"]
    return [*cmd, "-m", "workers.trainer.distributed", str(spec_path)]


def failure_summary(text: str) -> str:
    """The failed rank, its exit code and the last exception line of a launch log."""
    parts = []
    # torchrun's report: "Root Cause (first observed failure)" names the rank that failed first.
    root = text[text.rfind("Root Cause") :] if "Root Cause" in text else text
    rank = re.search(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", root)
    if rank:
        parts.append(f"rank {rank.group(1)} exited with code {rank.group(2)}")
    cause = re.search(r"traceback\s*:\s*(.+)", root)
    if cause and "<N/A>" not in cause.group(1) and "To enable traceback" not in cause.group(1):
        parts.append(cause.group(1).strip())
    errors = [
        line.strip()
        for line in text.splitlines()
        if re.match(r"^\s*(\[rank\d+\]:\s*)?[A-Za-z_.]*(Error|Exception|Failed)\b.*:", line)
        and "ChildFailedError" not in line
        and "CalledProcessError" not in line
    ]
    if errors:
        parts.append(f"last error: {errors[-1][:500]}")
    return "; ".join(parts) or "no rank error found in the log"


def train_distributed(
    method: str,
    train_path: Path,
    eval_path: Path | None,
    out_dir: Path,
    *,
    base_model: str,
    models_dir: Path,
    params: Hyperparameters | dict[str, Any],
    world_size: int,
    kind: str,
    gpu_memory_gb: float | None,
    work: Path,
    progress_cb: ProgressCallback | None = None,
    should_stop: Callable[[], bool] | None = None,
    provenance: dict[str, Any] | None = None,
    poll_s: float = 1.0,
) -> TrainResult:
    """Train one adapter on world_size ranks through accelerate launch; rank 0 writes it."""
    hp = params if isinstance(params, Hyperparameters) else Hyperparameters(**params)
    strategy = choose_strategy(
        hp, kind=kind, gpu_memory_gb=gpu_memory_gb, base_model=base_model, models_dir=models_dir
    )
    work.mkdir(parents=True, exist_ok=True)
    progress_path, result_path = work / "progress.json", work / "result.json"
    spec: dict[str, Any] = {
        "method": method,
        "train_path": str(train_path),
        "eval_path": str(eval_path) if eval_path else None,
        "out_dir": str(out_dir),
        "base_model": base_model,
        "models_dir": str(models_dir),
        # Only what the caller set: the ranks tell unset from default as train_adapter does.
        "params": hp.model_dump(mode="json", exclude_unset=True),
        "provenance": provenance or {},
        "strategy": strategy,
        "progress_path": str(progress_path),
        "result_path": str(result_path),
    }
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec))
    cmd = launch_command(world_size, strategy, kind, spec_path)
    log_path = work / "launch.log"
    log.info("launching %d ranks (%s, %s): %s", world_size, strategy, kind, " ".join(cmd))
    env = os.environ | {"TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        seen = 0.0
        try:
            while proc.poll() is None:
                time.sleep(poll_s)
                seen = _relay_progress(progress_path, seen, progress_cb, should_stop, proc)
        finally:
            if proc.poll() is None:
                _stop(proc)
    text = log_path.read_text(errors="replace")
    if proc.returncode == -signal.SIGTERM or getattr(proc, "cft_stopped", False):
        raise TrainingCancelled("stop requested: the ranks were terminated")
    if proc.returncode != 0:
        raise DistributedTrainingFailed(
            f"distributed training failed (accelerate launch, {world_size} ranks, {strategy},"
            f" exit {proc.returncode}): {failure_summary(text)}; log tail: {text[-LOG_TAIL:]}"
        )
    if not result_path.exists():
        raise DistributedTrainingFailed(
            f"accelerate launch exited 0 but rank 0 wrote no result; log tail: {text[-LOG_TAIL:]}"
        )
    result = json.loads(result_path.read_text())
    return TrainResult(out_dir=out_dir, manifest=result["manifest"], metrics=result["metrics"])


def _relay_progress(
    path: Path,
    seen: float,
    cb: ProgressCallback | None,
    should_stop: Callable[[], bool] | None,
    proc: subprocess.Popen[bytes],
) -> float:
    """Pass rank 0's newest progress to cb; stop the ranks when cb or should_stop asks to."""
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        mtime = seen
    stop = False
    if mtime != seen and cb is not None:
        try:
            progress = Progress(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return seen  # mid-write: the next poll reads it
        stop = bool(cb(progress))
    if stop or (should_stop is not None and should_stop()):
        proc.cft_stopped = True  # type: ignore[attr-defined]
        _stop(proc)
    return mtime


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """SIGTERM the ranks' process group, then SIGKILL what is left after grace_s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
