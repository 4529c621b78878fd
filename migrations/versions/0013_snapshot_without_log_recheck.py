"""Datasets: snapshots copy prebuilt examples and skip deleted rows through markers.

obs.deleted_log marks log rows deleted or flagged as PII since the candidate views were last
refreshed (schema/deleted_log_v1.sql); train.refresh_dataset_candidates_v2 clears the markers a
refresh accounted for; the candidate views are recreated with each candidate's example and its
hash (views/dataset_candidates_v2.sql); train.create_snapshot_v4 builds the same snapshot as v3
without joining every candidate to obs.inference_log and without building or hashing examples.
The GIN index on train.dataset_example.log_ids goes: a snapshot paid for it on every example,
and its one reader (forgetting a user, which also refreshes every candidate view) reads the
tenant's examples snapshot by snapshot instead.

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
    "functions/dataset_examples_v1.sql",
    "views/dataset_candidates_v2.sql",
    "functions/refresh_dataset_candidates_v2.sql",
    "functions/dataset_snapshot_v4.sql",
]
# The views are recreated (built from the current log: nothing deleted before the markers
# existed stays in them); the GIN index goes.
DROP_VIEWS_SQL = """
DROP MATERIALIZED VIEW IF EXISTS train.sft_candidate_v1;
DROP MATERIALIZED VIEW IF EXISTS train.kto_candidate_v1;
DROP MATERIALIZED VIEW IF EXISTS train.pair_candidate_v1;
"""
UPGRADE_SQL = "DROP INDEX IF EXISTS train.dataset_example_log_ids_idx;"
# The example builders, once nothing uses them (after the views).
DROP_EXAMPLES_SQL = """
DROP FUNCTION IF EXISTS train.sft_example_v1(jsonb, text);
DROP FUNCTION IF EXISTS train.kto_example_v1(jsonb, text, boolean);
DROP FUNCTION IF EXISTS train.pair_example_v1(jsonb, text, text);
"""
# SQL that undoes them (drop what FILES created, bring the index back); then the v1 views.
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
    sqlfiles.execute(DROP_VIEWS_SQL)
    sqlfiles.apply(FILES)
    sqlfiles.execute(UPGRADE_SQL)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
    sqlfiles.execute(DROP_VIEWS_SQL)
    sqlfiles.execute(DROP_EXAMPLES_SQL)
    sqlfiles.apply(["views/dataset_candidates_v1.sql"])
