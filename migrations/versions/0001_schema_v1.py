"""Schema v1: tenants, keys, traffic log, registry, queue, datasets, evals, audit, roles.

Revision ID: 0001
Revises:
"""

from alembic import op

from app.core.config import get_settings
from app.core.sqlfiles import run_files

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

FILES = [
    "schema/0001_core.sql",
    "schema/0002_obs.sql",
    "schema/0003_serve_train.sql",
    "triggers/inference_log_request_key_v1.sql",
    "functions/partitions_v1.sql",
    "triggers/adapter_audit_v1.sql",
    "functions/assign_adapter_v1.sql",
    "policies/tenant_isolation_v1.sql",
    "policies/grants_v1.sql",
]


def upgrade() -> None:
    conn = op.get_bind().connection.driver_connection
    run_files(conn, FILES, embedding_dim=get_settings().embedding_dim)
    conn.execute("SELECT obs.create_partitions_v1(4, now() - interval '7 days')")


def downgrade() -> None:
    conn = op.get_bind().connection.driver_connection
    # Roles are cluster-wide and may serve other databases: revoke here, keep them.
    conn.execute(
        """
        DROP SCHEMA IF EXISTS obs, serve, train, auth CASCADE;
        DROP TABLE IF EXISTS tenant CASCADE;
        DROP EXTENSION IF EXISTS vector;
        """
    )
