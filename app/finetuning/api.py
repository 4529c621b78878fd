"""HTTP of the OpenAI fine-tuning API: /v1/files, /v1/fine_tuning/jobs (docs/openai-fine-tuning.md).

Uploading, deleting, creating and cancelling need a trainer key; reading, a reading key. Errors
are OpenAI's shape like every other cft error.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import Response

from app.core.auth import ReaderKey, TenantConn, TrainerKey
from app.finetuning import files, service
from app.finetuning.schemas import (
    FileDeleted,
    FileList,
    FileObject,
    FineTuningJob,
    JobCheckpointList,
    JobCreate,
    JobEventList,
    JobList,
)

router = APIRouter(tags=["fine-tuning"])

Cursor = Annotated[str | None, Query(max_length=64, description="The last id of a page.")]


@router.post("/v1/files")
def upload_file(
    request: Request,
    conn: TenantConn,
    key: TrainerKey,
    file: Annotated[UploadFile, File(description="JSONL, one example per line.")],
    purpose: Annotated[str, Form(max_length=64, description="fine-tune")],
) -> FileObject:
    """Upload a fine-tuning file (OpenAI's chat or preference JSONL), checked line by line."""
    max_bytes = request.app.state.settings.file_max_bytes
    content = file.file.read(max_bytes + 1)
    return files.create(
        conn,
        tenant_id=key.tenant_id,
        filename=file.filename or "",
        purpose=purpose,
        content=content,
        max_bytes=max_bytes,
    )


@router.get("/v1/files")
def list_files(
    conn: TenantConn,
    key: ReaderKey,
    purpose: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
    after: Cursor = None,
) -> FileList:
    """The tenant's fine-tuning files."""
    return files.list_files(conn, purpose=purpose, limit=limit, after=after, order=order)


@router.get("/v1/files/{file_id}")
def read_file(file_id: str, conn: TenantConn, key: ReaderKey) -> FileObject:
    """One file."""
    return files.read(conn, file_id=file_id)


@router.delete("/v1/files/{file_id}")
def delete_file(file_id: str, conn: TenantConn, key: TrainerKey) -> FileDeleted:
    """Delete a file (jobs keep the examples they froze)."""
    return files.delete(conn, file_id=file_id)


@router.get(
    "/v1/files/{file_id}/content",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "The file."}},
)
def file_content(file_id: str, conn: TenantConn, key: ReaderKey) -> Response:
    """The file as uploaded."""
    row = files.get_or_raise(conn, file_id=file_id)
    return Response(bytes(row["content"]), media_type="application/octet-stream")


@router.post("/v1/fine_tuning/jobs")
def create_job(body: JobCreate, conn: TenantConn, key: TrainerKey) -> FineTuningJob:
    """Create a fine-tuning job: a training run on a snapshot of its files."""
    return service.create(conn, tenant_id=key.tenant_id, body=body, actor=f"key:{key.prefix}")


@router.get("/v1/fine_tuning/jobs")
def list_jobs(
    request: Request,
    conn: TenantConn,
    key: ReaderKey,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Cursor = None,
) -> JobList:
    """The tenant's jobs, newest first (filter with metadata[KEY]=VALUE)."""
    metadata = {
        k[len("metadata[") : -1]: v
        for k, v in request.query_params.items()
        if k.startswith("metadata[") and k.endswith("]")
    }
    return service.list_jobs(conn, limit=limit, after=after, metadata=metadata)


@router.get("/v1/fine_tuning/jobs/{fine_tuning_job_id}")
def read_job(fine_tuning_job_id: str, conn: TenantConn, key: ReaderKey) -> FineTuningJob:
    """One job with its status."""
    return service.get_or_raise(conn, job_id=fine_tuning_job_id)


@router.post("/v1/fine_tuning/jobs/{fine_tuning_job_id}/cancel")
def cancel_job(fine_tuning_job_id: str, conn: TenantConn, key: TrainerKey) -> FineTuningJob:
    """Cancel a queued or running job."""
    return service.cancel(conn, job_id=fine_tuning_job_id)


@router.get("/v1/fine_tuning/jobs/{fine_tuning_job_id}/events")
def job_events(
    fine_tuning_job_id: str,
    conn: TenantConn,
    key: ReaderKey,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    after: Cursor = None,
) -> JobEventList:
    """A job's events, newest first."""
    return service.events(conn, job_id=fine_tuning_job_id, limit=limit, after=after)


@router.get("/v1/fine_tuning/jobs/{fine_tuning_job_id}/checkpoints")
def job_checkpoints(
    fine_tuning_job_id: str,
    conn: TenantConn,
    key: ReaderKey,
    limit: Annotated[int, Query(ge=1, le=100)] = 10,
    after: Cursor = None,
) -> JobCheckpointList:
    """A job's checkpoints (the trained adapter)."""
    return service.checkpoints(conn, job_id=fine_tuning_job_id, limit=limit, after=after)
