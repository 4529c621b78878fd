"""The neighbour search keeps up with ingest (placeholder: filled by the dedup-throughput work).

Revision ID: 20261211
Revises: 20261210
"""

from alembic import op

revision = "20261211"
down_revision = "20261210"
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
