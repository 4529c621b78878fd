"""HTTP endpoints of training runs."""

from __future__ import annotations

from typing import Literal
from uuid import UUID

from fastapi import APIRouter, Query

from app.core.auth import ReaderKey, TenantConn, TrainerKey
from app.training import service
from app.training.schemas import TrainingRunCreate, TrainingRunList, TrainingRunOut

router = APIRouter(tags=["training"])

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]


@router.post("/v1/training-runs", status_code=201)
def create_training_run(
    body: TrainingRunCreate, conn: TenantConn, key: TrainerKey
) -> TrainingRunOut:
    """Queue a retrain of a route from a dataset snapshot (on the route's base model)."""
    return service.enqueue(conn, tenant_id=key.tenant_id, body=body, actor=f"key:{key.prefix}")


@router.get("/v1/training-runs/{run_id}")
def read_training_run(run_id: UUID, conn: TenantConn, key: ReaderKey) -> TrainingRunOut:
    """One run with its live progress."""
    return service.get_or_raise(conn, run_id=run_id)


@router.get("/v1/training-runs")
def list_training_runs(
    conn: TenantConn,
    key: ReaderKey,
    status: Status | None = None,
    route: str | None = None,
    limit: int = Query(50, ge=1, le=500),
) -> TrainingRunList:
    """The tenant's runs, newest first."""
    return TrainingRunList(data=service.list_runs(conn, status=status, route=route, limit=limit))


@router.post("/v1/training-runs/{run_id}/cancel")
def cancel_training_run(run_id: UUID, conn: TenantConn, key: TrainerKey) -> TrainingRunOut:
    """Cancel a queued or running run."""
    return service.cancel(conn, run_id=run_id)
