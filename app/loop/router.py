"""HTTP: a route's loop policy and status, cycles, the global kill switch."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.core.auth import AdminKey, ReaderKey, TenantConn, TrainerKey
from app.loop import service as loop
from app.loop.schemas import ControlIn, CycleOut, LoopPolicyIn, LoopStatusOut

router = APIRouter(tags=["loop"])


@router.put("/v1/routes/{name}/loop")
def put_loop(name: str, body: LoopPolicyIn, conn: TenantConn, key: TrainerKey) -> LoopStatusOut:
    """Set the route's loop policy: the fields given, every other field to its default."""
    loop.write_policy(
        conn,
        route=name,
        fields=body.model_dump(exclude_unset=True),
        replace=True,
        actor=f"key {key.prefix}",
    )
    return LoopStatusOut(**loop.status(conn, route=name))


@router.get("/v1/routes/{name}/loop")
def get_loop(name: str, conn: TenantConn, key: ReaderKey) -> LoopStatusOut:
    """The route's loop: policy, the live value of every trigger and limit, cycles."""
    return LoopStatusOut(**loop.status(conn, route=name))


@router.get("/v1/loop/cycles/{cycle_id}")
def get_cycle(cycle_id: int, conn: TenantConn, key: ReaderKey) -> CycleOut:
    """One cycle with every transition and the numbers it used."""
    return CycleOut(**loop.get_cycle_or_raise(conn, cycle_id=cycle_id))


@router.get("/v1/loop/control")
def get_control(conn: TenantConn, key: ReaderKey) -> dict[str, Any]:
    """The global kill switch."""
    return loop.jsonable(loop.get_control(conn))  # type: ignore[no-any-return]


@router.put("/v1/loop/control")
def put_control(body: ControlIn, conn: TenantConn, key: AdminKey) -> dict[str, Any]:
    """Stop (paused: true, with a reason) or resume every loop cycle from starting."""
    row = loop.set_control(conn, paused=body.paused, reason=body.reason, actor=f"key {key.prefix}")
    return loop.jsonable(row)  # type: ignore[no-any-return]
