"""Training queue: claim, heartbeat, reclaim.

Revision ID: 0005
Revises: 0004
"""

from app.core import sqlfiles

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# SQL files this migration runs, in order (paths under sql/).
FILES: list[str] = ["functions/training_queue_v1.sql"]
# SQL that undoes them (drop what FILES created).
DOWNGRADE_SQL = """
DROP TRIGGER IF EXISTS training_run_notify ON train.training_run;
DROP FUNCTION IF EXISTS train.training_run_notify_v1();
DROP FUNCTION IF EXISTS train.claim_training_run_v1(text, interval);
DROP FUNCTION IF EXISTS train.expire_training_runs_v1();
DROP FUNCTION IF EXISTS train.heartbeat_training_run_v1(uuid, text, interval, jsonb);
DROP FUNCTION IF EXISTS train.finish_training_run_v1(uuid, text, text, jsonb);
DROP FUNCTION IF EXISTS train.fail_training_run_v1(uuid, text, text, boolean);
DROP FUNCTION IF EXISTS train.cancel_training_run_v1(uuid);
"""


def upgrade() -> None:
    sqlfiles.apply(FILES)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
