"""Alembic environment: migrations run their SQL on a psycopg connection (online only)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from app.core.db import sqlalchemy_url

config = context.config


def run_migrations_online() -> None:
    """Run migrations against the configured database."""
    url = config.get_main_option("sqlalchemy.url") or sqlalchemy_url()
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, transaction_per_migration=True)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("cft migrations run online only: they execute SQL on the database")
run_migrations_online()
