"""Baseline: the whole schema as sql/ defines it (the schema was rebased before 1.0).

The sixteen revisions written before 1.0 (0001-0016) were squashed into this one: the schema of
sql/ at the commit that made it (0006e75). An empty database is created from sql/ as it is now
and stamped at head (migrations/env.py), so this file runs only to go back to the baseline
from nothing (a downgrade to base, then an upgrade to this revision), when sql/ still is the
baseline's. Every later migration freezes its own delta: the ALTER / CREATE OR REPLACE text of
its change inside the migration, never a path into sql/, so an old migration never changes
meaning when sql/ moves on. tests/integration/test_migrations.py builds the baseline's schema
from that commit's sql/ (git), upgrades it to head and compares the catalog with a fresh apply.

Revision ID: 20261201
Revises:
"""

from alembic import op
from alembic.script import ScriptDirectory

from app.core.config import get_settings
from app.core.sqlfiles import apply_schema

revision = "20261201"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    if ScriptDirectory.from_config(op.get_context().config).get_current_head() != revision:
        raise RuntimeError(
            "the baseline is not replayed once later migrations exist: upgrade an empty"
            " database to head (cft migrate), which applies sql/ as it is now"
        )
    conn = op.get_bind().connection.driver_connection
    apply_schema(conn, embedding_dim=get_settings().embedding_dim)
    # The current week and the next four, from last week on: no insert waits for maintenance.
    conn.execute("SELECT obs.create_partitions(4, now() - interval '7 days')")


def downgrade() -> None:
    conn = op.get_bind().connection.driver_connection
    # Roles are cluster-wide and may serve other databases: they stay.
    conn.execute(
        """
        DROP SCHEMA IF EXISTS obs, serve, train, auth, stats CASCADE;
        DROP TABLE IF EXISTS tenant CASCADE;
        DROP EXTENSION IF EXISTS vector;
        """
    )
