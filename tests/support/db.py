"""The test database: one embedded PostgreSQL per session, a migrated template, fresh clones."""

from __future__ import annotations

import itertools
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import psycopg

from app.core import embedded
from app.core.db import migrate

TEMPLATE = "cft_template"
# Tests trade durability for speed; production keeps fsync on.
TEST_TUNING = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}

_counter = itertools.count()
_lock = threading.Lock()


def with_database(url: str, dbname: str) -> str:
    """The same server URL pointing at another database."""
    base, _, query = url.partition("?")
    head = base.rsplit("/", 1)[0]
    return f"{head}/{quote(dbname)}" + (f"?{query}" if query else "")


def start_server() -> tuple[Path, str]:
    """Start a throw-away embedded server (or use CFT_TEST_DATABASE_URL) and return its URL."""
    external = os.environ.get("CFT_TEST_DATABASE_URL")
    if external:
        return Path("/nonexistent"), external
    pgdata = Path(tempfile.mkdtemp(prefix="cft-test-")) / "pg"
    return pgdata, embedded.start(pgdata, tuning=TEST_TUNING)


def build_template(server_url: str) -> str:
    """Create and migrate the template database; return its URL."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
    url = with_database(server_url, TEMPLATE)
    migrate(url)
    return url


def clone(server_url: str, name: str | None = None) -> str:
    """A fresh database cloned from the migrated template; returns its URL."""
    with _lock:
        dbname = name or f"t_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}" TEMPLATE "{TEMPLATE}"')
    return with_database(server_url, dbname)


def drop(server_url: str, url: str) -> None:
    """Drop a database made by clone()."""
    dbname = url.partition("?")[0].rsplit("/", 1)[1]
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


@contextmanager
def dedicated_server(
    prefix: str, *, tuning: dict[str, str] | None = None
) -> Iterator[tuple[Path, str]]:
    """A migrated embedded server of a test's own, for tests that stop and restart PostgreSQL."""
    pgdata = Path(tempfile.mkdtemp(prefix=prefix)) / "pg"
    url = embedded.start(pgdata, tuning=tuning)
    migrate(url)
    try:
        yield pgdata, url
    finally:
        embedded.stop(pgdata, mode="immediate")
