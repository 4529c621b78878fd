"""Baseline: the whole schema as sql/ defines it (the schema was rebased before 1.0).

The sixteen revisions written before 1.0 (0001-0016) were squashed into this one. It applies
sql/manifest.txt on an empty database. Every later migration freezes its own delta: the
ALTER / CREATE OR REPLACE text of its change inside the migration, never a path into sql/, so
that an old migration never changes meaning when sql/ moves on (tests/integration/
test_migrations.py keeps "baseline + migrations" and "a fresh apply of sql/" equal).

Revision ID: 20261201
Revises:
"""

from alembic import op

from app.core.config import get_settings
from app.core.sqlfiles import apply_schema

revision = "20261201"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
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
