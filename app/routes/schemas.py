"""Request and response bodies of the routes API."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Fallback = Literal["none", "prod", "base"]
FALLBACK = (
    "What answers a call whose assigned adapter cannot (not loaded on any engine after the"
    " router's wait, or failed on each): none (a 503 adapter_not_loaded with Retry-After), prod"
    " (the route's prod), base (prod, then the base model). A fallback answer belongs to no arm"
    " of an experiment."
)


class RouteCreate(BaseModel):
    """A new route."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
    base_model: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="One of the served base models (CFT_BASE_MODELS); default: CFT_BASE_MODEL.",
    )
    experiment: str | None = Field(None, max_length=128, description="Canary split salt.")
    fallback: Fallback = Field("none", description=FALLBACK)


class RouteUpdate(BaseModel):
    """What a release manager may change on a route."""

    model_config = ConfigDict(extra="forbid")

    fallback: Fallback = Field(description=FALLBACK)


class RouteOut(BaseModel):
    """A route."""

    name: str
    tenant_id: int
    base_model: str
    experiment: str | None
    fallback: Fallback
    created_at: datetime
