"""Datasets: refresh only the candidate view a snapshot reads.

train.refresh_dataset_candidates_v3(methods) refreshes the views of the given methods (all
when NULL) and records each view's refresh in train.candidate_view_refresh, so that a marker
of obs.deleted_log goes only once every view has been refreshed since its change
(schema/candidate_view_refresh_v1.sql). v2 (refresh all) stays.

Revision ID: 0016
Revises: 0015
"""

from app.core import sqlfiles

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# SQL files this migration runs, in order (paths under sql/).
FILES: list[str] = [
    "schema/candidate_view_refresh_v1.sql",
    "functions/refresh_dataset_candidates_v3.sql",
]
DOWNGRADE_SQL = """
DROP FUNCTION IF EXISTS train.refresh_dataset_candidates_v3(text[]);
DROP TABLE IF EXISTS train.candidate_view_refresh;
"""


def upgrade() -> None:
    sqlfiles.apply(FILES)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
