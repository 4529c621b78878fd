"""Security: the canary budget check (owner rights, row locks) is not executable by PUBLIC.

Revision ID: 0010
Revises: 0009
"""

from app.core import sqlfiles

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# SQL files this migration runs, in order (paths under sql/).
FILES: list[str] = [
    "policies/canary_budget_grants_v1.sql",
]
# SQL that undoes them (PostgreSQL's default: EXECUTE for PUBLIC).
DOWNGRADE_SQL = """
REVOKE EXECUTE ON FUNCTION serve.check_canary_budget_v1(text, text, numeric)
  FROM cft_app, cft_release;
GRANT EXECUTE ON FUNCTION serve.check_canary_budget_v1(text, text, numeric) TO PUBLIC;
"""


def upgrade() -> None:
    sqlfiles.apply(FILES)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
