"""The files under sql/: the database as it is now, state (sql/state/) then code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
# Files under this folder of sql/ are state (what holds data); every other file is code.
STATE_PREFIX = "state/"


def manifest(sql_dir: Path = SQL_DIR) -> list[str]:
    """The files of sql/, in the order an empty database applies them."""
    lines = (line.strip() for line in (sql_dir / "manifest.txt").read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def state_files(sql_dir: Path = SQL_DIR) -> list[str]:
    """The state files (schemas, roles, tables, types, indexes, first rows), in manifest order."""
    return [p for p in manifest(sql_dir) if p.startswith(STATE_PREFIX)]


def code_files(sql_dir: Path = SQL_DIR) -> list[str]:
    """The code files (functions, views, triggers, policies, grants, comments), in order."""
    return [p for p in manifest(sql_dir) if not p.startswith(STATE_PREFIX)]


def render(relpath: str, *, embedding_dim: int, root: Path = SQL_DIR) -> str:
    """Return the text of root/<relpath> (sql/ by default) with its placeholders filled."""
    text = (root / relpath).read_text()
    return text.replace("__EMBEDDING_DIM__", str(int(embedding_dim)))


def apply_files(
    dbapi_conn: Any, relpaths: list[str], *, embedding_dim: int, sql_dir: Path = SQL_DIR
) -> None:
    """Run files of sql/ in the given order, one batch each."""
    for relpath in relpaths:
        try:
            dbapi_conn.execute(render(relpath, embedding_dim=embedding_dim, root=sql_dir))
        except Exception as exc:
            raise RuntimeError(f"sql/{relpath} failed: {exc}") from exc


def apply_schema(dbapi_conn: Any, *, embedding_dim: int, sql_dir: Path = SQL_DIR) -> None:
    """Create the whole schema on an empty database: the state files, then the code files."""
    apply_files(dbapi_conn, state_files(sql_dir), embedding_dim=embedding_dim, sql_dir=sql_dir)
    apply_files(dbapi_conn, code_files(sql_dir), embedding_dim=embedding_dim, sql_dir=sql_dir)
