"""One rank of a multi-device run: `accelerate launch -m workers.trainer.distributed SPEC`.

Every rank calls the same `train_adapter` as a single-device run, on its own device (LOCAL_RANK),
with a base cache of its own (NF4 packed as bf16 under FSDP so it can be sharded). Rank 0 writes
the adapter directory and manifest (train.py), its progress for the worker's heartbeat and the
result; no rank touches the database (the worker that launched them registers the candidate).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from workers.trainer.base_cache import BaseCache
from workers.trainer.launch import die_with_parent
from workers.trainer.train import Progress, train_adapter


def _write_atomic(path: Path, data: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def _launched_by_accelerate() -> bool:
    """Whether the parent is still the launch (else it died, and this rank was reparented)."""
    proc = Path(f"/proc/{os.getppid()}/cmdline")
    if not Path("/proc/self").exists():
        return True  # no procfs: cannot tell
    try:
        cmd = proc.read_bytes()
    except OSError:
        return False
    return b"accelerate" in cmd or b"torch" in cmd


def main(argv: list[str] | None = None) -> int:
    """Train this rank's share of the run described by the spec file."""
    die_with_parent()  # the launch died (its worker was killed): stop training at once
    if not _launched_by_accelerate():
        return 3  # the launch died before this rank could ask to die with it
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(args[0]).read_text())
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s %(message)s",
    )
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    progress_path = Path(spec["progress_path"])

    def report(p: Progress) -> bool:
        _write_atomic(progress_path, p.as_dict())
        return False  # the worker stops the ranks itself (a stop on one rank would hang DDP)

    result = train_adapter(
        spec["method"],
        Path(spec["train_path"]),
        Path(spec["eval_path"]) if spec["eval_path"] else None,
        Path(spec["out_dir"]),
        base_model=spec["base_model"],
        models_dir=Path(spec["models_dir"]),
        params=spec["params"],
        progress_cb=report if rank == 0 else None,
        provenance=spec["provenance"],
        bases=BaseCache(quant_storage="bfloat16" if spec["strategy"] == "fsdp" else None),
    )
    if rank == 0:
        _write_atomic(
            Path(spec["result_path"]), {"manifest": result.manifest, "metrics": result.metrics}
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
