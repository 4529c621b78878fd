"""The loop runs itself: loop policy, triggers, cycles (issue 20).

Placeholder in the revision chain; filled by the change it names.

Revision ID: 20261206
Revises: 20261205
"""

from alembic import op

revision = "20261206"
down_revision = "20261205"
branch_labels = None
depends_on = None

UPGRADE_SQL = "SELECT 1"
DOWNGRADE_SQL = "SELECT 1"


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
