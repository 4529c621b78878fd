"""Eval results with an author, judge calibration (issue 21).

Placeholder in the revision chain; filled by the change it names.

Revision ID: 20261205
Revises: 20261204
"""

from alembic import op

revision = "20261205"
down_revision = "20261204"
branch_labels = None
depends_on = None

UPGRADE_SQL = "SELECT 1"
DOWNGRADE_SQL = "SELECT 1"


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
