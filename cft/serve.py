"""The API process's application: app.main's, with the reconciler running beside the router.

`cft serve` and `cft run` serve this (and `uvicorn cft.serve:create_app --factory`); app/
never imports workers/, so the reconciler is injected here.
"""

from __future__ import annotations

from fastapi import FastAPI

from app import main
from app.core.config import Settings
from workers.reconciler.reconciler import in_router


def create_app(
    settings: Settings | None = None,
    *,
    db_url: str | None = None,
    engine_urls: list[str] | None = None,
) -> FastAPI:
    """The control plane and router; given engines, a reconciler keeps their adapters loaded."""
    return main.create_app(settings, db_url=db_url, engine_urls=engine_urls, reconciler=in_router)
