"""HTTP endpoints of the datasets domain."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response, StreamingResponse

from app.core.auth import ReaderKey, TenantConn, TrainerKey
from app.datasets import formats
from app.datasets import service as datasets
from app.datasets.schemas import SnapshotCreate, SnapshotOut

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


@router.post("/snapshots", status_code=201)
def create_snapshot(body: SnapshotCreate, conn: TenantConn, key: TrainerKey) -> SnapshotOut:
    """Freeze the caller's traffic on one route into an immutable, deduplicated snapshot."""
    return datasets.create_snapshot(
        conn,
        tenant_id=key.tenant_id,
        route=body.route,
        method=body.method,
        since=body.since,
        until=body.until,
        dedup_threshold=body.dedup_threshold,
        eval_pct=body.eval_pct,
        neighbours=body.neighbours,
        created_by=f"api-key:{key.prefix}",
        refresh=body.refresh,
    )


@router.get("/snapshots/{snapshot_id}")
def read_snapshot(snapshot_id: str, conn: TenantConn, key: ReaderKey) -> SnapshotOut:
    """One snapshot of the caller's tenant."""
    return datasets.get_snapshot_or_raise(conn, snapshot_id=snapshot_id, tenant_id=key.tenant_id)


@router.get(
    "/snapshots/{snapshot_id}/export",
    response_class=Response,
    responses={
        200: {
            "description": "The split: JSONL, or a Parquet file for format=parquet.",
            "content": {formats.JSONL_MEDIA_TYPE: {}, formats.PARQUET_MEDIA_TYPE: {}},
        }
    },
)
def export_snapshot(
    snapshot_id: str,
    conn: TenantConn,
    key: ReaderKey,
    split: Literal["train", "eval"] = Query("train"),
    format: formats.Format = Query(
        "cft",
        description="cft (the stored TRL conversational examples), trl-conversational (sft),"
        " trl-preference (dpo, orpo, simpo), trl-unpaired-preference (kto), openai-chat (sft),"
        " openai-preference (dpo, orpo, simpo) or parquet (a Parquet file of the split); a"
        " format that does not fit the snapshot's method is a 400 naming those that do.",
    ),
) -> Response:
    """One split in a format other trainers read (JSONL, or Parquet)."""
    name = f"{snapshot_id}-{split}"
    if format == "parquet":
        data = datasets.export_parquet(
            conn, snapshot_id=snapshot_id, split=split, tenant_id=key.tenant_id
        )
        return Response(
            data,
            media_type=formats.PARQUET_MEDIA_TYPE,
            headers={"Content-Disposition": f'attachment; filename="{name}.parquet"'},
        )
    # Read inside the request's transaction; the response streams the finished lines.
    lines = datasets.export_lines(
        conn, snapshot_id=snapshot_id, split=split, fmt=format, tenant_id=key.tenant_id
    )

    def body() -> Iterator[str]:
        yield from lines

    return StreamingResponse(
        body(),
        media_type=formats.JSONL_MEDIA_TYPE,
        headers={"Content-Disposition": f'attachment; filename="{name}.jsonl"'},
    )
