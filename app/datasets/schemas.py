"""Request and response bodies of the datasets API."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, Field

from app.datasets.methods import Method


class SnapshotWindow(BaseModel):
    """Window, dedup and split parameters of a snapshot (also a training run's fresh snapshot)."""

    since: datetime | None = Field(None, description="Window start; default until - 60 days.")
    until: datetime | None = Field(None, description="Window end (exclusive); default now.")
    dedup_threshold: float = Field(
        0.1, ge=0, le=2, description="Cosine distance under which prompts are duplicates; 0 = off."
    )
    eval_pct: int = Field(10, ge=0, le=100, description="Share of examples in the eval split.")
    neighbours: int = Field(10, ge=1, le=1000, description="HNSW neighbours probed per example.")
    refresh: bool = Field(
        True, description="Refresh the candidate view this method reads first (CONCURRENTLY)."
    )


class SnapshotCreate(SnapshotWindow):
    """Freeze the candidates of one route into a snapshot."""

    route: str = Field(min_length=1, max_length=128)
    method: Method


class SnapshotOut(BaseModel):
    """A frozen snapshot: its query, parameters, counts per step and set hash."""

    id: UUID
    tenant_id: int
    route: str
    method: Method
    query_sql: str
    params: dict[str, Any]
    counts: dict[str, Any]
    n_train: int
    n_eval: int
    set_hash: str | None
    created_by: str | None
    created_at: datetime
    tainted_at: datetime | None
    tainted_reason: str | None
