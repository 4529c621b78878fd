"""HTTP: a route's loop policy and status, cycles, the global kill switch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends

from app.core.auth import ApiKey, OperatorAuth, ReaderKey, TenantConn, require
from app.core.db import Connection, Pool
from app.core.deps import get_pool
from app.core.errors import database_required
from app.loop import service as loop
from app.loop.schemas import ControlIn, CycleOut, LoopPolicyIn, LoopStatusOut

router = APIRouter(tags=["loop"])
# Trainers run the loop; release managers own how its promotions are decided (DECISION_FIELDS).
PolicyKey = Annotated[ApiKey, Depends(require("trainer", "release"))]


@router.put("/v1/routes/{name}/loop")
def put_loop(name: str, body: LoopPolicyIn, conn: TenantConn, key: PolicyKey) -> LoopStatusOut:
    """Set the route's loop policy: the fields given, every other field to its default (a
    trainer key keeps the fields that decide promotions, and may only make them stricter)."""
    loop.write_policy(
        conn,
        tenant_id=key.tenant_id,
        route=name,
        fields=body.model_dump(exclude_unset=True),
        replace=True,
        actor=f"key {key.prefix}",
        role=key.role,
    )
    return loop.status(conn, tenant_id=key.tenant_id, route=name)


@router.get("/v1/routes/{name}/loop")
def get_loop(name: str, conn: TenantConn, key: ReaderKey) -> LoopStatusOut:
    """The route's loop: policy, the live value of every trigger and limit, cycles."""
    return loop.status(conn, tenant_id=key.tenant_id, route=name)


@router.get("/v1/loop/cycles/{cycle_id}")
def get_cycle(cycle_id: int, conn: TenantConn, key: ReaderKey) -> CycleOut:
    """One cycle with every transition and the numbers it used."""
    return loop.get_cycle_or_raise(conn, cycle_id=cycle_id)


@router.get("/v1/loop/control")
def get_control(conn: TenantConn, key: ReaderKey) -> dict[str, Any]:
    """The global kill switch."""
    return loop.get_control(conn).as_json()


def _platform_conn(pool: Annotated[Pool, Depends(get_pool)]) -> Iterator[Connection]:
    """One transaction with no tenant scope: the kill switch is the platform's."""
    with database_required(), pool.connection() as conn, conn.transaction():
        yield conn


@router.put("/v1/loop/control")
def put_control(
    body: ControlIn,
    key: OperatorAuth,
    conn: Annotated[Connection, Depends(_platform_conn, scope="function")],
) -> dict[str, Any]:
    """Stop (paused: true, with a reason) or resume every tenant's loop cycles from starting:
    the platform's switch, so an operator key's, never a tenant's."""
    return loop.set_control(conn, paused=body.paused, reason=body.reason, actor=key.actor).as_json()
