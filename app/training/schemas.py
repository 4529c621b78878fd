"""Request and response bodies of /v1/training-runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workers.trainer.hyperparams import Hyperparameters, Method


class TrainingRunCreate(BaseModel):
    """A retrain request."""

    model_config = ConfigDict(extra="forbid")

    route: str = Field(..., min_length=1, max_length=128)
    method: Method
    snapshot_id: UUID
    base_model: str | None = Field(None, description="Default: CFT_BASE_MODEL.")
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)  # type: ignore[arg-type]
    priority: int = Field(0, ge=-1000, le=1000)
    max_attempts: int = Field(3, ge=1, le=20)

    @model_validator(mode="after")
    def _method_settings(self) -> TrainingRunCreate:
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
    hyperparameters: dict[str, Any]
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
