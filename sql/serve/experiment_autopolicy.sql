-- The experiment policy: act on the always-valid decisions of serve/canary_decision.sql.
--   * First the watch of the route's prod after its promotion (serve.watch_decision): a prod that
--     breaks a guard is rolled back with serve.rollback (rollback_enabled).
--   * Then each canary (serve.canary_decision): promote one that wins without breaking a guard,
--     retire one that loses, breaks a guard or runs out of budget (rollback_enabled).
-- It changes serve.adapter only by UPDATE (and serve.rollback), so the promotion gate
-- (adapter_gate) still decides: a canary without passing eval results is refused whatever its
-- traffic says. cft.reason carries the numbers into serve.adapter_event; serve.experiment_decision
-- keeps them as data. Runs as the caller (privileges, row-level security and the audit's actor
-- stay the caller's).
CREATE OR REPLACE FUNCTION serve.experiment_autopolicy(p_tenant int, p_route text)
RETURNS SETOF serve.experiment_decision
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  pol      serve.experiment_policy%ROWTYPE;
  v_rt     serve.route%ROWTYPE;
  v_exp    text;
  w        record;
  cd       record;
  v_items  jsonb := '[]';
  it       jsonb;
  v_action text;
  v_code   text;
  v_reason text;
  v_last   record;
  d        serve.experiment_decision%ROWTYPE;
BEGIN
  SELECT * INTO pol FROM serve.experiment_policy p WHERE p.tenant_id = p_tenant AND p.route = p_route;
  IF NOT FOUND OR NOT pol.enabled THEN
    RETURN;
  END IF;
  SELECT * INTO v_rt FROM serve.route r WHERE r.tenant_id = p_tenant AND r.name = p_route;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  v_exp := coalesce(v_rt.experiment, v_rt.name);

  -- The watch of a newly promoted prod comes first: a rollback changes what canaries compete with.
  FOR w IN SELECT * FROM serve.watch_decision(p_tenant, p_route) LOOP
    CONTINUE WHEN w.code IN ('no_prod', 'no_previous_prod');
    v_action := 'hold';
    v_code := 'watch_' || w.code;
    v_reason := 'watch: ' || w.reason;
    IF w.decision = 'rollback' THEN
      IF pol.rollback_enabled THEN
        BEGIN
          PERFORM serve.rollback(p_tenant, p_route, 'auto-policy ' || v_reason);
          v_action := 'rollback';
        EXCEPTION WHEN check_violation OR insufficient_privilege THEN
          v_action := 'blocked';
          v_code := 'rollback_refused';
          v_reason := v_reason || '; the rollback was refused: ' || SQLERRM;
        END;
        PERFORM set_config('cft.reason', '', true);
      ELSE
        v_reason := v_reason || ' (rollback_enabled is off)';
      END IF;
    END IF;
    v_items := v_items || jsonb_build_object('canary_id', w.adapter_id, 'control_id', w.previous_id,
      'action', v_action, 'code', v_code, 'reason', v_reason,
      'numbers', w.numbers || jsonb_build_object('decision', w.decision, 'watch', true));
  END LOOP;

  FOR cd IN SELECT * FROM serve.canary_decision(p_tenant, p_route) LOOP
    v_action := 'hold';
    v_code := cd.code;
    v_reason := cd.reason;
    IF cd.decision = 'promote' THEN
      v_code := 'promoted';
    ELSIF cd.decision = 'retire' AND NOT pol.rollback_enabled THEN
      v_reason := v_reason || ' (rollback_enabled is off)';
    END IF;
    IF cd.decision = 'promote' OR (cd.decision = 'retire' AND pol.rollback_enabled) THEN
      PERFORM set_config('cft.reason', 'auto-policy: ' || v_reason, true);
      BEGIN
        IF cd.decision = 'promote' THEN
          UPDATE serve.adapter SET status = 'prod', traffic_pct = 100 WHERE id = cd.canary_id;
          v_action := 'promote';
        ELSE
          UPDATE serve.adapter SET status = 'retired', traffic_pct = 0 WHERE id = cd.canary_id;
          v_action := 'rollback';
        END IF;
      EXCEPTION WHEN check_violation OR insufficient_privilege THEN
        v_action := 'blocked';
        v_code := 'gate_refused';
        v_reason := v_reason || '; the gate refused: ' || SQLERRM;
      END;
      PERFORM set_config('cft.reason', '', true);
    END IF;
    v_items := v_items || jsonb_build_object('canary_id', cd.canary_id, 'control_id', cd.control_id,
      'action', v_action, 'code', v_code, 'reason', v_reason,
      'numbers', cd.numbers || jsonb_build_object('decision', cd.decision));
  END LOOP;

  -- Record each decision (a hold or blocked one only when it differs from the adapter's last).
  FOR it IN SELECT e FROM jsonb_array_elements(v_items) e LOOP
    d := NULL;
    d.route := p_route;
    d.tenant_id := v_rt.tenant_id;
    d.experiment := v_exp;
    d.canary_id := it->>'canary_id';
    d.control_id := it->>'control_id';
    d.action := it->>'action';
    d.code := it->>'code';
    d.metric := pol.metric;
    d.reason := it->>'reason';
    d.numbers := it->'numbers';
    d.decided_by := current_user;
    d.decided_at := clock_timestamp();
    SELECT e.action, e.code INTO v_last FROM serve.experiment_decision e
     WHERE e.canary_id = d.canary_id ORDER BY e.id DESC LIMIT 1;
    IF d.action IN ('promote', 'rollback') OR v_last IS NULL
       OR (v_last.action, v_last.code) IS DISTINCT FROM (d.action, d.code) THEN
      INSERT INTO serve.experiment_decision
        (route, tenant_id, experiment, canary_id, control_id, action, code, metric, reason, numbers,
         decided_by, decided_at)
      VALUES (d.route, d.tenant_id, d.experiment, d.canary_id, d.control_id, d.action, d.code,
              d.metric, d.reason, d.numbers, d.decided_by, d.decided_at)
      RETURNING id INTO d.id;
    END IF;
    RETURN NEXT d;
  END LOOP;
END
$$;
COMMENT ON FUNCTION serve.experiment_autopolicy(int, text) IS
  'Apply the tenant''s route''s enabled serve.experiment_policy now: roll back a newly promoted prod that '
  'breaks a guard (serve.watch_decision), then per canary act on serve.canary_decision (promote '
  'through the gate; retire on significantly_worse, guard_*, budget_exhausted). Always-valid '
  'tests: checking as often as you like keeps the error bound. Returns the decisions (id NULL = '
  'same as the last recorded one, not stored again).';

-- Every route with an enabled policy (tenant and name), for the worker.
CREATE OR REPLACE FUNCTION serve.experiment_policy_routes()
RETURNS TABLE (tenant_id int, route text) LANGUAGE sql STABLE AS $$
  SELECT p.tenant_id, p.route FROM serve.experiment_policy p WHERE p.enabled
   ORDER BY p.tenant_id, p.route
$$;
