"""Serving: reconciler state of adapters on engines.

Revision ID: 0007
Revises: 0006
"""

from alembic import op

from app.core.config import get_settings
from app.core.sqlfiles import run_files

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# SQL files this migration runs, in order (paths under sql/).
FILES: list[str] = ["schema/serving_v1.sql"]
# SQL that undoes them (drop what FILES created).
DOWNGRADE_SQL = "DROP TABLE IF EXISTS serve.adapter_deployment;"


def upgrade() -> None:
    if FILES:
        conn = op.get_bind().connection.driver_connection
        run_files(conn, FILES, embedding_dim=get_settings().embedding_dim)


def downgrade() -> None:
    if DOWNGRADE_SQL:
        op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
