"""Experiments: A/B metrics, significance, auto-promotion policy.

Revision ID: 0006
Revises: 0005
"""

from app.core import sqlfiles

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# SQL files this migration runs, in order (paths under sql/).
FILES: list[str] = [
    "functions/experiment_stats_v1.sql",
    "functions/experiment_metrics_v1.sql",
    "views/experiment_v1.sql",
    "schema/experiment_v1.sql",
    "functions/experiment_policy_v1.sql",
]
# SQL that undoes them (drop what FILES created).
DOWNGRADE_SQL = """
DROP FUNCTION IF EXISTS serve.experiment_policy_routes();
DROP FUNCTION IF EXISTS serve.experiment_autopolicy(text);
DROP TABLE IF EXISTS serve.experiment_decision;
DROP TABLE IF EXISTS serve.experiment_policy;
DROP VIEW IF EXISTS obs.experiment_compare_7d;
DROP VIEW IF EXISTS obs.experiment_arm_7d;
DROP VIEW IF EXISTS obs.experiment;
DROP FUNCTION IF EXISTS obs.experiment_compare(text, timestamptz, timestamptz, float8, float8, float8, float8);
DROP FUNCTION IF EXISTS obs.experiment_series(text, timestamptz, timestamptz, text, float8);
DROP FUNCTION IF EXISTS obs.experiment_arms(text, timestamptz, timestamptz, float8);
DROP FUNCTION IF EXISTS obs.experiment_agg_v1(text, timestamptz, timestamptz, text, float8);
DROP SCHEMA IF EXISTS stats CASCADE;
"""


def upgrade() -> None:
    sqlfiles.apply(FILES)


def downgrade() -> None:
    sqlfiles.execute(DOWNGRADE_SQL)
