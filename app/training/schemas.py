"""Request and response bodies of /v1/training-runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.datasets import schemas as dataset_schemas
from app.datasets.methods import Method
from app.training.methods import Hyperparameters

DeviceKind = Literal["cuda", "cpu"]


class FreshSnapshot(dataset_schemas.SnapshotWindow):
    """Freeze a new snapshot of the run's route and method when the run is queued."""

    model_config = ConfigDict(extra="forbid")


class TrainingRunCreate(BaseModel):
    """A retrain request: on an existing snapshot (`snapshot_id`) or a fresh one (`snapshot`)."""

    model_config = ConfigDict(extra="forbid")

    route: str = Field(..., min_length=1, max_length=128)
    method: Method
    snapshot_id: UUID | None = Field(None, description="An existing snapshot of the route.")
    snapshot: FreshSnapshot | None = Field(
        None,
        description="Freeze a new snapshot of the route for this method in the same transaction"
        " (`{}` for the defaults); give this or snapshot_id, not both.",
    )
    base_model: str | None = Field(
        None, max_length=256, description="The route's base model (the only one accepted)."
    )
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)  # type: ignore[arg-type]
    priority: int = Field(
        0,
        ge=-10,
        le=10,
        description="Order among the tenant's own queued runs; tenants take turns whatever"
        " their priorities.",
    )
    max_attempts: int = Field(3, ge=1, le=20)
    gpus: int = Field(
        1,
        ge=1,
        le=64,
        description="Devices the run trains on at once; more than 1 launches it with accelerate"
        " (DDP or FSDP, see hyperparameters.distributed_strategy) on one worker that holds"
        " that many.",
    )
    min_gpu_memory_gb: float | None = Field(
        None, gt=0, le=4096, description="Least memory of each GPU, in GB (None: any)."
    )
    device_kind: DeviceKind | None = Field(
        None, description="cuda or cpu (None: any worker that has the devices)."
    )

    @model_validator(mode="after")
    def _method_settings(self) -> TrainingRunCreate:
        if (self.snapshot_id is None) == (self.snapshot is None):
            raise ValueError(
                "give exactly one of snapshot_id (an existing snapshot) and snapshot"
                ' (freeze a fresh one, e.g. "snapshot": {})'
            )
        self.hyperparameters.check_method(self.method)
        check_resources(self.gpus, self.min_gpu_memory_gb, self.device_kind, self.hyperparameters)
        return self


def check_resources(
    gpus: int, min_gpu_memory_gb: float | None, device_kind: str | None, hp: Hyperparameters
) -> None:
    """Refuse resource needs that no worker could honour (ValueError says what to change)."""
    if device_kind == "cpu" and min_gpu_memory_gb is not None:
        raise ValueError(
            "device_kind cpu has no GPU memory: drop min_gpu_memory_gb or ask for device_kind cuda"
        )
    if hp.distributed_strategy is not None and gpus < 2:
        raise ValueError(
            f"distributed_strategy {hp.distributed_strategy} is for runs on several devices:"
            " set gpus to 2 or more, or leave distributed_strategy unset"
        )
    if hp.distributed_strategy == "fsdp" and device_kind == "cpu":
        raise ValueError("fsdp shards a QLoRA base across GPUs; on cpu use ddp (or leave it unset)")


class TrainingRunOut(BaseModel):
    """A training run with its live progress."""

    id: UUID
    route: str
    method: str
    base_model: str
    snapshot_id: UUID | None
    status: str
    priority: int
    attempts: int
    max_attempts: int
    cancel_requested: bool
    worker_id: str | None
    gpus: int
    min_gpu_memory_gb: float | None
    device_kind: str | None
    host: str | None = Field(None, description="The host of the worker that (last) claimed it.")
    devices: str | None = Field(
        None, description="Its devices there: CUDA indices (e.g. 0,1) or cpu."
    )
    progress: dict[str, Any]
    hyperparameters: dict[str, Any] = Field(
        description="As requested, defaults filled in. Settings left unset (packing, Liger,"
        " offloading, batch shape) are resolved per device by the worker; the adapter's"
        " manifest metrics record what it trained with."
    )
    error: str | None
    adapter_id: str | None
    created_by: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class TrainingRunList(BaseModel):
    """A page of training runs, newest first."""

    object: str = "list"
    data: list[TrainingRunOut]
