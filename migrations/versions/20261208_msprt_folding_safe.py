"""stats.msprt keeps the planner's constant folding safe (a zero variance no longer raises).

In a PL/pgSQL caller (serve.canary_decision) the arguments are known when the plan is made:
ln(0) or a division by zero was folded, and raised, before the WHERE dropped the row (seen on a
route whose control arm answered with identical lengths). The variance, tau and alpha get
floors inside the function; rows with var <= 0 are still dropped.

Revision ID: 20261208
Revises: 20261207
"""

from alembic import op

revision = "20261208"
down_revision = "20261207"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
CREATE OR REPLACE FUNCTION stats.msprt(diff float8, var float8, tau float8, alpha float8,
                                       OUT log_lr float8, OUT p_value float8,
                                       OUT ci_low float8, OUT ci_high float8)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  -- The floors only keep the planner's constant folding safe: in a PL/pgSQL caller the
  -- arguments are known when the plan is made, and ln(0) or a division by zero would be folded
  -- (and raise) before the WHERE could drop the row; a row with var <= 0 is still dropped.
  WITH q AS (
    SELECT diff AS d, greatest(var, 1e-12) AS v, greatest(tau * tau, 1e-12) AS t2,
           least(greatest(alpha, 1e-12), 0.999999) AS a
     WHERE diff IS NOT NULL AND var > 0 AND tau > 0 AND alpha > 0 AND alpha < 1
  ), r AS (
    SELECT q.*,
           0.5 * ln(q.v / (q.v + q.t2)) + q.t2 * q.d * q.d / (2 * q.v * (q.v + q.t2)) AS llr,
           sqrt(q.v * (q.v + q.t2) / q.t2 * (2 * ln(1 / q.a) + ln((q.v + q.t2) / q.v))) AS radius
      FROM q
  )
  SELECT r.llr, least(1.0, exp(-least(r.llr, 700))), r.d - r.radius, r.d + r.radius FROM r
$$;
"""

DOWNGRADE_SQL = r"""
CREATE OR REPLACE FUNCTION stats.msprt(diff float8, var float8, tau float8, alpha float8,
                                       OUT log_lr float8, OUT p_value float8,
                                       OUT ci_low float8, OUT ci_high float8)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  WITH q AS (
    SELECT diff AS d, var AS v, tau * tau AS t2
     WHERE diff IS NOT NULL AND var > 0 AND tau > 0 AND alpha > 0 AND alpha < 1
  ), r AS (
    SELECT q.*,
           0.5 * ln(q.v / (q.v + q.t2)) + q.t2 * q.d * q.d / (2 * q.v * (q.v + q.t2)) AS llr,
           sqrt(q.v * (q.v + q.t2) / q.t2 * (2 * ln(1 / alpha) + ln((q.v + q.t2) / q.v))) AS radius
      FROM q
  )
  SELECT r.llr, least(1.0, exp(-least(r.llr, 700))), r.d - r.radius, r.d + r.radius FROM r
$$;
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
