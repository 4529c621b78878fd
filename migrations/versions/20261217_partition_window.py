"""Partitions only inside the created_at window: obs.move_default_rows takes p_weeks_ahead and
leaves rows further ahead in DEFAULT.

Revision ID: 20261217
Revises: 20261216
"""

from alembic import op

revision = "20261217"
down_revision = "20261216"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
DROP FUNCTION obs.move_default_rows(interval);
-- Give every row in DEFAULT within the window (newer than p_keep, no later than p_weeks_ahead
-- weeks after this one) a weekly partition of its own. Returns the partitions created. Rows
-- older than the retention are left for drop_partitions; rows further ahead stay in DEFAULT
-- until their week comes within reach. The window bounds the partitions one writer can cause
-- (each is ten indexes and a lock in every query of the whole log), whatever created_at it sets.
CREATE OR REPLACE FUNCTION obs.move_default_rows(p_keep interval DEFAULT NULL,
                                                 p_weeks_ahead int DEFAULT 4)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
  v_week timestamptz;
BEGIN
  FOR v_week IN
    SELECT DISTINCT obs.week_start(created_at) FROM ONLY obs.inference_log_default
     WHERE (p_keep IS NULL OR created_at >= obs.week_start(now() - p_keep))
       AND created_at < obs.week_start(now()) + make_interval(weeks => p_weeks_ahead + 1)
     ORDER BY 1
  LOOP
    IF obs.ensure_week_partition(v_week) THEN
      RETURN NEXT obs.partition_name(v_week);
    END IF;
  END LOOP;
END
$$;
"""


def upgrade() -> None:
    """Replace the function with its windowed version."""
    op.execute(UPGRADE_SQL)


DOWNGRADE_SQL = r"""
DROP FUNCTION obs.move_default_rows(interval, int);
-- Give every row in DEFAULT (newer than p_keep) a weekly partition of its own. Returns the
-- partitions created. Rows older than the retention are left for drop_partitions.
CREATE OR REPLACE FUNCTION obs.move_default_rows(p_keep interval DEFAULT NULL)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
  v_week timestamptz;
BEGIN
  FOR v_week IN
    SELECT DISTINCT obs.week_start(created_at) FROM ONLY obs.inference_log_default
     WHERE p_keep IS NULL OR created_at >= obs.week_start(now() - p_keep)
     ORDER BY 1
  LOOP
    IF obs.ensure_week_partition(v_week) THEN
      RETURN NEXT obs.partition_name(v_week);
    END IF;
  END LOOP;
END
$$;
"""


def downgrade() -> None:
    """Restore the unbounded version."""
    op.execute(DOWNGRADE_SQL)
