"""Alembic environment: migrations run their SQL on a psycopg connection (online only).

An empty database upgraded to head is created from sql/ as it is now (every file, in manifest
order) and stamped at head: it never replays the baseline and the deltas after it. A database
at an older revision runs the migrations from its revision on, each with its own frozen SQL.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import create_engine, pool

from app.core.config import get_settings
from app.core.db import sqlalchemy_url
from app.core.sqlfiles import apply_schema

config = context.config


def _empty(connection: Any) -> bool:
    """No cft schema and no revision (a database downgraded to base keeps an empty table)."""
    if connection.exec_driver_sql("SELECT to_regclass('public.tenant')").scalar() is not None:
        return False
    if connection.exec_driver_sql("SELECT to_regclass('public.alembic_version')").scalar() is None:
        return True
    return connection.exec_driver_sql("SELECT count(*) FROM alembic_version").scalar() == 0


def create_from_sql(connection: Any) -> None:
    """Apply sql/ to an empty database and create this week's partitions and four ahead."""
    driver = connection.connection.driver_connection
    apply_schema(driver, embedding_dim=get_settings().embedding_dim)
    driver.execute("SELECT obs.create_partitions(4, now() - interval '7 days')")


def run_migrations_online() -> None:
    """Run migrations against the configured database."""
    url = config.get_main_option("sqlalchemy.url") or sqlalchemy_url()
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        # Alembic hands "head" over resolved to the head revision.
        target = context.get_revision_argument()
        fresh = target in ("head", "heads", context.script.get_current_head()) and _empty(
            connection
        )
        connection.rollback()  # the check's implicit transaction; alembic begins its own
        context.configure(connection=connection, transaction_per_migration=not fresh)
        with context.begin_transaction():
            if fresh:
                create_from_sql(connection)
                context.get_context().stamp(context.script, "heads")
            else:
                context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("cft migrations run online only: they execute SQL on the database")
run_migrations_online()
