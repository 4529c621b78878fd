-- The promotion gate, enforced on serve.adapter whoever writes it (REST, CLI or psql):
--   * status -> 'prod' only if serve.can_promote(new, current prod) holds; the same statement
--     retires the previous prod (before the new row becomes prod, as the one-prod index is
--     checked row by row), stamps promoted_at and remembers previous_prod_id;
--   * status -> 'canary' only with eval results (the policy's required metrics present);
--   * a prod leaving prod (a rollback) restores previous_prod_id, when it is still restorable;
--   * an override needs SET LOCAL cft.override = 'on', a non-empty cft.reason and the
--     cft_release role (as session or current role); adapter_event records it.
-- Only the owner of serve.adapter (migrations, bootstrap) may INSERT a canary or a prod.

-- Owner rights: the route row must be locked whatever the caller may update.
CREATE OR REPLACE FUNCTION serve.lock_route(p_tenant int, p_route text) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
  SELECT 1 FROM serve.route WHERE tenant_id = p_tenant AND name = p_route FOR UPDATE
$$;

-- The caller's rights: a tenant's key finds only its own routes' prod (another tenant's route
-- answers NULL, as row-level security shows it no row); release and dashboard roles see all.
CREATE OR REPLACE FUNCTION serve.current_prod(p_tenant int, p_route text) RETURNS text
LANGUAGE sql VOLATILE SET search_path = pg_catalog, public, pg_temp AS $$
  SELECT id FROM serve.adapter WHERE tenant_id = p_tenant AND route = p_route AND status = 'prod'
$$;

-- The adapter a rollback of p_adapter would restore, or NULL if there is none fit to serve.
CREATE OR REPLACE FUNCTION serve.previous_prod(p_adapter text) RETURNS text
LANGUAGE sql VOLATILE SET search_path = pg_catalog, public, pg_temp AS $$
  SELECT p.id FROM serve.adapter a JOIN serve.adapter p ON p.id = a.previous_prod_id
   WHERE a.id = p_adapter AND p.tenant_id = a.tenant_id AND p.route = a.route
     AND p.status = 'retired' AND p.tainted_at IS NULL
$$;

-- Owner rights: callers may not write the audit trail; this adds the gate's verdict to the event
-- the audit trigger has just written for the adapter: one written since the caller's transaction
-- began, of the caller's tenant when it has one (never another tenant's event, nor an old one).
CREATE OR REPLACE FUNCTION serve.annotate_adapter_event(p_adapter text, p_detail jsonb)
RETURNS void LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
  UPDATE serve.adapter_event SET detail = coalesce(detail, '{}') || p_detail
   WHERE id = (SELECT max(e.id) FROM serve.adapter_event e
                WHERE e.adapter_id = p_adapter AND e.at >= pg_catalog.now()
                  AND (auth.current_tenant_id() IS NULL OR e.tenant_id = auth.current_tenant_id()))
$$;

REVOKE EXECUTE ON FUNCTION serve.lock_route(int, text), serve.current_prod(int, text),
  serve.previous_prod(text), serve.annotate_adapter_event(text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION serve.lock_route(int, text), serve.current_prod(int, text),
  serve.previous_prod(text), serve.annotate_adapter_event(text, jsonb)
  TO cft_app, cft_release;

-- Runs as the caller, so privileges, row-level security and the audit's actor stay the caller's.
CREATE OR REPLACE FUNCTION serve.adapter_gate() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_override boolean := coalesce(nullif(current_setting('cft.override', true), ''), 'off') = 'on';
  v_reason   text := nullif(btrim(coalesce(current_setting('cft.reason', true), '')), '');
  v_gate     text;
  v_current  text;
  v_blockers jsonb;
  v_n        bigint;
BEGIN
  IF TG_OP = 'INSERT' THEN
    IF NEW.status IN ('canary', 'prod') AND NOT EXISTS (
         SELECT 1 FROM pg_class c WHERE c.oid = 'serve.adapter'::regclass
            AND pg_has_role(current_user, c.relowner, 'USAGE')) THEN
      RAISE insufficient_privilege USING
        MESSAGE = format('adapter %s may not be created as %s: create it as candidate and '
                         'promote it through the gate', NEW.id, NEW.status);
    END IF;
    RETURN NEW;
  END IF;

  -- Changes the gate makes itself (retiring the old prod, restoring on rollback) are nested in
  -- this trigger and marked; a user cannot reach trigger depth 2 on this table on their own.
  IF pg_trigger_depth() > 1 AND coalesce(current_setting('cft.gate_internal', true), '') = NEW.id THEN
    IF NEW.status = 'prod' AND OLD.status <> 'prod' THEN
      NEW.promoted_at := now();
    END IF;
    RETURN NEW;
  END IF;

  IF NEW.status = 'prod' AND OLD.status <> 'prod' THEN
    v_gate := 'promotion';
  ELSIF NEW.status = 'canary' AND OLD.status <> 'canary' THEN
    v_gate := 'canary';
  ELSIF OLD.status = 'prod' AND NEW.status <> 'prod' THEN
    -- A rollback: serialise with promotions of the route; the AFTER trigger restores.
    PERFORM serve.lock_route(NEW.tenant_id, NEW.route);
    RETURN NEW;
  ELSE
    RETURN NEW;
  END IF;

  -- Two promotions of one route queue here; the second then compares against the first.
  PERFORM serve.lock_route(NEW.tenant_id, NEW.route);
  IF v_gate = 'promotion' THEN
    v_current := serve.current_prod(NEW.tenant_id, NEW.route);
  END IF;
  SELECT jsonb_agg(to_jsonb(b)) INTO v_blockers FROM serve.promotion_blockers(NEW.id, v_current) b;

  IF v_override THEN
    IF v_reason IS NULL THEN
      RAISE insufficient_privilege USING
        MESSAGE = 'cft.override is on but cft.reason is empty: an override needs a reason',
        HINT = 'SET LOCAL cft.reason = ''why this is safe'';';
    END IF;
    IF 'cft_release' NOT IN (current_user::text, session_user::text) THEN
      RAISE insufficient_privilege USING
        MESSAGE = format('cft.override is on but %s is not acting as cft_release', current_user),
        HINT = 'SET LOCAL ROLE cft_release; (the login role must be a member of cft_release)';
    END IF;
  ELSIF v_blockers IS NOT NULL THEN
    RAISE check_violation USING
      CONSTRAINT = CASE v_gate WHEN 'promotion' THEN 'adapter_promotion_gate'
                               ELSE 'adapter_canary_gate' END,
      MESSAGE = format('%s gate refused %s%s: %s',
        v_gate, NEW.id, CASE WHEN v_current IS NOT NULL THEN ' over ' || v_current ELSE '' END,
        (SELECT string_agg(coalesce(b->>'suite_id' || '/' || (b->>'metric') || ': ', '')
                           || (b->>'reason'), '; ')
           FROM jsonb_array_elements(v_blockers) b)),
      DETAIL = v_blockers::text,
      HINT = 'see SELECT * FROM serve.promotion_blockers(candidate, current)';
  END IF;

  IF v_gate = 'promotion' THEN
    IF v_current IS NOT NULL THEN
      PERFORM set_config('cft.gate_internal', v_current, true);
      UPDATE serve.adapter SET status = 'retired', traffic_pct = 0 WHERE id = v_current;
      GET DIAGNOSTICS v_n = ROW_COUNT;
      PERFORM set_config('cft.gate_internal', '', true);
      IF v_n <> 1 THEN
        RAISE insufficient_privilege USING
          MESSAGE = format('cannot retire the current prod %s of route %s', v_current, NEW.route);
      END IF;
    END IF;
    NEW.promoted_at := now();
    NEW.previous_prod_id := v_current;
  END IF;
  PERFORM set_config('cft.gate_detail', jsonb_build_object(
    'adapter_id', NEW.id, 'gate', v_gate, 'against', v_current,
    'overridden', CASE WHEN v_override THEN coalesce(v_blockers, '[]') END)::text, true);
  RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION serve.adapter_gate_after() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_detail jsonb := nullif(coalesce(current_setting('cft.gate_detail', true), ''), '')::jsonb;
  v_prev   text;
BEGIN
  IF v_detail->>'adapter_id' = NEW.id THEN
    PERFORM set_config('cft.gate_detail', '', true);
    PERFORM serve.annotate_adapter_event(NEW.id, jsonb_strip_nulls(v_detail - 'adapter_id'));
  END IF;
  IF OLD.status = 'prod' AND NEW.status <> 'prod'
     AND NOT (pg_trigger_depth() > 1 AND coalesce(current_setting('cft.gate_internal', true), '') = NEW.id) THEN
    v_prev := serve.previous_prod(NEW.id);
    IF v_prev IS NOT NULL THEN
      PERFORM set_config('cft.gate_internal', v_prev, true);
      UPDATE serve.adapter SET status = 'prod', traffic_pct = 100 WHERE id = v_prev;
      PERFORM set_config('cft.gate_internal', '', true);
      PERFORM serve.annotate_adapter_event(v_prev,
        jsonb_build_object('gate', 'rollback', 'rolled_back', NEW.id));
    END IF;
  END IF;
  RETURN NULL;
END
$$;

-- Explicit rollback: retire the prod of the tenant's route and restore the one it replaced, or
-- fail.
CREATE OR REPLACE FUNCTION serve.rollback(tenant_id int, route text, reason text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_tenant int := $1;
  v_route  text := $2;
  v_reason text := nullif(btrim(coalesce($3, '')), '');
  v_cur    text;
  v_prev   text;
BEGIN
  IF v_reason IS NULL THEN
    RAISE invalid_parameter_value USING MESSAGE = 'a rollback needs a reason';
  END IF;
  PERFORM serve.lock_route(v_tenant, v_route);
  v_cur := serve.current_prod(v_tenant, v_route);
  IF v_cur IS NULL THEN
    RAISE check_violation USING CONSTRAINT = 'adapter_rollback',
      MESSAGE = format('route %s has no prod adapter to roll back', v_route);
  END IF;
  v_prev := serve.previous_prod(v_cur);
  IF v_prev IS NULL THEN
    RAISE check_violation USING CONSTRAINT = 'adapter_rollback',
      MESSAGE = format('prod %s of route %s has no previous prod fit to restore', v_cur, v_route);
  END IF;
  PERFORM set_config('cft.reason', v_reason, true);
  UPDATE serve.adapter SET status = 'retired', traffic_pct = 0 WHERE id = v_cur;
  IF serve.current_prod(v_tenant, v_route) IS DISTINCT FROM v_prev THEN
    RAISE check_violation USING CONSTRAINT = 'adapter_rollback',
      MESSAGE = format('rollback of route %s did not restore %s', v_route, v_prev);
  END IF;
  RETURN v_prev;
END
$$;
COMMENT ON FUNCTION serve.rollback(int, text, text) IS
  'Retire the prod of a tenant''s route and restore the prod it replaced, in one transaction; '
  'returns its id.';

-- BEFORE triggers fire in name order: the gate ('adapter_a_gate') runs before
-- adapter_before_write, so the old prod is retired (and audited) before the outer row's actor is
-- recorded and its canary budget checked. AFTER: 'adapter_audit' writes the event first, then
-- 'adapter_gate_after' annotates it and restores on rollback.
CREATE OR REPLACE TRIGGER adapter_a_gate
  BEFORE INSERT OR UPDATE ON serve.adapter
  FOR EACH ROW EXECUTE FUNCTION serve.adapter_gate();

CREATE OR REPLACE TRIGGER adapter_gate_after
  AFTER UPDATE ON serve.adapter
  FOR EACH ROW EXECUTE FUNCTION serve.adapter_gate_after();
