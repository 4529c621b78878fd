"""Serving: reconciler state of adapters on engines.

Revision ID: 0007
Revises: 0006
"""

from app.core import sqlfiles

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# SQL files this migration runs, in order (paths under sql/).
FILES: list[str] = ["schema/serving_v1.sql"]
# SQL that undoes them (drop what FILES created).
DOWNGRADE_SQL = "DROP TABLE IF EXISTS serve.adapter_deployment;"


def upgrade() -> None:
    sqlfiles.apply(FILES)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
