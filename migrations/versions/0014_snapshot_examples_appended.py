"""Datasets: snapshots keep keys only until the write; examples are appended without a key.

train.create_snapshot_v5 builds the same snapshot as v4 but its candidate table holds keys,
ranks, hashes and each candidate's TID in the view; the survivors' examples are built from
the view rows as they are inserted. train.dataset_example loses its primary key (a plain index
on snapshot_id serves the readers) and the statement trigger's transition table: other writers
are checked row by row, the snapshot writer's own draft is exempt, and only the owner may
insert (triggers/dataset_example_append_v1.sql).

Revision ID: 0014
Revises: 0013
"""

from app.core import sqlfiles

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# SQL files this migration runs, in order (paths under sql/).
FILES: list[str] = [
    "triggers/dataset_example_append_v1.sql",
    "functions/dataset_snapshot_v5.sql",
]
# SQL that undoes them: the key, the statement trigger (0012's) and cft_app's INSERT come back.
DOWNGRADE_SQL = """
DROP FUNCTION IF EXISTS train.create_snapshot_v5(int, text, text, timestamptz, timestamptz,
  double precision, int, int, text);
DROP TRIGGER IF EXISTS dataset_example_insert_checked ON train.dataset_example;
DROP FUNCTION IF EXISTS train.dataset_example_insert_check_v1();
CREATE TRIGGER dataset_example_insert_checked
  AFTER INSERT ON train.dataset_example REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION train.dataset_example_snapshot_ref_v1();
DROP INDEX IF EXISTS train.dataset_example_snapshot_idx;
ALTER TABLE train.dataset_example ADD PRIMARY KEY (snapshot_id, example_hash);
GRANT INSERT ON train.dataset_example TO cft_app;
"""


def upgrade() -> None:
    sqlfiles.apply(FILES)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
