"""HTTP routes of task suites and evaluation requests."""

from __future__ import annotations

from fastapi import APIRouter

from app.core.auth import ReaderKey, TenantConn, TrainerKey
from app.evals import schemas
from app.evals import service as evals

router = APIRouter(tags=["evals"])


@router.post("/v1/eval-suites", status_code=201)
def create_suite(body: schemas.SuiteIn, conn: TenantConn, key: TrainerKey) -> schemas.SuiteOut:
    """Store a task suite of a route (or of every route) with its cases."""
    return evals.create_suite(conn, tenant_id=key.tenant_id, suite=body.model_dump(), key_id=key.id)


@router.get("/v1/eval-suites")
def list_suites(conn: TenantConn, key: ReaderKey, route: str | None = None) -> schemas.SuiteList:
    """The tenant's task suites, optionally those that apply to one route."""
    return schemas.SuiteList(data=evals.list_suites(conn, tenant_id=key.tenant_id, route=route))


@router.post("/v1/adapters/{adapter_id}/evaluate", status_code=202)
def evaluate(adapter_id: str, conn: TenantConn, key: TrainerKey) -> schemas.EvalRequestOut:
    """Ask the evaluator to score the adapter (and its route's prod where it lacks results)."""
    return evals.request_evaluation(
        conn, tenant_id=key.tenant_id, adapter_id=adapter_id, actor=f"key:{key.prefix}"
    )
