"""Datasets: near-duplicate prompts found at embedding time; snapshots join them.

Revision ID: 0011
Revises: 0010 (0010_security.py, written at the same time)
"""

from app.core import sqlfiles

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# SQL files this migration runs, in order (paths under sql/).
FILES: list[str] = [
    "schema/prompt_neighbour_v1.sql",
    "functions/prompt_neighbours_v1.sql",
    "functions/dataset_snapshot_v2.sql",
]
# Rows embedded before this migration join the embedder's queue (radius NULL).
BACKFILL_SQL = """
INSERT INTO obs.prompt_neighbour_scan (log_id, created_at, tenant_id, route)
SELECT id, created_at, tenant_id, route FROM obs.inference_log WHERE embedding IS NOT NULL
ON CONFLICT DO NOTHING;
"""
# SQL that undoes them (drop what FILES created).
DOWNGRADE_SQL = """
DROP FUNCTION IF EXISTS train.create_snapshot_v2(int, text, text, timestamptz, timestamptz,
  double precision, int, int, text);
DROP FUNCTION IF EXISTS obs.compute_prompt_neighbours_v1(double precision, int, int);
DROP FUNCTION IF EXISTS obs.prune_prompt_neighbours_v1(timestamptz);
DROP TRIGGER IF EXISTS inference_log_forget_neighbours ON obs.inference_log;
DROP TRIGGER IF EXISTS inference_log_reembedded ON obs.inference_log;
DROP TRIGGER IF EXISTS inference_log_embedded ON obs.inference_log;
DROP FUNCTION IF EXISTS obs.prompt_neighbour_forget_v1();
DROP FUNCTION IF EXISTS obs.prompt_neighbour_enqueue_v1();
DROP TABLE IF EXISTS obs.prompt_neighbour;
DROP TABLE IF EXISTS obs.prompt_neighbour_scan;
"""


def upgrade() -> None:
    sqlfiles.apply(FILES)
    sqlfiles.execute(BACKFILL_SQL)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
