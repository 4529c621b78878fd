"""FastAPI dependencies shared by every domain: the pool and the per-request connection."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request

from app.core.db import Connection, Pool
from app.core.errors import database_required


def get_pool(request: Request) -> Pool:
    """The application's connection pool."""
    pool: Pool = request.app.state.pool
    return pool


def get_conn(pool: Annotated[Pool, Depends(get_pool)]) -> Iterator[Connection]:
    """One connection and one transaction per request (committed when the handler returns)."""
    with database_required(detail=True), pool.connection() as conn, conn.transaction():
        yield conn


Conn = Annotated[Connection, Depends(get_conn, scope="function")]  # commit before responding
