"""Evaluator: task suites and eval requests.

Revision ID: 0008
Revises: 0007
"""

from app.core import sqlfiles

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# SQL files this migration runs, in order (paths under sql/).
FILES: list[str] = ["schema/evaluator_v1.sql", "functions/can_promote_v2.sql"]
# SQL that undoes them (drop what FILES created).
DOWNGRADE_SQL = (
    "DELETE FROM train.promotion_policy WHERE route IS NULL AND suite_id = 'heldout:snapshot';"
    " DROP TRIGGER IF EXISTS adapter_candidate_notify ON serve.adapter;"
    " DROP FUNCTION IF EXISTS serve.adapter_candidate_notify_v1();"
    " DROP FUNCTION IF EXISTS train.claim_eval_request_v1(text, interval);"
    " DROP TABLE IF EXISTS train.eval_request, train.eval_case, train.eval_suite;"
    " DROP FUNCTION IF EXISTS train.eval_notify_v1();"
)
# can_promote_v2 replaced serve.promotion_blockers: restore v1.
RESTORE_FILES = ["functions/can_promote_v1.sql"]


def upgrade() -> None:
    sqlfiles.apply(FILES)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
    sqlfiles.apply(RESTORE_FILES)
