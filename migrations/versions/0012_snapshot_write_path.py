"""Datasets: snapshots write their examples set-based (train.create_snapshot_v3).

The per-row foreign key from train.dataset_example to train.dataset_snapshot becomes
statement-level triggers with the same guarantees, the sealed-snapshot insert check folded into
the same pass (triggers/dataset_example_snapshot_ref_v1.sql);
train.create_snapshot_v3 builds the same snapshot as v2 in fewer passes.

Revision ID: 0012
Revises: 0011
"""

from app.core import sqlfiles

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# SQL files this migration runs, in order (paths under sql/).
FILES: list[str] = [
    "triggers/dataset_example_snapshot_ref_v1.sql",
    "functions/dataset_snapshot_v3.sql",
]
# SQL that undoes them: v2 stays installed (0011), the declared foreign key comes back.
DOWNGRADE_SQL = """
DROP FUNCTION IF EXISTS train.create_snapshot_v3(int, text, text, timestamptz, timestamptz,
  double precision, int, int, text);
DROP TRIGGER IF EXISTS dataset_snapshot_id_referenced ON train.dataset_snapshot;
DROP TRIGGER IF EXISTS dataset_snapshot_cascade_examples ON train.dataset_snapshot;
DROP TRIGGER IF EXISTS dataset_example_snapshot_moved ON train.dataset_example;
DROP TRIGGER IF EXISTS dataset_example_insert_checked ON train.dataset_example;
CREATE TRIGGER dataset_example_insert_frozen
  AFTER INSERT ON train.dataset_example REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION train.dataset_example_immutable_v1();
DROP FUNCTION IF EXISTS train.dataset_snapshot_example_ref_v1();
DROP FUNCTION IF EXISTS train.dataset_example_snapshot_ref_v1();
ALTER TABLE train.dataset_example
  ADD CONSTRAINT dataset_example_snapshot_id_fkey FOREIGN KEY (snapshot_id)
  REFERENCES train.dataset_snapshot(id) ON DELETE CASCADE;
"""


def upgrade() -> None:
    sqlfiles.apply(FILES)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
