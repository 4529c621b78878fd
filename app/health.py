"""Liveness, versions and Prometheus metrics (no API key needed)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app import __version__
from app.core.db import server_versions
from app.core.deps import Conn
from app.core.metrics import REGISTRY

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(conn: Conn) -> dict[str, Any]:
    """Report that the API and its database answer, with their versions."""
    versions = server_versions(conn)
    return {"status": "ok", "version": __version__, "database": versions}


@router.get("/metrics", response_class=Response)
def metrics() -> Response:
    """Prometheus text exposition."""
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
