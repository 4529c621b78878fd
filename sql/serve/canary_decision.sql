-- Decisions whose error rate is what the policy says, however often they are checked: what to do
-- with a route's canaries, and with a newly promoted prod, from live traffic, by always-valid tests
-- (the normal-mixture mSPRT, stats/sequential.sql), and never past a guard.
--   serve.canary_decision(tenant, route): per canary vs prod, promote / retire / continue;
--   serve.watch_decision(tenant, route):  the current prod vs the prod it replaced, since its
--                                         promotion, rollback / keep / continue.
-- Both only read and return the numbers behind the decision (jsonb); serve.experiment_autopolicy
-- (and the autonomous loop) act on them. They run as the caller.

-- The route's experiment policy, or a row of the table's defaults when the route has none (the
-- defaults are read from the catalog, so they are stated once, in serve/experiment_policy.sql).
CREATE OR REPLACE FUNCTION serve.experiment_policy_of(p_tenant int, p_route text)
RETURNS serve.experiment_policy LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  pol    serve.experiment_policy;
  v_defs jsonb := '{}';
  v_val  jsonb;
  a      record;
BEGIN
  SELECT * INTO pol FROM serve.experiment_policy p WHERE p.tenant_id = p_tenant AND p.route = p_route;
  IF FOUND THEN
    RETURN pol;
  END IF;
  FOR a IN SELECT att.attname, pg_get_expr(d.adbin, d.adrelid) AS expr
             FROM pg_attrdef d
             JOIN pg_attribute att ON att.attrelid = d.adrelid AND att.attnum = d.adnum
            WHERE d.adrelid = 'serve.experiment_policy'::regclass AND NOT att.attisdropped LOOP
    EXECUTE format('SELECT to_jsonb(%s)', a.expr) INTO v_val;
    v_defs := v_defs || jsonb_build_object(a.attname, v_val);
  END LOOP;
  RETURN jsonb_populate_record(NULL::serve.experiment_policy, v_defs || jsonb_build_object(
    'route', p_route, 'enabled', false, 'tenant_id', p_tenant));
END
$$;
COMMENT ON FUNCTION serve.experiment_policy_of(int, text) IS
  'The tenant''s route''s serve.experiment_policy row, or one of the column defaults (enabled = false).';

-- The guards of a policy on obs.sequential_compare rows (a jsonb array). A guard is tripped when
-- the canary is significantly worse than its margin (the always-valid interval's bound past the
-- margin: each side errs with probability <= alpha under continuous monitoring), and holds when
-- it is significantly within it. Rates (regen, thumbs_down, error): margin absolute, lower is
-- better; tokens_out: margin a share of the control's mean, longer only (a run-away or verbose
-- adapter costs tokens and time; a shorter answer may be what users asked for, e.g. a length
-- limit, and the primary metric judges it); ttft_p95: the canary's
-- share of rows above control p95 x (1 + margin) significantly above 5 %. NULL margin = off.
CREATE OR REPLACE FUNCTION serve.guard_verdicts(p_cmp jsonb, p_policy serve.experiment_policy)
RETURNS jsonb LANGUAGE sql STABLE AS $$
  WITH g (ord, guard, metric, margin) AS (
    VALUES (1, 'regen', 'regen_rate', p_policy.guard_regen_margin),
           (2, 'thumbs_down', 'thumbs_down_rate', p_policy.guard_thumbs_down_margin),
           (3, 'error', 'error_rate', p_policy.guard_error_margin),
           (4, 'ttft_p95', 'ttft_p95', p_policy.max_ttft_p95_increase),
           (5, 'tokens_out', 'tokens_out_avg', p_policy.guard_tokens_out_margin)
  ), v AS (
    SELECT g.ord, g.guard, g.metric, g.margin, s.e,
           CASE g.guard WHEN 'ttft_p95' THEN 0::float8
                        WHEN 'tokens_out' THEN g.margin * abs((s.e->>'control_value')::float8)
                        ELSE g.margin END AS bound,
           (s.e->>'ci_low')::float8 AS lo, (s.e->>'ci_high')::float8 AS hi
      FROM g
      LEFT JOIN LATERAL (SELECT x FROM jsonb_array_elements(p_cmp) x
                          WHERE x->>'metric' = g.metric LIMIT 1) s(e) ON true
     WHERE g.margin IS NOT NULL
  ), w AS (
    SELECT v.*,
           coalesce(v.lo > v.bound, false) AS tripped,
           coalesce(v.hi < v.bound, false) AS holds
      FROM v
  )
  SELECT jsonb_build_object(
    'tripped', coalesce(jsonb_agg(w.guard ORDER BY w.ord) FILTER (WHERE w.tripped), '[]'),
    'holding', coalesce(jsonb_agg(w.guard ORDER BY w.ord) FILTER (WHERE w.holds), '[]'),
    'enabled', coalesce(jsonb_agg(w.guard ORDER BY w.ord), '[]'),
    'guards', coalesce(jsonb_object_agg(w.guard, jsonb_build_object(
      'metric', w.metric, 'margin', w.margin, 'bound', w.bound, 'tripped', w.tripped,
      'holds', w.holds, 'control_value', w.e->'control_value', 'canary_value', w.e->'canary_value',
      'diff', w.e->'diff', 'ci_low', w.lo, 'ci_high', w.hi, 'p_value', w.e->'p_value',
      'n_control', w.e->'n_control', 'n_canary', w.e->'n_canary',
      'threshold', CASE WHEN w.guard = 'ttft_p95'
                        THEN (w.e->>'control_value')::float8 * (1 + w.margin) END)), '{}'))
    FROM w
$$;
COMMENT ON FUNCTION serve.guard_verdicts(jsonb, serve.experiment_policy) IS
  'The policy''s guard metrics on obs.sequential_compare rows: tripped (significantly worse than '
  'the margin), holding (significantly within it), enabled, and per guard its numbers.';

-- Words for the tripped guards of a serve.guard_verdicts result.
CREATE OR REPLACE FUNCTION serve.guard_text(p_verdicts jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
  SELECT string_agg(format('guard %s broken: %s %s -> %s, diff %s, always-valid CI [%s, %s] beyond %s',
           t.name, v->>'metric', round((v->>'control_value')::numeric, 4),
           round((v->>'canary_value')::numeric, 4), round((v->>'diff')::numeric, 4),
           round((v->>'ci_low')::numeric, 4), round((v->>'ci_high')::numeric, 4),
           CASE WHEN t.name = 'ttft_p95'
                THEN format('5 %% of rows above %s ms (prod p95 + %s %%)',
                            round((v->>'threshold')::numeric, 1), (v->>'margin')::float8 * 100)
                WHEN t.name = 'tokens_out' THEN format('+%s (%s %% of prod)',
                            round((v->>'bound')::numeric, 2), (v->>'margin')::float8 * 100)
                ELSE format('margin %s', v->>'margin') END), '; ' ORDER BY t.ord)
    FROM jsonb_array_elements_text(p_verdicts->'tripped') WITH ORDINALITY t(name, ord)
    CROSS JOIN LATERAL (SELECT p_verdicts->'guards'->t.name AS v) x
$$;

-- Per canary of the route against the current prod, from all the canary arm's traffic since its
-- first row (a growing sample, as the test's guarantee needs; no sliding window):
--   retire   the primary metric is significantly worse, or a guard is broken (even for a canary
--            that wins: it is never promoted past a guard), or the budget ran out undecided;
--   promote  significantly better on the primary metric, every guard unbroken;
--   continue otherwise (insufficient_sample below min_n, not_significant, no_control,
--            control_not_prod).
-- numbers: primary (the always-valid row), guards, comparisons (every metric), fixed_horizon
-- (obs.experiment_compare over the policy's window_size: for reading, not valid under peeking).
CREATE OR REPLACE FUNCTION serve.canary_decision(p_tenant int, p_route text,
                                                 p_policy serve.experiment_policy DEFAULT NULL)
RETURNS TABLE (canary_id text, control_id text, decision text, code text, reason text,
               numbers jsonb)
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
#variable_conflict use_column
DECLARE
  pol        serve.experiment_policy;
  v_rt       serve.route%ROWTYPE;
  v_exp      text;
  v_prod     text;
  v_until    timestamptz := now();
  v_canary   text;
  v_start    timestamptz;
  v_control  text;
  c          obs.arm_sample;
  k          obs.arm_sample;
  v_cmp      jsonb;
  m          jsonb;
  g          jsonb;
  v_fixed    jsonb;
  v_tau_rate float8;
  v_tau_mean float8;
  v_n        bigint;
  v_budget   text;
  v_summary  text;
BEGIN
  SELECT * INTO v_rt FROM serve.route r WHERE r.tenant_id = p_tenant AND r.name = p_route;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  -- A caller may decide by a policy of its own (the loop: loop.decision_policy(tenant, route)).
  pol := CASE WHEN p_policy.route IS NULL THEN serve.experiment_policy_of(p_tenant, p_route)
              ELSE p_policy END;
  v_exp := coalesce(v_rt.experiment, v_rt.name);
  v_prod := serve.current_prod(p_tenant, p_route);
  v_tau_rate := CASE WHEN pol.metric <> 'feedback_mean' THEN coalesce(pol.mixture_sd, 0.05) ELSE 0.05 END;
  v_tau_mean := CASE WHEN pol.metric = 'feedback_mean' THEN coalesce(pol.mixture_sd, 0.1) ELSE 0.1 END;

  FOR v_canary IN SELECT a.id FROM serve.adapter a
                   WHERE a.tenant_id = p_tenant AND a.route = p_route AND a.status = 'canary'
                   ORDER BY a.id LOOP
    canary_id := v_canary;
    control_id := v_prod;
    decision := 'continue';
    numbers := jsonb_build_object('rule', 'msprt', 'prod', v_prod, 'until', v_until,
                                  'policy', to_jsonb(pol) - 'created_at' - 'updated_at');
    SELECT min(l.created_at) INTO v_start FROM obs.inference_log l
     WHERE l.tenant_id = v_rt.tenant_id AND l.adapter_id = v_canary AND l.experiment = v_exp
       AND l.variant <> 'A' AND l.created_at < v_until;
    v_control := NULL;
    IF v_start IS NOT NULL THEN
      SELECT l.adapter_id INTO v_control FROM obs.inference_log l
       WHERE l.tenant_id = v_rt.tenant_id AND l.experiment = v_exp AND l.variant = 'A'
         AND l.created_at >= v_start AND l.created_at < v_until
       GROUP BY l.adapter_id ORDER BY count(*) DESC, l.adapter_id LIMIT 1;
    END IF;
    IF v_control IS NULL THEN
      code := 'no_control';
      reason := format('no traffic of canary %s and of a control arm in experiment %s yet',
                       v_canary, v_exp);
      RETURN NEXT;
      CONTINUE;
    END IF;
    control_id := v_control;
    -- A route still served by its bare base model has no prod row: the base is the control.
    IF v_control IS DISTINCT FROM coalesce(v_prod, v_rt.base_model) THEN
      code := 'control_not_prod';
      reason := format('the control arm (%s) is not the current prod (%s): wait for traffic',
                       v_control, coalesce(v_prod, 'none'));
      RETURN NEXT;
      CONTINUE;
    END IF;

    c := obs.sample_arm(v_rt.tenant_id, v_control, v_start, v_until, v_exp, NULL, true);
    k := obs.sample_arm(v_rt.tenant_id, v_canary, v_start, v_until, v_exp, NULL, false,
                        c.ttft_p95 * (1 + pol.max_ttft_p95_increase));
    SELECT jsonb_agg(to_jsonb(x)) INTO v_cmp FROM obs.sequential_compare(c, k, pol.alpha) x;
    SELECT to_jsonb(x) INTO m
      FROM obs.sequential_compare(c, k, pol.alpha, v_tau_rate, v_tau_mean) x
     WHERE x.metric = pol.metric;
    g := serve.guard_verdicts(v_cmp, pol);
    SELECT to_jsonb(x) INTO v_fixed
      FROM obs.experiment_compare(v_exp, v_until - pol.window_size, v_until, pol.alpha,
                                 p_tenant_id => v_rt.tenant_id) x
     WHERE x.canary_adapter = v_canary AND x.metric = pol.metric
     ORDER BY x.n_canary DESC LIMIT 1;
    v_n := least((m->>'n_control')::bigint, (m->>'n_canary')::bigint);
    v_budget := CASE
      WHEN pol.max_n_per_arm IS NOT NULL AND v_n >= pol.max_n_per_arm
        THEN format('sample budget of %s per arm reached undecided', pol.max_n_per_arm)
      WHEN pol.max_duration IS NOT NULL AND v_until - v_start >= pol.max_duration
        THEN format('time budget of %s reached undecided', pol.max_duration) END;
    v_summary := format(
      '%s: prod %s %s, canary %s %s, diff %s, always-valid %s %% CI [%s, %s], p = %s '
      '(alpha %s, mSPRT tau %s), n %s vs %s since %s',
      pol.metric, v_control, round((m->>'control_value')::numeric, 4), v_canary,
      round((m->>'canary_value')::numeric, 4), round((m->>'diff')::numeric, 4),
      (1 - pol.alpha) * 100, round((m->>'ci_low')::numeric, 4), round((m->>'ci_high')::numeric, 4),
      btrim(to_char((m->>'p_value')::float8, '9.99EEEE')), pol.alpha, m->>'tau', m->>'n_control', m->>'n_canary',
      v_start);
    numbers := numbers || jsonb_build_object(
      'since', v_start, 'primary', m, 'guards', g, 'comparisons', v_cmp,
      'fixed_horizon', v_fixed, 'min_n', pol.min_n,
      'budget', jsonb_build_object('max_n_per_arm', pol.max_n_per_arm,
                                   'max_duration', pol.max_duration, 'exhausted', v_budget));

    IF v_n IS NULL OR v_n < pol.min_n THEN
      IF v_budget IS NOT NULL THEN
        decision := 'retire';
        code := 'budget_exhausted';
        reason := v_budget || ' (below min_n): ' || v_summary;
      ELSE
        code := 'insufficient_sample';
        reason := format('%s: n %s (prod) and %s (canary), at least %s per arm needed',
                         pol.metric, coalesce(m->>'n_control', '0'), coalesce(m->>'n_canary', '0'),
                         pol.min_n);
      END IF;
    ELSIF (m->>'significant')::boolean AND (m->>'canary_better')::boolean IS FALSE THEN
      decision := 'retire';
      code := 'significantly_worse';
      reason := 'canary significantly worse (always valid): ' || v_summary;
    ELSIF jsonb_array_length(g->'tripped') > 0 THEN
      decision := 'retire';
      code := 'guard_' || (g->'tripped'->>0);
      reason := CASE WHEN (m->>'significant')::boolean THEN 'canary wins but ' ELSE '' END
                || serve.guard_text(g) || '; ' || v_summary;
    ELSIF (m->>'significant')::boolean AND (m->>'canary_better')::boolean THEN
      decision := 'promote';
      code := 'significantly_better';
      reason := 'canary significantly better (always valid): ' || v_summary;
    ELSIF v_budget IS NOT NULL THEN
      decision := 'retire';
      code := 'budget_exhausted';
      reason := v_budget || ': ' || v_summary;
    ELSE
      code := 'not_significant';
      reason := 'no significant difference yet: ' || v_summary;
    END IF;
    RETURN NEXT;
  END LOOP;
END
$$;
COMMENT ON FUNCTION serve.canary_decision(int, text, serve.experiment_policy) IS
  'Per canary of the tenant''s route against its prod, by the always-valid mSPRT on the policy''s metric '
  'over all the canary arm''s traffic since its first row: promote (significantly better, no '
  'guard broken), retire (significantly worse, a guard broken, or budget exhausted) or continue; '
  'code says why, reason in words, numbers the statistics (primary, guards, comparisons, '
  'fixed_horizon for reading). Reads only; the policy''s defaults apply to a route without one.';

-- The watch after a promotion: the route's current prod, since its promoted_at, against the prod
-- it replaced (serve.adapter.previous_prod_id) over the same length of time before the promotion,
-- on the policy's guards, until p_window (default the policy's watch_window) has passed:
--   rollback  a guard is broken (significantly worse than its margin, always valid);
--   keep      every guard holds significantly, or the window passed with none broken, or there
--             is nothing to watch (no_prod, no_previous_prod);
--   continue  otherwise (insufficient_sample below min_n, watching).
-- The baseline is historical (the old prod cannot serve beside the new one), so a change of
-- traffic at the promotion is attributed to the adapter. numbers.restorable says whether
-- serve.rollback(tenant, route, reason) can restore the previous prod. Reads only.
CREATE OR REPLACE FUNCTION serve.watch_decision(p_tenant int, p_route text,
                                                p_window interval DEFAULT NULL,
                                                p_policy serve.experiment_policy DEFAULT NULL)
RETURNS TABLE (adapter_id text, previous_id text, decision text, code text, reason text,
               numbers jsonb)
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
#variable_conflict use_column
DECLARE
  pol        serve.experiment_policy;
  v_rt       serve.route%ROWTYPE;
  v_window   interval;
  v_prod     text;
  v_prev     text;
  v_promoted timestamptz;
  v_until    timestamptz;
  v_done     boolean;
  c          obs.arm_sample;
  k          obs.arm_sample;
  v_cmp      jsonb;
  g          jsonb;
  v_n        bigint;
BEGIN
  SELECT * INTO v_rt FROM serve.route r WHERE r.tenant_id = p_tenant AND r.name = p_route;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  pol := CASE WHEN p_policy.route IS NULL THEN serve.experiment_policy_of(p_tenant, p_route)
              ELSE p_policy END;
  v_window := coalesce(p_window, pol.watch_window);
  v_prod := serve.current_prod(p_tenant, p_route);
  adapter_id := v_prod;
  decision := 'keep';
  numbers := jsonb_build_object('rule', 'msprt', 'window', v_window);
  IF v_prod IS NULL THEN
    code := 'no_prod';
    reason := format('route %s has no prod adapter', p_route);
    RETURN NEXT;
    RETURN;
  END IF;
  SELECT a.promoted_at, a.previous_prod_id INTO v_promoted, v_prev
    FROM serve.adapter a WHERE a.id = v_prod;
  previous_id := v_prev;
  IF v_promoted IS NULL OR v_prev IS NULL THEN
    code := 'no_previous_prod';
    reason := format('prod %s replaced no prod: nothing to compare it with', v_prod);
    RETURN NEXT;
    RETURN;
  END IF;
  v_until := least(now(), v_promoted + v_window);
  v_done := now() >= v_promoted + v_window;
  c := obs.sample_arm(v_rt.tenant_id, v_prev, v_promoted - v_window, v_promoted, NULL, p_route);
  k := obs.sample_arm(v_rt.tenant_id, v_prod, v_promoted, v_until, NULL, p_route, NULL,
                      c.ttft_p95 * (1 + pol.max_ttft_p95_increase));
  SELECT jsonb_agg(to_jsonb(x)) INTO v_cmp FROM obs.sequential_compare(c, k, pol.alpha) x;
  g := serve.guard_verdicts(v_cmp, pol);
  v_n := least(c.n, k.n);
  numbers := numbers || jsonb_build_object(
    'promoted_at', v_promoted, 'since', v_promoted, 'until', v_until,
    'baseline_since', v_promoted - v_window, 'baseline_until', v_promoted,
    'n_previous', c.n, 'n_new', k.n, 'min_n', pol.min_n, 'guards', g, 'comparisons', v_cmp,
    'restorable', serve.previous_prod(v_prod) IS NOT NULL,
    'policy', to_jsonb(pol) - 'created_at' - 'updated_at');
  IF jsonb_array_length(g->'enabled') = 0 THEN
    code := 'no_guards';
    reason := 'every guard margin of the policy is NULL: nothing to watch';
  ELSIF v_n < pol.min_n THEN
    decision := CASE WHEN v_done THEN 'keep' ELSE 'continue' END;
    code := CASE WHEN v_done THEN 'window_passed' ELSE 'insufficient_sample' END;
    reason := format('n %s (previous prod %s) and %s (new prod %s since %s), at least %s needed',
                     c.n, v_prev, k.n, v_prod, v_promoted, pol.min_n);
  ELSIF jsonb_array_length(g->'tripped') > 0 THEN
    decision := 'rollback';
    code := 'guard_' || (g->'tripped'->>0);
    reason := format('new prod %s against previous prod %s since %s (n %s vs %s): ',
                     v_prod, v_prev, v_promoted, k.n, c.n) || serve.guard_text(g);
  ELSIF jsonb_array_length(g->'holding') = jsonb_array_length(g->'enabled') THEN
    code := 'guards_hold';
    reason := format('every guard (%s) significantly within its margin: new prod %s vs %s, n %s vs %s',
                     (SELECT string_agg(x, ', ') FROM jsonb_array_elements_text(g->'enabled') x),
                     v_prod, v_prev, k.n, c.n);
  ELSIF v_done THEN
    code := 'window_passed';
    reason := format('no guard broken in the watch window of %s: new prod %s vs %s, n %s vs %s',
                     v_window, v_prod, v_prev, k.n, c.n);
  ELSE
    decision := 'continue';
    code := 'watching';
    reason := format('no guard broken yet (holding: %s): new prod %s vs %s, n %s vs %s',
                     coalesce((SELECT string_agg(x, ', ') FROM jsonb_array_elements_text(g->'holding') x), 'none'),
                     v_prod, v_prev, k.n, c.n);
  END IF;
  RETURN NEXT;
END
$$;
COMMENT ON FUNCTION serve.watch_decision(int, text, interval, serve.experiment_policy) IS
  'The watch after a promotion: the tenant''s route''s prod since its promoted_at against the prod it '
  'replaced (previous_prod_id) over the same length before, on the policy''s guards (always-valid '
  'mSPRT bounds against the margins), within window (default watch_window): rollback (a guard '
  'broken), keep (guards hold, window passed, or nothing to watch) or continue. Reads only: '
  'serve.experiment_autopolicy applies a rollback with serve.rollback when rollback_enabled.';
