"""Training queue: claim, heartbeat, reclaim.

Revision ID: 0005
Revises: 0004
"""

from alembic import op

from app.core.config import get_settings
from app.core.sqlfiles import run_files

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
    if FILES:
        conn = op.get_bind().connection.driver_connection
        run_files(conn, FILES, embedding_dim=get_settings().embedding_dim)


def downgrade() -> None:
    if DOWNGRADE_SQL:
        op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
