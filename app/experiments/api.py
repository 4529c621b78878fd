"""HTTP routes of the experiments API (rules in service.py, numbers in SQL)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.core.auth import ReaderKey, TenantConn
from app.experiments import schemas
from app.experiments import service as experiments

router = APIRouter(tags=["experiments"])


@router.get("/v1/experiments")
def list_experiments(conn: TenantConn, key: ReaderKey) -> schemas.ExperimentList:
    """List the tenant's experiments seen in traffic."""
    return schemas.ExperimentList(data=experiments.list_experiments(conn))


@router.get("/v1/experiments/{name}/metrics")
def read_metrics(
    name: str,
    conn: TenantConn,
    key: ReaderKey,
    window: str = "7d",
    alpha: Annotated[float, Query(gt=0, lt=0.5)] = 0.05,
) -> schemas.MetricsOut:
    """Per-arm metrics and canary-versus-prod tests of an experiment over the last window."""
    delta = experiments.parse_window(window)
    return experiments.metrics(conn, name=name, window=delta, alpha=alpha)
