"""Pydantic I/O of the privacy API."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class ForgetIn(BaseModel):
    """A user to forget, by the id the product sent as `user` when logging."""

    user: str = Field(min_length=1, max_length=256, description="the raw user id (never stored)")


class ForgetOut(BaseModel):
    """What forgetting a user did (the audit row of auth.forget_request)."""

    id: int
    user_hash: str = Field(description="hex of the HMAC-SHA256 pseudonym; the raw id is not kept")
    logs_deleted: int
    request_keys_deleted: int
    snapshots_tainted: int
    adapters_tainted: int
    created_at: datetime
