"""Tenant administration and offboarding audit (placeholder: filled by the tenant-admin work).

Revision ID: 20261210
Revises: 20261209
"""

from alembic import op

revision = "20261210"
down_revision = "20261209"
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
