"""Migrations and sql/ agree: baseline + deltas give the catalog a fresh apply of sql/ gives."""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory

from app.core.config import get_settings
from app.core.db import downgrade, migrate
from app.core.sqlfiles import SQL_DIR, apply_schema, manifest
from tests.support import db as testdb
from tests.support.catalog import catalog, differences

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ROOT / "migrations" / "versions"
# The commit whose sql/ the baseline migration (20261201) is.
BASELINE_COMMIT = "0006e75"


def _revisions() -> list[tuple[str, str | None]]:
    """(revision, down_revision) of every migration, oldest first."""
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    scripts = list(ScriptDirectory.from_config(cfg).walk_revisions())
    return [(s.revision, s.down_revision) for s in reversed(scripts)]  # type: ignore[misc]


@pytest.fixture
def new_db(pg_server) -> Iterator[str]:
    """An empty database of this test's own."""
    name = f"mig_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = testdb.with_database(pg_server, name)
    yield url
    testdb.drop(pg_server, url)


@pytest.fixture(scope="module")
def fresh_catalog(pg_server) -> dict:
    """The catalog of sql/ applied in manifest order to an empty database (no alembic)."""
    name = f"fresh_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = testdb.with_database(pg_server, name)
    try:
        with psycopg.connect(url) as conn:
            apply_schema(conn, embedding_dim=get_settings().embedding_dim)
        return catalog(url)
    finally:
        testdb.drop(pg_server, url)


def _without_alembic(cat: dict) -> dict:
    return {k: {r for r in rows if "alembic_version" not in str(r)} for k, rows in cat.items()}


def test_manifest_names_every_file_of_sql_once():
    files = sorted(str(p.relative_to(SQL_DIR)) for p in SQL_DIR.rglob("*.sql"))
    assert sorted(manifest()) == files
    assert len(set(manifest())) == len(manifest())


def test_sql_names_carry_no_version_suffix():
    # A suffix lives only while an upgrade needs old and new side by side: none does now.
    versioned = re.compile(r"\b[a-z][a-z0-9_]*_v[0-9]+\b")
    hits = [f"{p}: {m}" for p in SQL_DIR.rglob("*.sql") for m in versioned.findall(p.read_text())]
    assert hits == []


def test_cft_migrate_creates_an_empty_database_from_sql_at_head(new_db, fresh_catalog):
    migrate(new_db)
    assert differences(_without_alembic(catalog(new_db)), fresh_catalog) == []
    with psycopg.connect(new_db) as c:
        assert c.execute("SELECT version_num FROM alembic_version").fetchone() == (
            _revisions()[-1][0],
        )


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout


def test_upgrade_from_the_baseline_equals_fresh_apply_of_sql(new_db, fresh_catalog):
    """The baseline's schema (sql/ at the commit that made it) + every delta == sql/ now."""
    try:
        files = [
            line.strip()
            for line in _git("show", f"{BASELINE_COMMIT}:sql/manifest.txt").splitlines()
            if line.strip() and not line.startswith("#")
        ]
    except (OSError, subprocess.CalledProcessError) as exc:  # no git, or a shallow clone
        pytest.skip(f"the baseline commit {BASELINE_COMMIT} is not in this checkout: {exc}")
    dim = str(get_settings().embedding_dim)
    with psycopg.connect(new_db) as c:
        for relpath in files:
            c.execute(
                _git("show", f"{BASELINE_COMMIT}:sql/{relpath}").replace("__EMBEDDING_DIM__", dim)
            )
        c.execute("SELECT obs.create_partitions(4, now() - interval '7 days')")
        c.execute("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        c.execute("INSERT INTO alembic_version VALUES (%s)", (_revisions()[0][0],))
    migrate(new_db)
    assert differences(_without_alembic(catalog(new_db)), fresh_catalog) == []


def test_every_migration_downgrades_and_upgrades_again(new_db, fresh_catalog):
    migrate(new_db)
    for revision, down in reversed(_revisions()):
        downgrade(new_db, down or "base")
        migrate(new_db)
        assert differences(_without_alembic(catalog(new_db)), fresh_catalog) == [], revision
    downgrade(new_db, "base")
    with psycopg.connect(new_db) as c:
        assert c.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname IN ('obs','serve','train','auth','stats')"
        ).fetchone() == (0,)
        assert c.execute("SELECT to_regclass('public.tenant')").fetchone() == (None,)
        assert c.execute(
            "SELECT count(*) FROM pg_extension WHERE extname = 'vector'"
        ).fetchone() == (0,)
    migrate(new_db)
    assert differences(_without_alembic(catalog(new_db)), fresh_catalog) == []


def test_the_baseline_creates_partitions_ahead(new_db):
    migrate(new_db)
    with psycopg.connect(new_db) as c:
        assert c.execute("SELECT count(*) FROM obs.inference_log_partition").fetchone()[0] >= 5


def test_migrations_after_the_baseline_freeze_their_own_sql():
    (baseline,) = [r for r, down in _revisions() if down is None]
    for path in VERSIONS.glob("*.py"):
        text = path.read_text()
        if f'revision = "{baseline}"' in text:
            continue
        assert "sqlfiles" not in text and "sql/" not in text, (
            f"{path.name} reads sql/: a migration carries its own delta SQL"
        )


def test_a_database_from_before_the_rebase_is_refused_readably(new_db):
    with psycopg.connect(new_db, autocommit=True) as c:
        c.execute("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        c.execute("INSERT INTO alembic_version VALUES ('0016')")
    with pytest.raises(RuntimeError, match="before the schema was rebased"):
        migrate(new_db)
