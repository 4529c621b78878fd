"""The files under sql/: the database as it is now, applied in manifest order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
MANIFEST = SQL_DIR / "manifest.txt"


def manifest() -> list[str]:
    """The files of sql/, in the order an empty database applies them."""
    lines = (line.strip() for line in MANIFEST.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def render(relpath: str, *, embedding_dim: int) -> str:
    """Return the text of sql/<relpath> with its placeholders filled."""
    text = (SQL_DIR / relpath).read_text()
    return text.replace("__EMBEDDING_DIM__", str(int(embedding_dim)))


def apply_schema(dbapi_conn: Any, *, embedding_dim: int) -> None:
    """Create the whole schema on an empty database: every manifest file, one batch each."""
    for relpath in manifest():
        try:
            dbapi_conn.execute(render(relpath, embedding_dim=embedding_dim))
        except Exception as exc:
            raise RuntimeError(f"sql/{relpath} failed: {exc}") from exc
