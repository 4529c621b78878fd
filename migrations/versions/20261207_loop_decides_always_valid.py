"""The loop decides by the always-valid rule: decisions take a policy; loop.decision_policy.

serve.canary_decision and serve.watch_decision take an optional experiment policy (default: the
route's, as before); loop.decision_policy(route) is the route's experiment policy with the loop
policy's metric, alpha, sample floor and watch window and no budget of its own (the loop's canary
budget applies). app/loop/decision.py decides canaries and watches promotions with them.

Revision ID: 20261207
Revises: 20261206
"""

from alembic import op

revision = "20261207"
down_revision = "20261206"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
DROP FUNCTION serve.canary_decision(text);
DROP FUNCTION serve.watch_decision(text, interval);
CREATE OR REPLACE FUNCTION serve.canary_decision(p_route text,
                                                 p_policy serve.experiment_policy DEFAULT NULL)
RETURNS TABLE (canary_id text, control_id text, decision text, code text, reason text,
               numbers jsonb)
LANGUAGE plpgsql SET search_path = pg_catalog, public AS $$
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
  SELECT * INTO v_rt FROM serve.route r WHERE r.name = p_route;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  -- A caller may decide by a policy of its own (the loop: loop.decision_policy(route)).
  pol := CASE WHEN p_policy.route IS NULL THEN serve.experiment_policy_of(p_route) ELSE p_policy END;
  v_exp := coalesce(v_rt.experiment, v_rt.name);
  v_prod := serve.current_prod(p_route);
  v_tau_rate := CASE WHEN pol.metric <> 'feedback_mean' THEN coalesce(pol.mixture_sd, 0.05) ELSE 0.05 END;
  v_tau_mean := CASE WHEN pol.metric = 'feedback_mean' THEN coalesce(pol.mixture_sd, 0.1) ELSE 0.1 END;

  FOR v_canary IN SELECT a.id FROM serve.adapter a
                   WHERE a.route = p_route AND a.status = 'canary' ORDER BY a.id LOOP
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
      FROM obs.experiment_compare(v_exp, v_until - pol.window_size, v_until, pol.alpha) x
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
COMMENT ON FUNCTION serve.canary_decision(text, serve.experiment_policy) IS
  'Per canary of the route against its prod, by the always-valid mSPRT on the policy''s metric '
  'over all the canary arm''s traffic since its first row: promote (significantly better, no '
  'guard broken), retire (significantly worse, a guard broken, or budget exhausted) or continue; '
  'code says why, reason in words, numbers the statistics (primary, guards, comparisons, '
  'fixed_horizon for reading). Reads only; the policy''s defaults apply to a route without one.';
CREATE OR REPLACE FUNCTION serve.watch_decision(p_route text, p_window interval DEFAULT NULL,
                                                p_policy serve.experiment_policy DEFAULT NULL)
RETURNS TABLE (adapter_id text, previous_id text, decision text, code text, reason text,
               numbers jsonb)
LANGUAGE plpgsql SET search_path = pg_catalog, public AS $$
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
  SELECT * INTO v_rt FROM serve.route r WHERE r.name = p_route;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  pol := CASE WHEN p_policy.route IS NULL THEN serve.experiment_policy_of(p_route) ELSE p_policy END;
  v_window := coalesce(p_window, pol.watch_window);
  v_prod := serve.current_prod(p_route);
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
COMMENT ON FUNCTION serve.watch_decision(text, interval, serve.experiment_policy) IS
  'The watch after a promotion: the route''s prod since its promoted_at against the prod it '
  'replaced (previous_prod_id) over the same length before, on the policy''s guards (always-valid '
  'mSPRT bounds against the margins), within window (default watch_window): rollback (a guard '
  'broken), keep (guards hold, window passed, or nothing to watch) or continue. Reads only: '
  'serve.experiment_autopolicy applies a rollback with serve.rollback when rollback_enabled.';
CREATE OR REPLACE FUNCTION loop.decision_policy(p_route text) RETURNS serve.experiment_policy
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  e serve.experiment_policy := serve.experiment_policy_of(p_route);
  p loop.policy := loop.effective_policy(p_route);
BEGIN
  e.route := p_route;
  e.metric := p.decision_metric;
  e.alpha := p.decision_alpha;
  e.min_n := greatest(p.decision_min_n, 2);
  e.watch_window := p.watch_window;
  e.max_n_per_arm := NULL;
  e.max_duration := NULL;
  RETURN e;
END
$$;
REVOKE EXECUTE ON FUNCTION loop.decision_policy(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION loop.decision_policy(text) TO cft_app, cft_release;
"""

DOWNGRADE_SQL = r"""
DROP FUNCTION loop.decision_policy(text);
DROP FUNCTION serve.canary_decision(text, serve.experiment_policy);
DROP FUNCTION serve.watch_decision(text, interval, serve.experiment_policy);
CREATE OR REPLACE FUNCTION serve.canary_decision(p_route text)
RETURNS TABLE (canary_id text, control_id text, decision text, code text, reason text,
               numbers jsonb)
LANGUAGE plpgsql SET search_path = pg_catalog, public AS $$
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
  SELECT * INTO v_rt FROM serve.route r WHERE r.name = p_route;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  pol := serve.experiment_policy_of(p_route);
  v_exp := coalesce(v_rt.experiment, v_rt.name);
  v_prod := serve.current_prod(p_route);
  v_tau_rate := CASE WHEN pol.metric <> 'feedback_mean' THEN coalesce(pol.mixture_sd, 0.05) ELSE 0.05 END;
  v_tau_mean := CASE WHEN pol.metric = 'feedback_mean' THEN coalesce(pol.mixture_sd, 0.1) ELSE 0.1 END;

  FOR v_canary IN SELECT a.id FROM serve.adapter a
                   WHERE a.route = p_route AND a.status = 'canary' ORDER BY a.id LOOP
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
    IF v_control IS DISTINCT FROM v_prod THEN
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
      FROM obs.experiment_compare(v_exp, v_until - pol.window_size, v_until, pol.alpha) x
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
      (m->>'p_value')::float8::real, pol.alpha, m->>'tau', m->>'n_control', m->>'n_canary',
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
COMMENT ON FUNCTION serve.canary_decision(text) IS
  'Per canary of the route against its prod, by the always-valid mSPRT on the policy''s metric '
  'over all the canary arm''s traffic since its first row: promote (significantly better, no '
  'guard broken), retire (significantly worse, a guard broken, or budget exhausted) or continue; '
  'code says why, reason in words, numbers the statistics (primary, guards, comparisons, '
  'fixed_horizon for reading). Reads only; the policy''s defaults apply to a route without one.';
CREATE OR REPLACE FUNCTION serve.watch_decision(p_route text, p_window interval DEFAULT NULL)
RETURNS TABLE (adapter_id text, previous_id text, decision text, code text, reason text,
               numbers jsonb)
LANGUAGE plpgsql SET search_path = pg_catalog, public AS $$
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
  SELECT * INTO v_rt FROM serve.route r WHERE r.name = p_route;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  pol := serve.experiment_policy_of(p_route);
  v_window := coalesce(p_window, pol.watch_window);
  v_prod := serve.current_prod(p_route);
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
COMMENT ON FUNCTION serve.watch_decision(text, interval) IS
  'The watch after a promotion: the route''s prod since its promoted_at against the prod it '
  'replaced (previous_prod_id) over the same length before, on the policy''s guards (always-valid '
  'mSPRT bounds against the margins), within window (default watch_window): rollback (a guard '
  'broken), keep (guards hold, window passed, or nothing to watch) or continue. Reads only: '
  'serve.experiment_autopolicy applies a rollback with serve.rollback when rollback_enabled.';
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
