"""Datasets: candidate views, snapshots, dedup.

Revision ID: 0004
Revises: 0003
"""

from app.core import sqlfiles

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# SQL files this migration runs, in order (paths under sql/).
FILES: list[str] = [
    "indexes/embedding_pending_v1.sql",
    "views/dataset_candidates_v1.sql",
    "functions/dataset_snapshot_v1.sql",
    "triggers/dataset_snapshot_immutable_v1.sql",
]
# SQL that undoes them (drop what FILES created).
DOWNGRADE_SQL = """
DROP TRIGGER IF EXISTS dataset_snapshot_no_truncate ON train.dataset_snapshot;
DROP TRIGGER IF EXISTS dataset_snapshot_immutable ON train.dataset_snapshot;
DROP TRIGGER IF EXISTS dataset_example_no_truncate ON train.dataset_example;
DROP TRIGGER IF EXISTS dataset_example_immutable ON train.dataset_example;
DROP TRIGGER IF EXISTS dataset_example_insert_frozen ON train.dataset_example;
DROP FUNCTION IF EXISTS train.dataset_snapshot_immutable_v1();
DROP FUNCTION IF EXISTS train.dataset_example_immutable_v1();
DROP FUNCTION IF EXISTS train.verify_snapshot_v1(uuid);
DROP FUNCTION IF EXISTS train.create_snapshot_v1(int, text, text, timestamptz, timestamptz,
  double precision, int, int, text);
DROP FUNCTION IF EXISTS train.split_bucket_v1(bytea);
DROP FUNCTION IF EXISTS train.example_hash_v1(jsonb);
DROP FUNCTION IF EXISTS train.prompt_hash_v1(jsonb);
DROP FUNCTION IF EXISTS train.refresh_dataset_candidates_v1();
DROP MATERIALIZED VIEW IF EXISTS train.pair_candidate_v1;
DROP MATERIALIZED VIEW IF EXISTS train.kto_candidate_v1;
DROP MATERIALIZED VIEW IF EXISTS train.sft_candidate_v1;
DROP INDEX IF EXISTS obs.inference_log_embedding_pending_idx;
"""


def upgrade() -> None:
    sqlfiles.apply(FILES)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
