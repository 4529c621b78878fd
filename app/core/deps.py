"""FastAPI dependencies shared by every domain: the pool and the per-request connection."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import psycopg
from fastapi import Depends, Request
from psycopg_pool import PoolTimeout

from app.core.db import Connection, Pool
from app.core.errors import Unavailable


def get_pool(request: Request) -> Pool:
    """The application's connection pool."""
    pool: Pool = request.app.state.pool
    return pool


def get_conn(pool: Annotated[Pool, Depends(get_pool)]) -> Iterator[Connection]:
    """One connection and one transaction per request (committed when the handler returns)."""
    try:
        with pool.connection() as conn, conn.transaction():
            yield conn
    except (PoolTimeout, psycopg.OperationalError) as exc:
        raise Unavailable(
            f"the database is unavailable: {str(exc).splitlines()[0] if str(exc) else exc}",
            headers={"Retry-After": "1"},
        ) from exc


Conn = Annotated[Connection, Depends(get_conn, scope="function")]  # commit before responding
