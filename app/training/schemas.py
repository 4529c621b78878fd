"""Request and response bodies of /v1/training-runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.datasets import schemas as dataset_schemas
from app.training.methods import Hyperparameters, Method


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
    base_model: str | None = Field(None, description="Default: CFT_BASE_MODEL.")
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)  # type: ignore[arg-type]
    priority: int = Field(0, ge=-1000, le=1000)
    max_attempts: int = Field(3, ge=1, le=20)

    @model_validator(mode="after")
    def _method_settings(self) -> TrainingRunCreate:
        if (self.snapshot_id is None) == (self.snapshot is None):
            raise ValueError(
                "give exactly one of snapshot_id (an existing snapshot) and snapshot"
                ' (freeze a fresh one, e.g. "snapshot": {})'
            )
        self.hyperparameters.check_method(self.method)
        return self


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
