"""Pydantic I/O of the operator API (/v1/tenants)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class TenantIn(BaseModel):
    """A tenant to create."""

    name: str = Field(
        min_length=1,
        max_length=63,
        description="lower-case letters, digits, '_', '.' or '-', starting with a letter or digit",
    )
    consent_training: bool = Field(False, description="its traffic may enter training sets")


class TenantPatch(BaseModel):
    """What an operator may change on a tenant."""

    consent_training: bool = Field(description="its traffic may enter training sets (from now on)")


class TenantOut(BaseModel):
    """A tenant."""

    id: int
    name: str
    consent_training: bool
    created_at: datetime
    updated_at: datetime | None = None
    live_keys: int = 0


class TenantList(BaseModel):
    """Every tenant."""

    data: list[TenantOut]


class KeyIn(BaseModel):
    """A key to create for a tenant; its role is checked against the tenant roles."""

    role: str = Field(description="ingest, client, trainer, release, reader or admin")
    name: str | None = Field(None, max_length=200, description="a label, e.g. the service")


class KeyOut(BaseModel):
    """A key as listed: never the key itself, only its prefix."""

    id: int
    role: str
    prefix: str
    name: str | None = None
    created_at: datetime
    revoked_at: datetime | None = None
    last_used_at: datetime | None = Field(
        default=None, description="When it last authenticated a request, to the minute; null: never"
    )


class KeyCreated(KeyOut):
    """A new key: `key` is shown this once; only its sha256 is stored."""

    tenant: str
    key: str


class KeyList(BaseModel):
    """A tenant's keys, live and revoked."""

    data: list[KeyOut]


class ArtefactsOut(BaseModel):
    """The offboarded adapters' artefacts in the store."""

    deleted: list[str]
    pending: list[str] = Field(description="still to delete: call the offboarding again")
    errors: list[str] = Field(description="why a pending artefact could not be deleted this time")


class OffboardingOut(BaseModel):
    """What offboarding a tenant removed (the audit row of auth.tenant_offboarding)."""

    id: int
    tenant: str
    tenant_id: int
    status: Literal["unloading", "artefacts", "done"]
    requested_by: str
    retired_adapters: list[str] = Field(description="canary and prod adapters taken out first")
    forced: bool
    counts: dict[str, int] = Field(description="rows removed per table")
    artefacts: ArtefactsOut
    started_at: datetime
    data_deleted_at: datetime | None
    finished_at: datetime | None
