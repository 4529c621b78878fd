"""`cft migrate`: the state migrations a database lacks, then the code of sql/ when it changed.

sql/ is the database as it is now: state (sql/state/) and code (every other file). migrations/
is the state's history: a baseline with no SQL (sql/state/ as of the commit that added it), then
forward-only plain SQL, numbered. A database made by `cft migrate` records in
public.cft_migration the migrations it has (by file name) and the sha256 of each code file it
runs. On an empty database, migrate applies sql/ (state, then code) and records every migration
as applied. On any other, in one transaction: when a migration is pending or a code file
changed, it drops the code (drop_code.sql), runs the pending migrations in number order, and
applies every code file again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import psycopg.sql

from app.core.config import get_settings
from app.core.sqlfiles import SQL_DIR, apply_files, code_files, render, state_files

MIGRATIONS_DIR = SQL_DIR.parent / "migrations"
DROP_CODE = Path(__file__).with_name("drop_code.sql")
# The schemas cft owns: the code in them is exactly what sql/ defines once migrate has run.
SCHEMAS = ("public", "obs", "serve", "train", "auth", "stats", "loop")
TRACKING_TABLE = "public.cft_migration"
# Two `cft migrate` at once (services that migrate as they start) run one after the other.
LOCK_KEY = 0x63667400
# The baseline holds no SQL: it stands for sql/state/ as of the commit that added it (the state
# history was rebased there, before 1.0). A database gets it with sql/, never by running it.
BASELINE = "0001_baseline.sql"
# The migrations of the history rebased on 2026-12-06: a database that has them all has exactly
# the baseline's state, and migrate records the baseline instead. Older ones are made again.
REBASED = (
    "20261216_baseline.sql",
    "20261217_dashboard_session.sql",
    "20261218_loop_learns.sql",
    "20261219_drop_adapter_experiment.sql",
    "20261220_eval_results_append_only.sql",
    "20261221_api_login.sql",
    "20261222_tenant_names.sql",
    "20261223_route_fallback.sql",
    "20261224_openai_fine_tuning.sql",
    "20261225_adapter_import.sql",
)
REMAKE = (
    "Make it again (pre-1.0, the migrations were rebased): for the embedded database,"
    " `cft db down` and remove CFT_HOME/pgdata (default .cft/pgdata)."
)
# The partitions a new database starts with: this week's and four ahead, from last week on.
FIRST_PARTITIONS = "SELECT obs.create_partitions(4, now() - interval '7 days')"

TRACKING_DDL = f"""
CREATE TABLE IF NOT EXISTS {TRACKING_TABLE} (
  kind       text NOT NULL CHECK (kind IN ('state', 'code')),
  name       text NOT NULL,
  sha256     text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (kind, name)
)"""


@dataclass(frozen=True)
class Outcome:
    """What one migrate did."""

    created: bool
    migrations: tuple[str, ...]
    code: tuple[str, ...]

    def __str__(self) -> str:
        if self.created:
            return f"database created from sql/ ({', '.join(self.migrations)} recorded)"
        if not self.migrations and not self.code:
            return "database up to date: no migration pending, code unchanged"
        done = [f"migration {name} applied" for name in self.migrations]
        if self.code:
            done.append(f"code applied again (changed: {', '.join(self.code)})")
        return "database migrated: " + "; ".join(done)


def migration_names(migrations_dir: Path = MIGRATIONS_DIR) -> list[str]:
    """The state migrations, in the order they run (their names start with a 4-digit number)."""
    return sorted(p.name for p in migrations_dir.glob("*.sql"))


def run(
    url: str,
    *,
    embedding_dim: int | None = None,
    sql_dir: Path = SQL_DIR,
    migrations_dir: Path = MIGRATIONS_DIR,
) -> Outcome:
    """Bring the database at `url` to sql/; see the module's docstring."""
    dim = get_settings().embedding_dim if embedding_dim is None else embedding_dim
    names = migration_names(migrations_dir)
    code = {p: _sha256(render(p, embedding_dim=dim, root=sql_dir)) for p in code_files(sql_dir)}
    with psycopg.connect(url) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        outcome = _migrate(
            conn, names, code, dim=dim, sql_dir=sql_dir, migrations_dir=migrations_dir
        )
        _set_api_password(conn)
        return outcome


def _set_api_password(conn: psycopg.Connection[Any]) -> None:
    """Give the API's login (cft_api) CFT_API_DB_PASSWORD, when one is set."""
    password = get_settings().api_db_password.get_secret_value()
    if password:
        conn.execute(
            psycopg.sql.SQL("ALTER ROLE cft_api PASSWORD {}").format(psycopg.sql.Literal(password))
        )


def _migrate(
    conn: psycopg.Connection[Any],
    names: list[str],
    code: dict[str, str],
    *,
    dim: int,
    sql_dir: Path,
    migrations_dir: Path,
) -> Outcome:
    """What run() does under its lock, in its transaction."""
    fresh = _is_empty(conn)
    conn.execute(TRACKING_DDL)
    if fresh:
        apply_files(conn, state_files(sql_dir), embedding_dim=dim, sql_dir=sql_dir)
        apply_files(conn, list(code), embedding_dim=dim, sql_dir=sql_dir)
        conn.execute(FIRST_PARTITIONS)
        for name in names:
            _record(conn, "state", name, render(name, embedding_dim=dim, root=migrations_dir))
        _record_code(conn, code)
        return Outcome(created=True, migrations=tuple(names), code=())
    _adopt(conn, migrations_dir=migrations_dir, dim=dim)
    applied = _recorded(conn, "state")
    unknown = sorted(set(applied) - set(names))
    if unknown:
        raise RuntimeError(
            f"the database has migrations this cft does not know ({', '.join(unknown)}):"
            " it was migrated by a newer cft; run that one"
        )
    pending = [name for name in names if name not in applied]
    if BASELINE in pending:
        raise RuntimeError(f"the database has migrations but not {BASELINE}. {REMAKE}")
    recorded = _recorded(conn, "code")
    changed = sorted(p for p in code.keys() | recorded.keys() if code.get(p) != recorded.get(p))
    if not pending and not changed:
        return Outcome(created=False, migrations=(), code=())
    conn.execute(DROP_CODE.read_text())
    conn.execute("SELECT pg_temp.drop_code(%s)", (list(SCHEMAS),))
    for name in pending:
        text = render(name, embedding_dim=dim, root=migrations_dir)
        try:
            conn.execute(text)
        except Exception as exc:
            raise RuntimeError(f"migrations/{name} failed: {exc}") from exc
        _record(conn, "state", name, text)
    apply_files(conn, list(code), embedding_dim=dim, sql_dir=sql_dir)
    _record_code(conn, code)
    return Outcome(created=False, migrations=tuple(pending), code=tuple(changed))


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _is_empty(conn: psycopg.Connection[Any]) -> bool:
    """No record of migrations and none of cft's schemas or tables: a database to create."""
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL OR to_regclass('public.alembic_version') IS NOT NULL"
        " OR to_regclass('public.tenant') IS NOT NULL"
        " OR EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = ANY (%s))",
        (TRACKING_TABLE, [s for s in SCHEMAS if s != "public"]),
    ).fetchone()
    return row is not None and not row[0]


def _adopt(conn: psycopg.Connection[Any], *, migrations_dir: Path, dim: int) -> None:
    """Take over a database of the history rebased on 2026-12-06; refuse older ones readably."""
    if conn.execute("SELECT to_regclass('public.alembic_version')").fetchone() != (None,):
        raise RuntimeError(f"this database's schema predates cft migrate (Alembic). {REMAKE}")
    applied = _recorded(conn, "state")
    if not applied:
        raise RuntimeError(
            "the database has cft's schemas but no record of its migrations"
            f" ({TRACKING_TABLE}): it was not made by cft migrate"
        )
    old = sorted(set(applied) & set(REBASED))
    if not old:
        return
    missing = [name for name in REBASED if name not in applied]
    if missing:
        raise RuntimeError(
            f"this database lacks migrations of the history before the rebase"
            f" ({', '.join(missing)}) that no cft applies now. {REMAKE}"
        )
    conn.execute(f"DELETE FROM {TRACKING_TABLE} WHERE kind = 'state' AND name = ANY (%s)", (old,))
    _record(conn, "state", BASELINE, render(BASELINE, embedding_dim=dim, root=migrations_dir))


def _recorded(conn: psycopg.Connection[Any], kind: str) -> dict[str, str]:
    rows = conn.execute(
        f"SELECT name, sha256 FROM {TRACKING_TABLE} WHERE kind = %s", (kind,)
    ).fetchall()
    return {name: sha for name, sha in rows}


def _record(conn: psycopg.Connection[Any], kind: str, name: str, text: str) -> None:
    conn.execute(
        f"INSERT INTO {TRACKING_TABLE} (kind, name, sha256) VALUES (%s, %s, %s)",
        (kind, name, _sha256(text)),
    )


def _record_code(conn: psycopg.Connection[Any], code: dict[str, str]) -> None:
    conn.execute(f"DELETE FROM {TRACKING_TABLE} WHERE kind = 'code'")
    for name, sha in code.items():
        conn.execute(
            f"INSERT INTO {TRACKING_TABLE} (kind, name, sha256) VALUES ('code', %s, %s)",
            (name, sha),
        )
