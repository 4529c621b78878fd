"""HTTP routes of the adapter registry and the promotion gate (rules in service.py and SQL)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from app.adapters import schemas
from app.adapters import service as adapters
from app.core.auth import AdminKey, ApiKey, ReaderKey, ReleaseKey, TenantConn, require

router = APIRouter(tags=["adapters"])

# Who may record eval results: trainers (kept, shown, not trusted by default) and release.
EvalWriterKey = Annotated[ApiKey, Depends(require("trainer", "release"))]


def _actor(key: ApiKey) -> str:
    return f"key={key.prefix} role={key.role}"


@router.get("/v1/adapters")
def list_adapters(
    conn: TenantConn, key: ReaderKey, route: str | None = None
) -> schemas.AdapterList:
    """List the tenant's adapters, optionally of one route."""
    return schemas.AdapterList(data=adapters.list_adapters(conn, route=route))


@router.get("/v1/adapters/{adapter_id}")
def read_adapter(adapter_id: str, conn: TenantConn, key: ReaderKey) -> schemas.AdapterDetail:
    """Return one adapter with its eval results and audit events."""
    return adapters.get_detail_or_raise(conn, adapter_id=adapter_id)


@router.get("/v1/adapters/{adapter_id}/promotion-check")
def check_promotion(adapter_id: str, conn: TenantConn, key: ReaderKey) -> schemas.PromotionCheck:
    """Say whether the gate would promote the adapter over its route's prod now, and why not."""
    return adapters.check_promotion(conn, adapter_id=adapter_id)


@router.post("/v1/adapters/{adapter_id}/canary")
def start_canary(
    adapter_id: str, body: schemas.CanaryIn, conn: TenantConn, key: ReleaseKey
) -> schemas.AdapterOut:
    """Serve the adapter to traffic_pct % of its route's users (needs eval results)."""
    return adapters.start_canary(
        conn,
        adapter_id=adapter_id,
        traffic_pct=body.traffic_pct,
        reason=body.reason,
        actor=_actor(key),
    )


@router.post("/v1/adapters/{adapter_id}/promote")
def promote(
    adapter_id: str, conn: TenantConn, key: ReleaseKey, body: schemas.PromoteIn | None = None
) -> schemas.AdapterOut:
    """Make the adapter its route's prod if the gate allows (409 with the reasons if not)."""
    return adapters.promote(
        conn, adapter_id=adapter_id, reason=body.reason if body else None, actor=_actor(key)
    )


@router.post("/v1/adapters/{adapter_id}/rollback")
def rollback(
    adapter_id: str, conn: TenantConn, key: ReleaseKey, body: schemas.RollbackIn | None = None
) -> schemas.AdapterOut:
    """Retire the prod adapter and restore the one it replaced; returns the restored one."""
    reason = body.reason if body else schemas.RollbackIn().reason
    return adapters.rollback(conn, adapter_id=adapter_id, reason=reason, actor=_actor(key))


@router.post("/v1/adapters/{adapter_id}/eval-results")
def record_eval_results(
    adapter_id: str, body: schemas.EvalResultsIn, conn: TenantConn, key: EvalWriterKey
) -> list[schemas.EvalResultOut]:
    """Record scores of an adapter, authored by this key (a recorded suite/metric is replaced).

    A trainer's results are kept and shown, but satisfy no required rule unless the policy
    trusts trainers; a release key's do (train.promotion_policy.trusted_authors).
    """
    return adapters.record_eval_results(
        conn, adapter_id=adapter_id, results=[r.model_dump() for r in body.results], key_id=key.id
    )


@router.get("/v1/promotion-policy")
def read_policy(conn: TenantConn, key: ReaderKey, route: str | None = None) -> schemas.PolicyOut:
    """The gate's rules: global ones and the route's own."""
    return schemas.PolicyOut(data=adapters.get_policy(conn, tenant_id=key.tenant_id, route=route))


@router.put("/v1/promotion-policy")
def replace_policy(body: schemas.PolicyIn, conn: TenantConn, key: AdminKey) -> schemas.PolicyOut:
    """Replace a route's own rules (admin keys only: the rules are what the gate enforces)."""
    adapters.replace_policy(
        conn, tenant_id=key.tenant_id, route=body.route, rules=[r.model_dump() for r in body.rules]
    )
    rules = adapters.get_policy(conn, tenant_id=key.tenant_id, route=body.route)
    return schemas.PolicyOut(data=[r for r in rules if r.route])
