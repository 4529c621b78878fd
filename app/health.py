"""Liveness and versions (no API key needed). Prometheus metrics are on their own port
(app.core.metrics.serve_metrics), not this one."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app import __version__
from app.core.db import server_versions
from app.core.deps import Conn

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(conn: Conn) -> dict[str, Any]:
    """Report that the API and its database answer, with their versions."""
    versions = server_versions(conn)
    return {"status": "ok", "version": __version__, "database": versions}
