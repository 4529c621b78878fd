"""HTTP of OTLP ingestion: POST /v1/traces (OTLP/HTTP, protobuf or JSON, gzip accepted)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from starlette.concurrency import run_in_threadpool

from app.core.auth import IngestKey
from app.core.config import Settings
from app.core.db import Pool, tenant_transaction
from app.core.deps import get_pool
from app.core.errors import database_required
from app.otel import service

router = APIRouter(tags=["opentelemetry"])

PoolDep = Annotated[Pool, Depends(get_pool)]


def _ingest(
    pool: Pool,
    tenant_id: int,
    body: bytes,
    headers: dict[str, str | None],
    settings: Settings,
) -> service.Outcome:
    # Decompression and decoding are CPU work: here, in a worker thread, never on the event
    # loop. Spans per export are capped like records per POST /v1/logs.
    raw = service.decompress(body, headers["content-encoding"], max_bytes=settings.max_body_bytes)
    request = service.parse(raw, headers["content-type"], max_spans=settings.max_batch_records)
    default_route = headers["x-cft-route"] or None
    # Committed before the response is written: an acknowledged span is durable.
    with database_required(), tenant_transaction(pool, tenant_id) as conn:
        return service.ingest(
            conn,
            tenant_id=tenant_id,
            request=request,
            default_route=default_route,
            settings=settings,
        )


@router.post(
    "/v1/traces",
    summary="OTLP/HTTP trace export (OpenTelemetry GenAI spans)",
    description=(
        "An OTLP ExportTraceServiceRequest as application/x-protobuf or application/json"
        " (Content-Encoding gzip accepted), authenticated with an ingest key. GenAI chat spans"
        " become log records (idempotent by span), other spans are skipped; rejected spans are"
        " counted in partial_success with the reason. The route comes from the span or"
        " resource attribute cft.route, else the X-Cft-Route header. At most"
        " CFT_MAX_BATCH_RECORDS spans per export (413). See docs/opentelemetry.md."
    ),
    response_class=Response,
)
async def post_traces(request: Request, key: IngestKey, pool: PoolDep) -> Response:
    """Ingest the GenAI chat spans of an OTLP trace export."""
    settings: Settings = request.app.state.settings
    content_type = request.headers.get("content-type")
    headers = {
        name: request.headers.get(name)
        for name in ("content-encoding", "content-type", "x-cft-route")
    }
    body = await request.body()
    outcome = await run_in_threadpool(_ingest, pool, key.tenant_id, body, headers, settings)
    kind = service.PROTOBUF if service.PROTOBUF in (content_type or "") else service.JSON
    return Response(
        service.response_body(outcome, kind),
        media_type=kind,
        headers={
            "X-Cft-Spans-Inserted": str(outcome.inserted),
            "X-Cft-Spans-Existing": str(outcome.existing),
            "X-Cft-Spans-Skipped": str(outcome.skipped),
            "X-Cft-Spans-Rejected": str(len(outcome.rejected)),
        },
    )
