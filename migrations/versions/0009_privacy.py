"""Privacy: forgetting users.

Revision ID: 0009
Revises: 0008
"""

from app.core import sqlfiles

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# SQL files this migration runs, in order (paths under sql/).
FILES: list[str] = [
    "schema/forget_request_v1.sql",
    "indexes/inference_log_user_hash_v1.sql",
    "functions/forget_user_v1.sql",
]
# SQL that undoes them (drop what FILES created).
DOWNGRADE_SQL = """
DROP FUNCTION IF EXISTS auth.forget_user_v1(bytea);
DROP INDEX IF EXISTS obs.inference_log_user_hash_idx;
DROP TABLE IF EXISTS auth.forget_request;
"""


def upgrade() -> None:
    sqlfiles.apply(FILES)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
