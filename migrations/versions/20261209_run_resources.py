"""Training runs carry their resource needs; workers claim only runs they can serve (placeholder: filled by the multi-GPU work).

Revision ID: 20261209
Revises: 20261208
"""

from alembic import op

revision = "20261209"
down_revision = "20261208"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
SELECT 1;
"""
DOWNGRADE_SQL = r"""
SELECT 1;
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
