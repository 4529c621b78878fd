"""Datasets: snapshots skip deleted rows through markers instead of re-reading the log.

obs.deleted_log marks log rows deleted or flagged as PII since the candidate views were last
refreshed (schema/deleted_log_v1.sql); train.refresh_dataset_candidates_v2 clears the markers a
refresh accounted for; train.create_snapshot_v4 builds the same snapshot as v3 without joining
every candidate to obs.inference_log. The GIN index on train.dataset_example.log_ids goes: a
snapshot paid for it on every example, and its one reader (forgetting a user, which also
refreshes every candidate view) reads the tenant's examples snapshot by snapshot instead.

Revision ID: 0013
Revises: 0012
"""

from app.core import sqlfiles

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# SQL files this migration runs, in order (paths under sql/).
FILES: list[str] = [
    "schema/deleted_log_v1.sql",
    "functions/refresh_dataset_candidates_v2.sql",
    "functions/dataset_snapshot_v4.sql",
]
# Rows deleted before the markers existed may still be in the views: start from fresh ones.
UPGRADE_SQL = """
DROP INDEX IF EXISTS train.dataset_example_log_ids_idx;
SELECT train.refresh_dataset_candidates_v2();
"""
# SQL that undoes them (drop what FILES created, bring the index back).
DOWNGRADE_SQL = """
DROP FUNCTION IF EXISTS train.create_snapshot_v4(int, text, text, timestamptz, timestamptz,
  double precision, int, int, text);
DROP FUNCTION IF EXISTS train.refresh_dataset_candidates_v2();
DROP TRIGGER IF EXISTS inference_log_pii_marked ON obs.inference_log;
DROP TRIGGER IF EXISTS inference_log_deleted_marked ON obs.inference_log;
DROP FUNCTION IF EXISTS obs.deleted_log_record_v1();
DROP TABLE IF EXISTS obs.deleted_log;
CREATE INDEX IF NOT EXISTS dataset_example_log_ids_idx ON train.dataset_example USING gin (log_ids);
"""


def upgrade() -> None:
    sqlfiles.apply(FILES)
    sqlfiles.execute(UPGRADE_SQL)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
