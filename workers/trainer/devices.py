"""Which devices a trainer worker holds: the `--devices` spec, and the capacity it claims with.

`--devices` lists worker groups separated by commas; each group is one claiming process:
`all` (one process per visible GPU), `0,1` (GPU 0 and GPU 1, one process each), `0+1` (one
process holding GPUs 0 and 1, so it can take runs with gpus = 2), `cpu` (one CPU process),
`cpu:3` (three CPU processes) and `cpu+cpu` (one CPU process that launches 2 ranks for a run
with gpus = 2, the CI form of a distributed run). A process is pinned with CUDA_VISIBLE_DEVICES
to its GPUs; it passes its capacity (devices, memory of the smallest GPU, kind) to the claim.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


class DeviceSpecError(ValueError):
    """A --devices value that names no usable devices."""


@dataclass(frozen=True)
class DeviceGroup:
    """The devices of one worker process: CUDA indices (as the parent sees them) or cpu slots."""

    kind: str  # "cuda" or "cpu"
    devices: tuple[str, ...]

    @property
    def label(self) -> str:
        """As recorded in training_run.devices: `0,1` or `cpu` / `cpu+cpu`."""
        return ",".join(self.devices) if self.kind == "cuda" else "+".join(self.devices)

    def env(self, parent_visible: str | None) -> dict[str, str]:
        """The environment that pins a child to this group (physical ids under the parent's)."""
        if self.kind == "cpu":
            return {"CUDA_VISIBLE_DEVICES": ""}
        visible = [v for v in (parent_visible or "").split(",") if v.strip()]
        ids = [visible[int(d)] if visible else d for d in self.devices]
        return {"CUDA_VISIBLE_DEVICES": ",".join(ids)}


def parse_devices(spec: str, cuda_count: int) -> list[DeviceGroup]:
    """The worker groups of a --devices spec, given how many GPUs are visible."""
    groups: list[DeviceGroup] = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            raise DeviceSpecError(f"--devices {spec!r}: empty entry (use e.g. all, 0,1, 0+1, cpu)")
        if item == "all":
            if cuda_count == 0:
                raise DeviceSpecError(
                    "--devices all: no CUDA device is visible on this host; use --devices cpu"
                    " (or cpu:N for N CPU workers)"
                )
            groups += [DeviceGroup("cuda", (str(i),)) for i in range(cuda_count)]
        elif item.startswith("cpu:"):
            n = item.removeprefix("cpu:")
            if not n.isdigit() or not 1 <= int(n) <= 64:
                raise DeviceSpecError(f"--devices {item!r}: cpu:N needs N between 1 and 64")
            groups += [DeviceGroup("cpu", ("cpu",)) for _ in range(int(n))]
        else:
            parts = item.split("+")
            if all(p == "cpu" for p in parts):
                groups.append(DeviceGroup("cpu", tuple(parts)))
                continue
            if not all(p.isdigit() for p in parts):
                raise DeviceSpecError(
                    f"--devices {item!r}: a group is GPU indices joined by + (0+1) or cpu"
                )
            for p in parts:
                if int(p) >= cuda_count:
                    raise DeviceSpecError(
                        f"--devices {item!r}: GPU {p} is not visible"
                        f" ({cuda_count} visible: 0..{cuda_count - 1})"
                        if cuda_count
                        else f"--devices {item!r}: no CUDA device is visible; use cpu"
                    )
            if len(set(parts)) != len(parts):
                raise DeviceSpecError(f"--devices {item!r}: a GPU is named twice")
            groups.append(DeviceGroup("cuda", tuple(str(int(p)) for p in parts)))
    used = [d for g in groups if g.kind == "cuda" for d in g.devices]
    if len(set(used)) != len(used):
        raise DeviceSpecError(f"--devices {spec!r}: a GPU belongs to two workers")
    return groups


@dataclass(frozen=True)
class Capacity:
    """What one worker process can serve, as passed to train.claim_training_run."""

    kind: str
    gpus: int
    gpu_memory_gb: float | None
    devices: str
    host: str


def detect_capacity(
    *, group: str | None = None, gpu_memory_gb: float | None = None, host: str | None = None
) -> Capacity:
    """The capacity of this process: its pinned GPUs (memory of the smallest), or cpu slots.

    `group` is the label a supervisor gave the process (`0,1`, `cpu+cpu`); without one the
    process is a plain worker on one device (GPU 0, or the CPU). `gpu_memory_gb` overrides the
    measured memory (MIG slices, tests).
    """
    import torch

    host = host or socket.gethostname()
    if group is not None and group.split("+")[0] == "cpu":
        return Capacity("cpu", len(group.split("+")), gpu_memory_gb, group, host)
    if not torch.cuda.is_available():
        if group is not None:
            raise DeviceSpecError(
                f"worker for GPUs {group}: no CUDA device visible"
                f" (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
            )
        return Capacity("cpu", 1, gpu_memory_gb, "cpu", host)
    n = torch.cuda.device_count() if group is not None else 1
    memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(n)) / 2**30
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "") or "0"
    label = group if group is not None else visible.split(",")[0]
    return Capacity(
        "cuda", n, round(gpu_memory_gb if gpu_memory_gb is not None else memory, 1), label, host
    )
