-- A route's serving state as the router caches it (app/gateway/table.py), and NOTIFY cft_route,
-- which carries that state at each commit that changes it, so a router applies a promotion
-- without reading it back (BENCHMARKS.md, "Promotion COMMIT → routed (item 5b)").

-- The state, defined once: the router's reads and the NOTIFY payload both come from here.
-- NULL when the tenant has no such route. Runs as the caller (the router's reads, or the owner
-- in the trigger below). traffic_pct is text so that the router keeps it exact.
CREATE OR REPLACE FUNCTION serve.route_state(p_tenant int, p_route text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
  SELECT jsonb_build_object(
           'name', r.name, 'tenant_id', r.tenant_id, 'base_model', r.base_model,
           'experiment', r.experiment, 'fallback', r.fallback,
           'prod', (SELECT a.id FROM serve.adapter a
                     WHERE a.tenant_id = r.tenant_id AND a.route = r.name AND a.status = 'prod'
                     ORDER BY a.created_at, a.id LIMIT 1),
           'canaries', coalesce(
             (SELECT jsonb_agg(jsonb_build_object('id', a.id, 'traffic_pct', a.traffic_pct::text,
                                                  'created_at', a.created_at)
                               ORDER BY a.created_at, a.id)
                FROM serve.adapter a
               WHERE a.tenant_id = r.tenant_id AND a.route = r.name AND a.status = 'canary'),
             '[]'::jsonb))
    FROM serve.route r WHERE r.tenant_id = p_tenant AND r.name = p_route
$$;
COMMENT ON FUNCTION serve.route_state(int, text) IS
  'A tenant''s route''s serving state (prod, canaries in split order, experiment) as JSON; NULL '
  'if none.';

-- NOTIFY cft_route with {"tenant_id", "route", "xid", "snapshot", "state"}: the state as of the snapshot
-- (one statement: the same snapshot for both), and this transaction's id. A router applies the
-- state only when that snapshot sees the transaction of the route's previous NOTIFY: PostgreSQL
-- delivers notifications in commit order, but a transaction of another isolation level, or one
-- that committed between this state and this commit, may have been missed; then it reads the
-- route instead. Above pg_notify's 8000 bytes (hundreds of canaries) the payload names the
-- tenant and route alone, and routers read it.
CREATE OR REPLACE FUNCTION serve.notify_route_state(p_tenant int, p_route text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_payload text;
BEGIN
  SELECT jsonb_build_object('tenant_id', p_tenant, 'route', p_route,
                            'xid', pg_current_xact_id()::text,
                            'snapshot', pg_current_snapshot()::text,
                            'state', serve.route_state(p_tenant, p_route))::text
    INTO v_payload;
  IF octet_length(v_payload) > 7900 THEN
    v_payload := jsonb_build_object('tenant_id', p_tenant, 'route', p_route)::text;
  END IF;
  PERFORM pg_notify('cft_route', v_payload);
END
$$;
REVOKE EXECUTE ON FUNCTION serve.notify_route_state(int, text) FROM PUBLIC;
COMMENT ON FUNCTION serve.notify_route_state(int, text) IS
  'NOTIFY cft_route with the route''s state, this transaction''s id and the state''s snapshot.';

-- Deferred to COMMIT, so the payload is the transaction's final state, whatever it changed
-- after this row (the previous prod demoted by a later statement, the route's experiment).
CREATE OR REPLACE FUNCTION serve.adapter_route_notify() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  IF TG_OP = 'UPDATE'
     AND (OLD.id, OLD.tenant_id, OLD.route, OLD.status, OLD.traffic_pct, OLD.created_at)
         IS NOT DISTINCT FROM
         (NEW.id, NEW.tenant_id, NEW.route, NEW.status, NEW.traffic_pct, NEW.created_at) THEN
    RETURN NULL;
  END IF;
  IF TG_OP <> 'INSERT' THEN
    PERFORM serve.notify_route_state(OLD.tenant_id, OLD.route);
  END IF;
  IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND (NEW.tenant_id, NEW.route)
                                                IS DISTINCT FROM (OLD.tenant_id, OLD.route)) THEN
    PERFORM serve.notify_route_state(NEW.tenant_id, NEW.route);
  END IF;
  RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS adapter_route_notify ON serve.adapter;
CREATE CONSTRAINT TRIGGER adapter_route_notify
  AFTER INSERT OR DELETE OR UPDATE OF id, tenant_id, route, status, traffic_pct, created_at
  ON serve.adapter
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION serve.adapter_route_notify();

CREATE OR REPLACE FUNCTION serve.route_notify() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  PERFORM serve.notify_route_state(OLD.tenant_id, OLD.name);
  IF TG_OP = 'UPDATE' AND (NEW.tenant_id, NEW.name) IS DISTINCT FROM (OLD.tenant_id, OLD.name) THEN
    PERFORM serve.notify_route_state(NEW.tenant_id, NEW.name);
  END IF;
  RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS route_notify ON serve.route;
CREATE CONSTRAINT TRIGGER route_notify
  AFTER DELETE OR UPDATE OF name, tenant_id, base_model, experiment, fallback ON serve.route
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION serve.route_notify();
