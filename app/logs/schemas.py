"""Pydantic I/O of the logs API (the batch body itself is validated by service.prepare)."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field


class FeedbackIn(BaseModel):
    """Feedback on one logged request; give at least one field."""

    model_config = ConfigDict(extra="forbid")

    thumbs: Annotated[int, Field(strict=True, ge=-1, le=1)] | None = Field(
        None, description="-1 (bad), 0 (neutral) or 1 (good)."
    )
    regenerated: Annotated[bool, Field(strict=True)] | None = Field(
        None, description="The user asked for another answer."
    )
    regenerated_by: UUID | None = Field(
        None, description="request_id of the regenerated answer (linked through parent_id)."
    )
    edited_completion: Annotated[str, Field(max_length=1_000_000)] | None = Field(
        None, description="The completion as the user corrected it (sets fb_edited)."
    )


class LogResult(BaseModel):
    """The outcome of one record."""

    request_id: str
    status: str = Field(description="inserted or existing")


class LogBatchOut(BaseModel):
    """Response of POST /v1/logs."""

    inserted: int
    existing: int
    records: list[LogResult]
