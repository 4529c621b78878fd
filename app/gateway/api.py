"""HTTP of the gateway: the OpenAI endpoints (completions, chat completions, models)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from app.core.auth import IngestKey, TenantConn
from app.gateway.keys import ClientKey
from app.gateway.proxy import proxy

router = APIRouter(tags=["router"])


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, key: ClientKey) -> Response:
    """OpenAI chat completions through the route's adapter."""
    return await proxy(request, key, "chat")


@router.post("/v1/completions")
async def completions(request: Request, key: ClientKey) -> Response:
    """OpenAI completions through the route's adapter."""
    return await proxy(request, key, "completions")


# The gateway's hot calls: `fastpath.GatewayFastPath` serves them around FastAPI's per-call
# machinery, running the dependencies and handler declared above. It refuses, when the app is
# built, a route here that declares what it would not run (anything but `async def`
# dependencies of the Request alone): take a route out of this tuple to give it more.
FAST_PATH = (chat_completions, completions)


@router.get("/v1/models")
def list_models(key: IngestKey, conn: TenantConn) -> dict[str, Any]:
    """The caller tenant's routes, then its fine-tuned models, as OpenAI models (call them by
    this id)."""
    rows = conn.execute(
        "SELECT name, base_model, created_at FROM serve.route WHERE tenant_id = %s ORDER BY name",
        (key.tenant_id,),
    ).fetchall()
    data = [
        {
            "id": r["name"],
            "object": "model",
            "created": int(r["created_at"].timestamp()),
            "owned_by": "cft",
            "root": r["base_model"],
            "parent": None,
        }
        for r in rows
    ]
    tuned = conn.execute(
        "SELECT j.fine_tuned_model, j.route, r.finished_at, a.base_model, t.name AS tenant"
        " FROM train.fine_tuning_job j"
        " JOIN train.training_run r ON r.id = j.training_run_id AND r.status = 'succeeded'"
        " JOIN serve.adapter a ON a.id = r.adapter_id"
        " JOIN tenant t ON t.id = j.tenant_id"
        " WHERE j.tenant_id = %s AND a.status IN ('candidate', 'canary', 'prod')"
        " AND a.tainted_at IS NULL ORDER BY r.finished_at, j.id",
        (key.tenant_id,),
    ).fetchall()
    data += [
        {
            "id": r["fine_tuned_model"],
            "object": "model",
            "created": int(r["finished_at"].timestamp()),
            "owned_by": r["tenant"],
            "root": r["base_model"],
            "parent": r["route"],
        }
        for r in tuned
    ]
    return {"object": "list", "data": data}
