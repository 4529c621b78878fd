-- serve.adapter: keep updated_at, check the canary budget of a route, audit every change and
-- tell routers about it (NOTIFY cft_adapter, payload = route).

-- Runs as the owner: the budget must count every canary of the route and lock the route row,
-- whatever the caller may see or update.
CREATE OR REPLACE FUNCTION serve.check_canary_budget(p_tenant int, p_route text, p_adapter text,
                                                     p_pct numeric)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_total numeric;
BEGIN
  -- Serialise canary changes of one route so two transactions cannot both fit in the budget.
  PERFORM 1 FROM serve.route WHERE tenant_id = p_tenant AND name = p_route FOR UPDATE;
  SELECT coalesce(sum(traffic_pct), 0) INTO v_total
    FROM serve.adapter
   WHERE tenant_id = p_tenant AND route = p_route AND status = 'canary' AND id <> p_adapter;
  IF v_total + p_pct > 100 THEN
    RAISE check_violation USING
      MESSAGE = format('canaries of route %s would take %s %% of traffic (at most 100)',
                       p_route, v_total + p_pct);
  END IF;
END
$$;

-- The canary ceiling: the canaries of a route together get at most serve.route.max_canary_pct
-- of its users (default 50 %), however the UPDATE comes (REST, CLI, psql), unless the caller
-- overrides as the gate's override does (cft_release, cft.override = 'on', a cft.reason; the
-- audit records it). Owner rights: it counts every canary of the route, whatever the caller
-- may see. (INSERT of a canary is the owner's bootstrap alone, see serve/adapter_gate.sql.)
CREATE OR REPLACE FUNCTION serve.check_canary_ceiling(p_tenant int, p_route text, p_adapter text,
                                                      p_pct numeric, p_override boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_max   numeric;
  v_total numeric;
BEGIN
  SELECT max_canary_pct INTO v_max FROM serve.route WHERE tenant_id = p_tenant AND name = p_route;
  SELECT coalesce(sum(traffic_pct), 0) + p_pct INTO v_total
    FROM serve.adapter
   WHERE tenant_id = p_tenant AND route = p_route AND status = 'canary' AND id <> p_adapter;
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
REVOKE EXECUTE ON FUNCTION serve.check_canary_ceiling(int, text, text, numeric, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION serve.check_canary_ceiling(int, text, text, numeric, boolean)
  TO cft_app, cft_release;

-- Runs as the caller, so it can record who the caller is for the audit trigger that follows.
CREATE OR REPLACE FUNCTION serve.adapter_before_write() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.updated_at := now();
  -- Leaving canary or prod without naming a share (a hand rollback, `SET status = 'retired'`)
  -- takes the adapter out of traffic, as the status checks require.
  IF TG_OP = 'UPDATE' AND OLD.status IN ('canary', 'prod') AND NEW.status NOT IN ('canary', 'prod')
     AND NEW.traffic_pct = OLD.traffic_pct THEN
    NEW.traffic_pct := 0;
  END IF;
  IF NEW.status = 'canary' AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM NEW.status
                                OR OLD.traffic_pct IS DISTINCT FROM NEW.traffic_pct) THEN
    PERFORM serve.check_canary_budget(NEW.tenant_id, NEW.route, NEW.id, NEW.traffic_pct);
    IF TG_OP = 'UPDATE' THEN
      PERFORM serve.check_canary_ceiling(NEW.tenant_id, NEW.route, NEW.id, NEW.traffic_pct,
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

CREATE OR REPLACE FUNCTION serve.adapter_audit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  IF TG_OP = 'UPDATE' AND OLD.status IS NOT DISTINCT FROM NEW.status
     AND OLD.traffic_pct IS NOT DISTINCT FROM NEW.traffic_pct THEN
    RETURN NULL;
  END IF;
  INSERT INTO serve.adapter_event
    (adapter_id, route, tenant_id, op, old_status, new_status, old_traffic_pct, new_traffic_pct,
     actor, application_name, reason, override)
  VALUES
    (coalesce(NEW.id, OLD.id), coalesce(NEW.route, OLD.route), coalesce(NEW.tenant_id, OLD.tenant_id),
     TG_OP,
     CASE WHEN TG_OP <> 'INSERT' THEN OLD.status END,
     CASE WHEN TG_OP <> 'DELETE' THEN NEW.status END,
     CASE WHEN TG_OP <> 'INSERT' THEN OLD.traffic_pct END,
     CASE WHEN TG_OP <> 'DELETE' THEN NEW.traffic_pct END,
     coalesce(nullif(current_setting('cft.actor', true), ''), session_user),
     nullif(current_setting('application_name', true), ''),
     nullif(current_setting('cft.reason', true), ''),
     coalesce(nullif(current_setting('cft.override', true), ''), 'off') = 'on');
  PERFORM pg_notify('cft_adapter', coalesce(NEW.route, OLD.route));
  PERFORM set_config('cft.actor', '', true);
  RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER adapter_before_write
  BEFORE INSERT OR UPDATE ON serve.adapter
  FOR EACH ROW EXECUTE FUNCTION serve.adapter_before_write();

CREATE OR REPLACE TRIGGER adapter_audit
  AFTER INSERT OR UPDATE OR DELETE ON serve.adapter
  FOR EACH ROW EXECUTE FUNCTION serve.adapter_audit();

-- serve.check_canary_budget runs with owner rights and locks serve.route rows (FOR UPDATE);
-- like the gate's helpers it is for the roles that write serve.adapter, not for PUBLIC: the
-- read-only cft_dashboard could otherwise hold locks on every route and stall promotions.
REVOKE EXECUTE ON FUNCTION serve.check_canary_budget(int, text, text, numeric) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION serve.check_canary_budget(int, text, text, numeric)
  TO cft_app, cft_release;
