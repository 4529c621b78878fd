"""The canary ceiling: a route's canaries together get at most serve.route.max_canary_pct.

serve.route.max_canary_pct (default 50 %) caps the share of users all canaries of a route get,
enforced on every UPDATE of serve.adapter by serve.check_canary_ceiling (called from
serve.adapter_before_write); going above needs the gate's override (cft_release,
cft.override = 'on', a cft.reason), which the audit records.

Revision ID: 20261203
Revises: 20261202
"""

from alembic import op

revision = "20261203"
down_revision = "20261202"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
ALTER TABLE serve.route ADD COLUMN max_canary_pct numeric(5,2) NOT NULL DEFAULT 50
  CHECK (max_canary_pct BETWEEN 0 AND 100);
COMMENT ON COLUMN serve.route.max_canary_pct IS
  'Most users all canaries of the route may get together (default 50 %); above it needs the override.';
-- The canary ceiling: the canaries of a route together get at most serve.route.max_canary_pct
-- of its users (default 50 %), however the UPDATE comes (REST, CLI, psql), unless the caller
-- overrides as the gate's override does (cft_release, cft.override = 'on', a cft.reason; the
-- audit records it). Owner rights: it counts every canary of the route, whatever the caller
-- may see. (INSERT of a canary is the owner's bootstrap alone, see serve/adapter_gate.sql.)
CREATE OR REPLACE FUNCTION serve.check_canary_ceiling(p_route text, p_adapter text, p_pct numeric,
                                                      p_override boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  v_max   numeric;
  v_total numeric;
BEGIN
  SELECT max_canary_pct INTO v_max FROM serve.route WHERE name = p_route;
  SELECT coalesce(sum(traffic_pct), 0) + p_pct INTO v_total
    FROM serve.adapter WHERE route = p_route AND status = 'canary' AND id <> p_adapter;
  IF v_total > v_max AND NOT p_override THEN
    RAISE check_violation USING
      CONSTRAINT = 'adapter_canary_ceiling',
      MESSAGE = format('canaries of route %s would get %s %% of users, above its ceiling of %s %%'
                       ' (serve.route.max_canary_pct)', p_route, v_total, v_max),
      HINT = 'lower traffic_pct, raise serve.route.max_canary_pct, or override as cft_release:'
             ' SET LOCAL cft.override = ''on''; SET LOCAL cft.reason = ''why'';';
  END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION serve.check_canary_ceiling(text, text, numeric, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION serve.check_canary_ceiling(text, text, numeric, boolean)
  TO cft_app, cft_release;
CREATE OR REPLACE FUNCTION serve.adapter_before_write() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.updated_at := now();
  -- Leaving canary or prod without naming a share (the seed's rollback, `SET status =
  -- 'retired'`) takes the adapter out of traffic, as the status checks require.
  IF TG_OP = 'UPDATE' AND OLD.status IN ('canary', 'prod') AND NEW.status NOT IN ('canary', 'prod')
     AND NEW.traffic_pct = OLD.traffic_pct THEN
    NEW.traffic_pct := 0;
  END IF;
  IF NEW.status = 'canary' AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status
                                OR OLD.traffic_pct IS DISTINCT FROM NEW.traffic_pct) THEN
    PERFORM serve.check_canary_budget(NEW.route, NEW.id, NEW.traffic_pct);
    IF TG_OP = 'UPDATE' THEN
      PERFORM serve.check_canary_ceiling(NEW.route, NEW.id, NEW.traffic_pct,
        coalesce(nullif(current_setting('cft.override', true), ''), 'off') = 'on'
        AND nullif(btrim(coalesce(current_setting('cft.reason', true), '')), '') IS NOT NULL
        AND 'cft_release' IN (current_user::text, session_user::text));
    END IF;
  END IF;
  PERFORM set_config('cft.actor', session_user ||
    CASE WHEN current_user <> session_user THEN ' as ' || current_user ELSE '' END, true);
  RETURN NEW;
END
$$;
"""

DOWNGRADE_SQL = r"""
CREATE OR REPLACE FUNCTION serve.adapter_before_write() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.updated_at := now();
  -- Leaving canary or prod without naming a share (the seed's rollback, `SET status =
  -- 'retired'`) takes the adapter out of traffic, as the status checks require.
  IF TG_OP = 'UPDATE' AND OLD.status IN ('canary', 'prod') AND NEW.status NOT IN ('canary', 'prod')
     AND NEW.traffic_pct = OLD.traffic_pct THEN
    NEW.traffic_pct := 0;
  END IF;
  IF NEW.status = 'canary' AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status
                                OR OLD.traffic_pct IS DISTINCT FROM NEW.traffic_pct) THEN
    PERFORM serve.check_canary_budget(NEW.route, NEW.id, NEW.traffic_pct);
  END IF;
  PERFORM set_config('cft.actor', session_user ||
    CASE WHEN current_user <> session_user THEN ' as ' || current_user ELSE '' END, true);
  RETURN NEW;
END
$$;
DROP FUNCTION serve.check_canary_ceiling(text, text, numeric, boolean);
ALTER TABLE serve.route DROP COLUMN max_canary_pct;
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
