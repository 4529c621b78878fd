"""HTTP routes of the adapter registry and the promotion gate (rules in service.py and SQL)."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile

from app.adapters import archive, imports, schemas
from app.adapters import service as adapters
from app.core import artefacts
from app.core.auth import (
    AdminKey,
    ApiKey,
    ReaderKey,
    ReleaseKey,
    TenantConn,
    TrainerKey,
    require,
)
from app.core.config import Settings
from app.core.db import Pool, tenant_transaction
from app.core.deps import get_pool
from app.core.errors import Unprocessable, database_required
from app.datasets.methods import Method

router = APIRouter(tags=["adapters"])

# The upload's path: its body limit is CFT_ADAPTER_IMPORT_MAX_BYTES (app/main.py), not the
# API's CFT_MAX_BODY_BYTES.
IMPORT_PATH = "/v1/adapters"
MAX_METADATA_CHARS = 4096

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


def _metadata(raw: str | None) -> dict[str, Any]:
    if raw is None or not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Unprocessable(f"metadata is not JSON: {exc}", param="metadata") from exc
    if not isinstance(value, dict):
        raise Unprocessable("metadata must be a JSON object", param="metadata")
    return value


def _sha256(upload: UploadFile) -> str:
    h = hashlib.sha256()
    upload.file.seek(0)
    while chunk := upload.file.read(1 << 20):
        h.update(chunk)
    upload.file.seek(0)
    return h.hexdigest()


@router.post(IMPORT_PATH, status_code=201)
def import_adapter(
    request: Request,
    key: TrainerKey,
    pool: Annotated[Pool, Depends(get_pool)],
    file: Annotated[
        UploadFile,
        File(
            description="The adapter: a .tar.gz, .tar or .zip of the folder PEFT's"
            " save_pretrained wrote (adapter_config.json, adapter_model.safetensors)."
        ),
    ],
    route: Annotated[str, Form(min_length=1, max_length=128, description="Its route.")],
    method: Annotated[Method, Form(description="How it was trained.")],
    base_model: Annotated[
        str | None,
        Form(max_length=512, description="The base it was trained on: the route's (default)."),
    ] = None,
    dataset_snapshot_id: Annotated[
        UUID | None,
        Form(description="The cft snapshot it was trained on (its held-out split is scored)."),
    ] = None,
    metadata: Annotated[
        str | None,
        Form(max_length=MAX_METADATA_CHARS, description="A JSON object kept with the adapter."),
    ] = None,
) -> schemas.AdapterOut:
    """Import an adapter trained elsewhere: checked like cft's own (the engines' contract, the
    route's base), stored and registered as a candidate (201); 4xx naming each problem, with
    nothing stored, otherwise."""
    settings: Settings = request.app.state.settings
    store = artefacts.get_store(settings)
    name = (file.filename or "adapter")[:200]
    spec = imports.ImportSpec(
        route=route,
        method=method,
        base_model=base_model,
        dataset_snapshot_id=str(dataset_snapshot_id) if dataset_snapshot_id else None,
        metadata=_metadata(metadata),
        origin=f"upload {name} (sha256 {_sha256(file)})",
        actor=_actor(key),
    )
    row: schemas.AdapterOut | None = None
    with tempfile.TemporaryDirectory(prefix="cft-import-") as tmp:
        work = Path(tmp)
        source = archive.unpack(
            file.file, work / "upload", max_bytes=settings.adapter_import_max_bytes
        )
        try:
            with database_required(), tenant_transaction(pool, key.tenant_id) as conn:
                row = imports.import_adapter(
                    conn,
                    tenant_id=key.tenant_id,
                    source_dir=source,
                    spec=spec,
                    store=store,
                    settings=settings,
                    work=work,
                )
        except BaseException:
            if row is not None:  # registered, but the commit failed: remove what was stored
                imports.discard(store, row)
            raise
    assert row is not None
    return row


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
