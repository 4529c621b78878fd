"""Datasets: the candidate views hold each candidate's example; snapshots copy it.

The candidate views are recreated (same names, rules and keys; views/dataset_candidates_v3.sql)
with the example a snapshot freezes in place of the columns it was built from (prompt,
completion, chosen, rejected): a refresh built every example already, to hash it.
train.create_snapshot_v6 builds the same snapshot as v5 and copies the survivors' examples
instead of building them again. v1-v5 read the dropped columns and go; the downgrade brings
them back with the v2 views.

Revision ID: 0015
Revises: 0014
"""

from app.core import sqlfiles

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

SIGNATURE = "(int, text, text, timestamptz, timestamptz, double precision, int, int, text)"
OLD_WRITERS = ["v1", "v2", "v3", "v4", "v5"]
# The snapshot functions that read the views' old columns, then the views.
DROP_OLD_SQL = (
    "".join(f"DROP FUNCTION IF EXISTS train.create_snapshot_{v}{SIGNATURE};\n" for v in OLD_WRITERS)
    + """DROP MATERIALIZED VIEW IF EXISTS train.sft_candidate_v1;
DROP MATERIALIZED VIEW IF EXISTS train.kto_candidate_v1;
DROP MATERIALIZED VIEW IF EXISTS train.pair_candidate_v1;
"""
)
# SQL files this migration runs, in order (paths under sql/); the views are built from the
# current log.
FILES: list[str] = [
    "views/dataset_candidates_v3.sql",
    "functions/dataset_snapshot_v6.sql",
]
DOWNGRADE_SQL = f"""
DROP FUNCTION IF EXISTS train.create_snapshot_v6{SIGNATURE};
DROP MATERIALIZED VIEW IF EXISTS train.sft_candidate_v1;
DROP MATERIALIZED VIEW IF EXISTS train.kto_candidate_v1;
DROP MATERIALIZED VIEW IF EXISTS train.pair_candidate_v1;
"""
# What the downgrade restores: the v2 views and the writers that read them.
RESTORE_FILES: list[str] = [
    "views/dataset_candidates_v2.sql",
    *(f"functions/dataset_snapshot_{v}.sql" for v in OLD_WRITERS),
]


def upgrade() -> None:
    sqlfiles.execute(DROP_OLD_SQL)
    sqlfiles.apply(FILES)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
    sqlfiles.apply(RESTORE_FILES)
