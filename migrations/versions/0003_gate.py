"""Gate: can_promote, promotion trigger, policy.

Revision ID: 0003
Revises: 0002
"""

from app.core import sqlfiles

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# SQL files this migration runs, in order (paths under sql/).
FILES: list[str] = [
    "schema/gate_v1.sql",
    "functions/can_promote_v1.sql",
    "triggers/adapter_gate_v1.sql",
    "policies/gate_v1.sql",
]
# SQL that undoes them (drop what FILES created).
DOWNGRADE_SQL = """
DROP POLICY IF EXISTS own_rules_only ON train.promotion_policy;
REVOKE DELETE ON train.promotion_policy FROM cft_app;
DROP TRIGGER IF EXISTS adapter_gate_after ON serve.adapter;
DROP TRIGGER IF EXISTS adapter_a_gate ON serve.adapter;
DROP FUNCTION IF EXISTS serve.rollback(text, text);
DROP FUNCTION IF EXISTS serve.adapter_gate_after_v1();
DROP FUNCTION IF EXISTS serve.adapter_gate_v1();
DROP FUNCTION IF EXISTS serve.annotate_adapter_event_v1(text, jsonb);
DROP FUNCTION IF EXISTS serve.previous_prod_v1(text);
DROP FUNCTION IF EXISTS serve.current_prod_v1(text);
DROP FUNCTION IF EXISTS serve.lock_route_v1(text);
DROP FUNCTION IF EXISTS serve.can_promote(text, text);
DROP FUNCTION IF EXISTS serve.promotion_blockers(text, text);
ALTER TABLE serve.adapter DROP COLUMN IF EXISTS previous_prod_id;
"""


def upgrade() -> None:
    sqlfiles.apply(FILES)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
