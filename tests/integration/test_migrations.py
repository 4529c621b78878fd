"""cft migrate: sql/ on an empty database, state migrations and changed code on an existing one.

"State history + code" (sql/state/ at the baseline's commit, the migrations after it, then the
code of sql/) and "a fresh apply of sql/" give the same catalog, and so does an existing database after its code
changed.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from app.core import migrations
from app.core.config import get_settings
from app.core.db import migrate
from app.core.sqlfiles import (
    SQL_DIR,
    STATE_PREFIX,
    apply_files,
    apply_schema,
    code_files,
    manifest,
    state_files,
)
from tests.support import db as testdb
from tests.support import history
from tests.support.catalog import catalog, differences

DIM = get_settings().embedding_dim
UP_TO_DATE = "database up to date: no migration pending, code unchanged"
# What only code may create: a state file or a migration that does is caught below.
CODE = re.compile(
    r"\b(CREATE\s+(OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE|VIEW|MATERIALIZED\s+VIEW|TRIGGER"
    r"|CONSTRAINT\s+TRIGGER|POLICY)|GRANT|REVOKE|COMMENT\s+ON)\b",
    re.IGNORECASE,
)


def _new_database(pg_server: str) -> str:
    name = f"mig_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return testdb.with_database(pg_server, name)


@pytest.fixture
def new_db(pg_server: str) -> Iterator[str]:
    """An empty database of this test's own."""
    url = _new_database(pg_server)
    yield url
    testdb.drop(pg_server, url)


def _fresh_catalog(pg_server: str, sql_dir: Path = SQL_DIR) -> dict:
    """The catalog of sql/ applied in manifest order to an empty database (no cft migrate)."""
    url = _new_database(pg_server)
    try:
        with psycopg.connect(url) as conn:
            apply_schema(conn, embedding_dim=DIM, sql_dir=sql_dir)
        return catalog(url)
    finally:
        testdb.drop(pg_server, url)


@pytest.fixture(scope="module")
def fresh_catalog(pg_server: str) -> dict:
    return _fresh_catalog(pg_server)


def _copy(tmp_path: Path, folder: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def _recorded(url: str) -> dict[tuple[str, str], str]:
    with psycopg.connect(url) as c:
        rows = c.execute(f"SELECT kind, name, sha256 FROM {migrations.TRACKING_TABLE}").fetchall()
    return {(kind, name): sha for kind, name, sha in rows}


def test_manifest_names_every_file_of_sql_once() -> None:
    files = sorted(str(p.relative_to(SQL_DIR)) for p in SQL_DIR.rglob("*.sql"))
    assert sorted(manifest()) == files
    assert len(set(manifest())) == len(manifest())


def test_manifest_lists_the_state_then_the_code() -> None:
    kinds = [p.startswith(STATE_PREFIX) for p in manifest()]
    assert kinds == sorted(kinds, reverse=True)
    assert state_files() and code_files()


def test_sql_names_carry_no_version_suffix() -> None:
    # A suffix lives only while an upgrade needs old and new side by side: none does now.
    versioned = re.compile(r"\b[a-z][a-z0-9_]*_v[0-9]+\b")
    hits = [f"{p}: {m}" for p in SQL_DIR.rglob("*.sql") for m in versioned.findall(p.read_text())]
    assert hits == []


def test_state_files_and_migrations_carry_no_code() -> None:
    """Functions, views, triggers, policies, grants and comments live once, in a code file."""
    paths = [SQL_DIR / p for p in state_files()]
    paths += [migrations.MIGRATIONS_DIR / name for name in migrations.migration_names()]
    for path in paths:
        text = re.sub(r"--[^\n]*", "", path.read_text())
        assert not CODE.search(text), f"{path} holds code: {CODE.search(text)}"


def test_cft_migrate_creates_an_empty_database_from_sql(new_db, fresh_catalog) -> None:
    outcome = migrate(new_db)
    assert outcome.created and outcome.migrations == tuple(migrations.migration_names())
    assert differences(catalog(new_db), fresh_catalog) == []
    recorded = _recorded(new_db)
    assert {name for kind, name in recorded if kind == "state"} == set(outcome.migrations)
    assert {name for kind, name in recorded if kind == "code"} == set(code_files())
    with psycopg.connect(new_db) as c:
        # This week's partition and four ahead: no insert waits for maintenance.
        assert c.execute("SELECT count(*) FROM obs.inference_log_partition").fetchone()[0] >= 5


def test_migrations_are_numbered_once_from_the_baseline() -> None:
    names = migrations.migration_names()
    assert names[0] == migrations.BASELINE
    numbers = [name.split("_", 1)[0] for name in names]
    assert all(re.fullmatch(r"[0-9]{4}", n) for n in numbers), names
    assert [int(n) for n in numbers] == list(range(1, len(names) + 1)), names


def test_state_history_and_code_equal_a_fresh_apply_of_sql(new_db, fresh_catalog, tmp_path) -> None:
    """sql/state/ at the baseline's commit, the migrations after it, then the code of sql/.

    A state file changed without a migration fails here, once the baseline is committed.
    """
    baseline = history.sql_at_baseline(tmp_path)
    names = migrations.migration_names()
    with psycopg.connect(new_db) as c:
        apply_files(c, state_files(baseline), embedding_dim=DIM, sql_dir=baseline)
        c.execute(migrations.TRACKING_DDL)
        c.execute(
            f"INSERT INTO {migrations.TRACKING_TABLE} (kind, name, sha256) VALUES ('state', %s, '')",
            (migrations.BASELINE,),
        )
    outcome = migrate(new_db)
    assert outcome.migrations == tuple(names[1:])
    assert outcome.code == tuple(sorted(code_files()))
    assert differences(catalog(new_db), fresh_catalog) == []


def test_migrate_again_changes_nothing(new_db) -> None:
    migrate(new_db)
    objects = (
        "SELECT oid FROM pg_proc WHERE pronamespace::regnamespace::text = ANY (%(s)s)"
        " UNION ALL SELECT oid FROM pg_class WHERE relnamespace::regnamespace::text = ANY (%(s)s)"
        " UNION ALL SELECT oid FROM pg_trigger UNION ALL SELECT oid FROM pg_policy ORDER BY 1"
    )
    with psycopg.connect(new_db) as c:
        before = c.execute(objects, {"s": list(migrations.SCHEMAS)}).fetchall()
        stamps = c.execute(f"SELECT * FROM {migrations.TRACKING_TABLE} ORDER BY 1, 2").fetchall()
    assert str(migrate(new_db)) == UP_TO_DATE
    with psycopg.connect(new_db) as c:
        assert c.execute(objects, {"s": list(migrations.SCHEMAS)}).fetchall() == before
        assert c.execute(f"SELECT * FROM {migrations.TRACKING_TABLE} ORDER BY 1, 2").fetchall() == (
            stamps
        )


def test_every_code_file_applies_again_as_it_is(new_db, fresh_catalog) -> None:
    """Code files are idempotent (CREATE OR REPLACE, DROP ... IF EXISTS): psql -f reruns one."""
    migrate(new_db)
    with psycopg.connect(new_db) as c:
        apply_files(c, code_files(), embedding_dim=DIM)
    assert differences(catalog(new_db), fresh_catalog) == []


def _seed_candidate(url: str) -> None:
    """A consenting tenant's edited answer: a row of train.sft_candidate once refreshed."""
    with psycopg.connect(url) as c:
        tenant = c.execute(
            "INSERT INTO tenant (name, consent_training) VALUES ('acme', true) RETURNING id"
        ).fetchone()[0]
        c.execute(
            "INSERT INTO serve.route (name, tenant_id, base_model) VALUES ('r1', %s, 'base')",
            (tenant,),
        )
        c.execute(
            "INSERT INTO obs.inference_log (request_id, tenant_id, route, adapter_id, messages,"
            " completion, fb_edited, edited_completion) VALUES (gen_random_uuid(), %s, 'r1',"
            " 'base', '[{\"role\": \"user\", \"content\": \"hi\"}]', 'hello', true, 'Hello!')",
            (tenant,),
        )


def test_a_changed_code_file_reaches_an_existing_database(
    new_db, tmp_path, pg_server, fresh_catalog
) -> None:
    migrate(new_db)
    _seed_candidate(new_db)
    sql = _copy(tmp_path, SQL_DIR)
    # A function's return type: CREATE OR REPLACE alone cannot change it.
    _edit(
        sql / "serve/assign_adapter.sql",
        "RETURNS int\nLANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$\n"
        "  SELECT (('x' || substr(md5(p_experiment || ':' || p_user_key), 1, 8))::bit(32)::bigint"
        " % 10000)::int",
        "RETURNS bigint\nLANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$\n"
        "  SELECT (('x' || substr(md5(p_experiment || ':' || p_user_key), 1, 8))::bit(32)::bigint"
        " % 10000)::bigint",
    )
    # A view's column renamed (two other views depend on this one), with its comment.
    _edit(sql / "obs/experiment.sql", "min(l.created_at) AS first_at", "min(l.created_at) AS since")
    _edit(sql / "obs/experiment.sql", "obs.experiment.first_at IS", "obs.experiment.since IS")
    # A grant and a comment gone, and a whole file (its function) gone from sql/.
    deployment = sql / "serve/adapter_deployment.sql"
    _edit(deployment, "GRANT SELECT ON serve.adapter_deployment TO cft_release, cft_dashboard;", "")
    _edit(
        deployment,
        "COMMENT ON COLUMN serve.adapter_deployment.updated_at IS\n"
        "  'When the reconciler last recorded an outcome.';\n",
        "",
    )
    (sql / "loop/provenance.sql").unlink()
    _edit(sql / "manifest.txt", "loop/provenance.sql\n", "")

    outcome = migrations.run(new_db, sql_dir=sql)
    assert not outcome.created and outcome.migrations == ()
    assert outcome.code == (
        "loop/provenance.sql",
        "obs/experiment.sql",
        "serve/adapter_deployment.sql",
        "serve/assign_adapter.sql",
    )
    with psycopg.connect(new_db) as c:
        one = lambda q: c.execute(q).fetchone()[0]  # noqa: E731
        assert one("SELECT pg_get_function_result('serve.bucket(text, text)'::regprocedure)") == (
            "bigint"
        )
        assert [r[0] for r in c.execute("SELECT since FROM obs.experiment").fetchall()] == []
        assert one("SELECT has_table_privilege('cft_dashboard', 'serve.adapter_deployment',"
                   " 'SELECT')") is False  # fmt: skip
        assert one("SELECT col_description(attrelid, attnum) FROM pg_attribute WHERE attrelid"
                   " = 'serve.adapter_deployment'::regclass AND attname = 'updated_at'") is None  # fmt: skip
        assert one("SELECT to_regprocedure('loop.provenance(text)')") is None
        # The data stayed; a materialised view was made again, with its rows.
        assert one("SELECT count(*) FROM obs.inference_log") == 1
        assert one("SELECT count(*) FROM train.sft_candidate") == 1
    assert differences(catalog(new_db), _fresh_catalog(pg_server, sql)) == []
    assert str(migrations.run(new_db, sql_dir=sql)) == UP_TO_DATE
    # And back to sql/ as it is.
    assert len(migrate(new_db).code) == 4
    assert differences(catalog(new_db), fresh_catalog) == []


def test_a_table_changes_by_a_migration_and_its_state_file(new_db, tmp_path, pg_server) -> None:
    migrate(new_db)
    sql = _copy(tmp_path, SQL_DIR)
    folder = _copy(tmp_path, migrations.MIGRATIONS_DIR)
    # The migration runs with the code dropped: the view that reads the column is no obstacle.
    (folder / "0002_route_experiment.sql").write_text(
        "ALTER TABLE serve.route ALTER COLUMN experiment TYPE varchar(200);\n"
        "ALTER TABLE serve.route ADD COLUMN note text;\n"
    )
    route = sql / "state/serve/route.sql"
    _edit(route, "  experiment  text,", "  experiment  varchar(200),")
    _edit(
        route,
        "  PRIMARY KEY (tenant_id, name)",
        "  note        text,\n  PRIMARY KEY (tenant_id, name)",
    )
    (sql / "serve/route.sql").write_text(
        (sql / "serve/route.sql").read_text() + "COMMENT ON COLUMN serve.route.note IS 'A note.';\n"
    )
    outcome = migrations.run(new_db, sql_dir=sql, migrations_dir=folder)
    assert outcome.migrations == ("0002_route_experiment.sql",)
    assert outcome.code == ("serve/route.sql",)
    assert differences(catalog(new_db), _fresh_catalog(pg_server, sql)) == []
    assert str(migrations.run(new_db, sql_dir=sql, migrations_dir=folder)) == UP_TO_DATE


def test_state_that_depends_on_code_stops_the_migration(new_db, tmp_path) -> None:
    """Code is dropped without CASCADE: what would take data with it fails the migration."""
    migrate(new_db)
    with psycopg.connect(new_db) as c:
        c.execute("CREATE INDEX route_bucket_idx ON serve.route (serve.bucket(name, name))")
    sql = _copy(tmp_path, SQL_DIR)
    _edit(sql / "serve/assign_adapter.sql", "-- Sticky canary split.", "-- The canary split.")
    before = _recorded(new_db)
    with pytest.raises(psycopg.errors.DependentObjectsStillExist, match=r"serve\.bucket"):
        migrations.run(new_db, sql_dir=sql)
    assert _recorded(new_db) == before
    with psycopg.connect(new_db) as c:
        assert c.execute("SELECT to_regclass('serve.route_bucket_idx')").fetchone()[0]


def _recorded_as(url: str, names: tuple[str, ...]) -> None:
    """Make the database's record of state migrations say `names`."""
    with psycopg.connect(url) as c:
        c.execute(f"DELETE FROM {migrations.TRACKING_TABLE} WHERE kind = 'state'")
        for name in names:
            c.execute(
                f"INSERT INTO {migrations.TRACKING_TABLE} (kind, name, sha256)"
                " VALUES ('state', %s, '')",
                (name,),
            )


def test_a_database_of_the_history_before_the_rebase_is_taken_over(new_db, fresh_catalog) -> None:
    # Every migration of that history gives the baseline's state: only the record differs.
    migrate(new_db)
    _recorded_as(new_db, migrations.REBASED)
    assert str(migrate(new_db)) == UP_TO_DATE
    state = {name for kind, name in _recorded(new_db) if kind == "state"}
    assert state == set(migrations.migration_names())
    assert differences(catalog(new_db), fresh_catalog) == []


def test_a_database_missing_migrations_of_the_old_history_is_refused_readably(new_db) -> None:
    migrate(new_db)
    _recorded_as(new_db, migrations.REBASED[:-1])
    before = _recorded(new_db)
    with pytest.raises(RuntimeError, match=rf"lacks .*{migrations.REBASED[-1]}.*cft db down"):
        migrate(new_db)
    assert _recorded(new_db) == before


def test_a_database_of_the_alembic_history_is_refused_readably(new_db) -> None:
    with psycopg.connect(new_db, autocommit=True) as c:
        c.execute("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        c.execute("INSERT INTO alembic_version VALUES ('20261215')")
    with pytest.raises(RuntimeError, match=r"predates cft migrate.*pgdata"):
        migrate(new_db)


def test_a_database_a_newer_cft_migrated_is_refused(new_db) -> None:
    migrate(new_db)
    with psycopg.connect(new_db) as c:
        c.execute(
            f"INSERT INTO {migrations.TRACKING_TABLE} (kind, name, sha256)"
            " VALUES ('state', '0002_later.sql', '')"
        )
    with pytest.raises(RuntimeError, match=r"0002_later\.sql"):
        migrate(new_db)
