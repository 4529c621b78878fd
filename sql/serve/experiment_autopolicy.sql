-- The experiment policy: promote a canary that wins on live traffic, retire one that loses.
-- It changes serve.adapter only by UPDATE, so the promotion gate (adapter_gate) still decides:
-- a canary without passing eval results is refused whatever its traffic says. cft.reason carries
-- the numbers into serve.adapter_event; serve.experiment_decision keeps them as data.
-- Runs as the caller (privileges, row-level security and the audit's actor stay the caller's).
CREATE OR REPLACE FUNCTION serve.experiment_autopolicy(p_route text)
RETURNS SETOF serve.experiment_decision
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, public AS $$
DECLARE
  pol      serve.experiment_policy%ROWTYPE;
  v_rt     serve.route%ROWTYPE;
  v_exp    text;
  v_prod   text;
  v_cmp    jsonb;
  v_canary text;
  m        jsonb;
  g_regen  jsonb;
  g_ttft   jsonb;
  v_action text;
  v_code   text;
  v_reason text;
  v_regen_worse boolean;
  v_ttft_bad    boolean;
  v_last   record;
  d        serve.experiment_decision%ROWTYPE;
BEGIN
  SELECT * INTO pol FROM serve.experiment_policy p WHERE p.route = p_route;
  IF NOT FOUND OR NOT pol.enabled THEN
    RETURN;
  END IF;
  SELECT * INTO v_rt FROM serve.route r WHERE r.name = p_route;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  v_exp := coalesce(v_rt.experiment, v_rt.name);
  v_prod := serve.current_prod(p_route);
  SELECT coalesce(jsonb_agg(to_jsonb(x)), '[]') INTO v_cmp
    FROM obs.experiment_compare(v_exp, now() - pol.window_size, now(), pol.alpha) x;

  FOR v_canary IN SELECT a.id FROM serve.adapter a
                   WHERE a.route = p_route AND a.status = 'canary' ORDER BY a.id LOOP
    SELECT e INTO m FROM jsonb_array_elements(v_cmp) e
     WHERE e->>'canary_adapter' = v_canary AND e->>'metric' = pol.metric
     ORDER BY (e->>'n_canary')::bigint DESC LIMIT 1;
    SELECT e INTO g_regen FROM jsonb_array_elements(v_cmp) e
     WHERE e->>'canary_adapter' = v_canary AND e->>'metric' = 'regen_rate'
     ORDER BY (e->>'n_canary')::bigint DESC LIMIT 1;
    SELECT e INTO g_ttft FROM jsonb_array_elements(v_cmp) e
     WHERE e->>'canary_adapter' = v_canary AND e->>'metric' = 'ttft_p95'
     ORDER BY (e->>'n_canary')::bigint DESC LIMIT 1;

    v_action := 'hold';
    IF m IS NULL THEN
      v_code := 'no_control';
      v_reason := format('no traffic of canary %s and prod in experiment %s over %s',
                         v_canary, v_exp, pol.window_size);
    ELSIF m->>'control_adapter' IS DISTINCT FROM v_prod THEN
      v_code := 'control_not_prod';
      v_reason := format('the control arm (%s) is not the current prod (%s): wait for traffic',
                         m->>'control_adapter', coalesce(v_prod, 'none'));
    ELSIF (m->>'n_control')::bigint < pol.min_n OR (m->>'n_canary')::bigint < pol.min_n THEN
      v_code := 'insufficient_sample';
      v_reason := format('%s: n %s (prod) and %s (canary), at least %s per arm needed',
                         pol.metric, m->>'n_control', m->>'n_canary', pol.min_n);
    ELSE
      v_regen_worse := pol.guard_regen AND coalesce((g_regen->>'significant')::boolean, false)
                       AND (g_regen->>'canary_better')::boolean IS FALSE;
      v_ttft_bad := pol.max_ttft_p95_increase IS NOT NULL
                    AND (g_ttft->>'canary_value')::float8
                        > (g_ttft->>'control_value')::float8 * (1 + pol.max_ttft_p95_increase);
      v_reason := format('%s: prod %s %s, canary %s %s, diff %s [%s, %s], p = %s (alpha %s), n %s vs %s',
        pol.metric, m->>'control_adapter', round((m->>'control_value')::numeric, 4),
        v_canary, round((m->>'canary_value')::numeric, 4), round((m->>'diff')::numeric, 4),
        round((m->>'diff_ci_low')::numeric, 4), round((m->>'diff_ci_high')::numeric, 4),
        m->>'p_value', pol.alpha, m->>'n_control', m->>'n_canary');
      IF (m->>'significant')::boolean AND (m->>'canary_better')::boolean IS FALSE THEN
        v_action := CASE WHEN pol.rollback_enabled THEN 'rollback' ELSE 'hold' END;
        v_code := CASE WHEN pol.rollback_enabled THEN 'rolled_back' ELSE 'significantly_worse' END;
        v_reason := 'canary significantly worse: ' || v_reason;
      ELSIF (m->>'significant')::boolean AND (m->>'canary_better')::boolean THEN
        IF v_regen_worse AND pol.metric <> 'regen_rate' THEN
          v_code := 'guard_regen';
          v_reason := format('canary wins but regenerations rise (%s -> %s, p = %s): ',
            round((g_regen->>'control_value')::numeric, 4),
            round((g_regen->>'canary_value')::numeric, 4), g_regen->>'p_value') || v_reason;
        ELSIF v_ttft_bad THEN
          v_code := 'guard_ttft_p95';
          v_reason := format('canary wins but ttft p95 rises beyond %s %% (%s -> %s ms): ',
            pol.max_ttft_p95_increase * 100, round((g_ttft->>'control_value')::numeric, 1),
            round((g_ttft->>'canary_value')::numeric, 1)) || v_reason;
        ELSE
          v_action := 'promote';
          v_code := 'promoted';
          v_reason := 'canary significantly better: ' || v_reason;
        END IF;
      ELSIF v_regen_worse AND pol.rollback_enabled THEN
        v_action := 'rollback';
        v_code := 'rolled_back';
        v_reason := format('regenerations significantly higher (%s -> %s, p = %s); ',
          round((g_regen->>'control_value')::numeric, 4),
          round((g_regen->>'canary_value')::numeric, 4), g_regen->>'p_value') || v_reason;
      ELSE
        v_code := 'not_significant';
        v_reason := 'no significant difference yet: ' || v_reason;
      END IF;
    END IF;

    IF v_action IN ('promote', 'rollback') THEN
      PERFORM set_config('cft.reason', 'auto-policy: ' || v_reason, true);
      BEGIN
        IF v_action = 'promote' THEN
          UPDATE serve.adapter SET status = 'prod', traffic_pct = 100 WHERE id = v_canary;
        ELSE
          UPDATE serve.adapter SET status = 'retired', traffic_pct = 0 WHERE id = v_canary;
        END IF;
      EXCEPTION WHEN check_violation OR insufficient_privilege THEN
        v_action := 'blocked';
        v_code := 'gate_refused';
        v_reason := v_reason || '; the gate refused: ' || SQLERRM;
      END;
      PERFORM set_config('cft.reason', '', true);
    END IF;

    d := NULL;
    d.route := p_route;
    d.tenant_id := v_rt.tenant_id;
    d.experiment := v_exp;
    d.canary_id := v_canary;
    d.control_id := coalesce(m->>'control_adapter', v_prod);
    d.action := v_action;
    d.code := v_code;
    d.metric := pol.metric;
    d.reason := v_reason;
    d.numbers := jsonb_build_object('metric', m, 'regen_rate', g_regen, 'ttft_p95', g_ttft,
      'policy', to_jsonb(pol) - 'created_at' - 'updated_at', 'prod', v_prod,
      'window_until', now());
    d.decided_by := current_user;
    d.decided_at := clock_timestamp();

    SELECT e.action, e.code INTO v_last FROM serve.experiment_decision e
     WHERE e.canary_id = v_canary ORDER BY e.id DESC LIMIT 1;
    IF v_action IN ('promote', 'rollback') OR v_last IS NULL
       OR (v_last.action, v_last.code) IS DISTINCT FROM (v_action, v_code) THEN
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
COMMENT ON FUNCTION serve.experiment_autopolicy(text) IS
  'Apply the route''s enabled serve.experiment_policy to each of its canaries now: promote (through '
  'the gate) when the metric is significantly better and the guards hold, retire when significantly '
  'worse, else hold. Returns the decisions (id NULL = same as the last recorded one, not stored again).';

-- Every route with an enabled policy, for the worker.
CREATE OR REPLACE FUNCTION serve.experiment_policy_routes() RETURNS SETOF text
LANGUAGE sql STABLE AS $$
  SELECT p.route FROM serve.experiment_policy p WHERE p.enabled ORDER BY p.route
$$;
