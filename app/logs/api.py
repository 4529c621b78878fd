"""HTTP of the logs API: POST /v1/logs, feedback, and reads for dashboards."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

import orjson
from fastapi import APIRouter, Depends, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from app.core.auth import IngestKey, ReaderKey, TenantConn
from app.core.config import Settings
from app.core.db import Pool, tenant_transaction
from app.core.deps import get_pool
from app.core.errors import BadRequest, Unprocessable, database_required
from app.core.metrics import LOG_REJECTED
from app.logs import service
from app.logs.schemas import FeedbackIn, LogBatchOut

router = APIRouter(prefix="/v1/logs", tags=["logs"])

# How long feedback waits for a record still queued in this process's router log writer.
FEEDBACK_WAIT_S = 5.0

PoolDep = Annotated[Pool, Depends(get_pool)]


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _ingest(pool: Pool, tenant_id: int, payload: Any, settings: Settings) -> dict[str, Any]:
    records, batch = service.records_of(payload, max_records=settings.max_batch_records)
    prepared = service.prepare(records, settings=settings, batch=batch)
    # The transaction commits before the response is written: an acknowledged row is durable.
    with database_required(), tenant_transaction(pool, tenant_id) as conn:
        statuses = service.insert_prepared(conn, tenant_id=tenant_id, prepared=prepared)
    return service.summarize(prepared.request_ids, statuses)


@router.post(
    "",
    response_model=LogBatchOut,
    summary="Log one record or a batch",
    description=(
        'Body: one log record, or `{"records": [...]}` with at most CFT_MAX_BATCH_RECORDS'
        " (default 1000) records and CFT_MAX_BODY_BYTES (default 8 MiB). Idempotent by"
        " request_id; atomic: every record is inserted or reported existing, or none is."
    ),
)
async def post_logs(request: Request, key: IngestKey, pool: PoolDep) -> Response:
    """Log inference records (idempotent by request_id, atomic per batch)."""
    body = await request.body()
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        LOG_REJECTED.labels("bad_json").inc()
        raise BadRequest(f"the body is not valid JSON: {exc}", code="invalid_json") from None
    result = await run_in_threadpool(
        _ingest, pool, key.tenant_id, payload, request.app.state.settings
    )
    return _json(result)


@router.post("/{request_id}/feedback", summary="Feedback on a logged request")
def post_feedback(
    request_id: UUID, body: FeedbackIn, key: IngestKey, conn: TenantConn, request: Request
) -> Response:
    """Record thumbs, a regeneration or an edit for a logged request."""
    # A call this process's router answered moments ago may still sit in its log writer's
    # queue: wait for that write (bounded) instead of answering 404.
    runtime = getattr(request.app.state, "router", None)
    if runtime is not None:
        runtime.writer.wait_written(str(request_id), timeout=FEEDBACK_WAIT_S)
        if body.regenerated_by is not None:
            runtime.writer.wait_written(str(body.regenerated_by), timeout=FEEDBACK_WAIT_S)
    if (
        body.thumbs is None
        and body.regenerated is None
        and body.regenerated_by is None
        and body.edited_completion is None
    ):
        raise Unprocessable(
            "give at least one of thumbs (-1, 0, 1), regenerated (+ regenerated_by)"
            " or edited_completion",
            param="body",
        )
    if body.edited_completion is not None and "\x00" in body.edited_completion:
        raise Unprocessable(
            "edited_completion must not contain NUL characters", param="edited_completion"
        )
    row = service.give_feedback(
        conn,
        tenant_id=key.tenant_id,
        request_id=str(request_id),
        thumbs=body.thumbs,
        regenerated=body.regenerated,
        regenerated_by=str(body.regenerated_by) if body.regenerated_by else None,
        edited_completion=body.edited_completion,
    )
    return _json(row)


@router.get("/{request_id}", summary="One logged request")
def read_log(request_id: UUID, key: ReaderKey, conn: TenantConn) -> Response:
    """Return one logged request of the caller's tenant."""
    return _json(
        service.get_log_or_raise(conn, tenant_id=key.tenant_id, request_id=str(request_id))
    )


@router.get("", summary="Logged requests, oldest first, paginated")
def list_logs(
    key: ReaderKey,
    conn: TenantConn,
    route: str | None = None,
    adapter_id: str | None = None,
    since: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: str | None = None,
) -> Response:
    """A page of the caller's logs; pass next_cursor back as cursor for the next page."""
    return _json(
        service.list_logs(
            conn,
            tenant_id=key.tenant_id,
            route=route,
            adapter_id=adapter_id,
            since=since,
            limit=limit,
            cursor=cursor,
        )
    )
