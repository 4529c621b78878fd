"""Ingestion: API key helpers, feedback linking, PII.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

from app.core.config import get_settings
from app.core.sqlfiles import run_files

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# SQL files this migration runs, in order (paths under sql/).
FILES: list[str] = [
    "indexes/inference_log_links_v1.sql",
    "functions/link_regenerations_v1.sql",
]
# SQL that undoes them (drop what FILES created).
DOWNGRADE_SQL = """
DROP FUNCTION IF EXISTS obs.link_regenerations_v1(int, uuid[]);
DROP INDEX IF EXISTS obs.inference_log_dangling_parent_idx;
DROP INDEX IF EXISTS obs.inference_log_regenerated_by_idx;
"""


def upgrade() -> None:
    if FILES:
        conn = op.get_bind().connection.driver_connection
        run_files(conn, FILES, embedding_dim=get_settings().embedding_dim)


def downgrade() -> None:
    if DOWNGRADE_SQL:
        op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
