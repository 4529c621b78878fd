"""Run the files under sql/ (migrations call this; released files are never edited)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"


def render(relpath: str, *, embedding_dim: int) -> str:
    """Return the text of sql/<relpath> with its placeholders filled."""
    text = (SQL_DIR / relpath).read_text()
    return text.replace("__EMBEDDING_DIM__", str(int(embedding_dim)))


def run_files(dbapi_conn: Any, relpaths: list[str], *, embedding_dim: int) -> None:
    """Execute each file as one simple-protocol batch on a psycopg connection."""
    for relpath in relpaths:
        sql = render(relpath, embedding_dim=embedding_dim)
        try:
            dbapi_conn.execute(sql)
        except Exception as exc:
            raise RuntimeError(f"sql/{relpath} failed: {exc}") from exc


def apply(relpaths: list[str]) -> None:
    """Inside an Alembic migration: run sql/ files on its connection."""
    from alembic import op

    from app.core.config import get_settings

    if relpaths:
        conn = op.get_bind().connection.driver_connection
        run_files(conn, relpaths, embedding_dim=get_settings().embedding_dim)


def execute(sql: str) -> None:
    """Inside an Alembic migration: run one SQL batch (simple protocol) on its connection."""
    from alembic import op

    if sql:
        conn: Any = op.get_bind().connection.driver_connection
        conn.execute(sql)
