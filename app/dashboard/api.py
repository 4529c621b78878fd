"""Every dashboard page, under /dashboard (HTML, not in the OpenAPI schema)."""

from __future__ import annotations

from fastapi import APIRouter

from app.dashboard import calls, evals, experiments, lineage, login, overview, runs, snapshots

router = APIRouter(include_in_schema=False)
for _page in (login, overview, experiments, runs, evals, snapshots, calls, lineage):
    router.include_router(_page.router)
