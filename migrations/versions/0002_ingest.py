"""Ingestion: API key helpers, feedback linking, PII.

Revision ID: 0002
Revises: 0001
"""

from app.core import sqlfiles

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
    sqlfiles.apply(FILES)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
