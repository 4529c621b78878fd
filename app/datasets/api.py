"""HTTP endpoints of the datasets domain."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from app.core.auth import ReaderKey, TenantConn, TrainerKey
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


@router.get("/snapshots/{snapshot_id}/export")
def export_snapshot(
    snapshot_id: str,
    conn: TenantConn,
    key: ReaderKey,
    split: Literal["train", "eval"] = Query("train"),
) -> StreamingResponse:
    """One split as JSONL in TRL's conversational format."""
    datasets.get_snapshot_or_raise(conn, snapshot_id=snapshot_id, tenant_id=key.tenant_id)
    # Read inside the request's transaction; the response streams the finished lines.
    lines = list(
        datasets.jsonl_lines(datasets.iter_examples(conn, snapshot_id=snapshot_id, split=split))
    )

    def body() -> Iterator[str]:
        yield from lines

    return StreamingResponse(
        body(),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": f'attachment; filename="{snapshot_id}-{split}.jsonl"'},
    )
