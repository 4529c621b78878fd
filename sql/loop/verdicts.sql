-- What the loop decides on live traffic. app/loop/decision.py is the only caller: it decides a
-- canary and watches a promotion by the always-valid rule (serve.canary_decision and
-- serve.watch_decision under loop.decision_policy), and reads loop.canary_verdict for the
-- canary's budget (distinct users, duration), which the loop owns.

-- The experiment policy the loop decides by: the route's (serve.experiment_policy_of: its
-- guards, mixture, ttft rule) with the loop policy's metric, alpha, sample floor and watch window;
-- no budget of its own (the loop's canary budget applies, see loop.canary_verdict). Guards judge
-- the adapter, not the engine: against the bare base (a route with no prod yet) a canary's ttft
-- carries the engine's cost of serving any LoRA (+18 % p95 on the CPU engine), so the ttft guard
-- applies only between two adapters, where that cost is on both sides.
CREATE OR REPLACE FUNCTION loop.decision_policy(p_tenant int, p_route text)
RETURNS serve.experiment_policy
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  p loop.policy := loop.effective_policy(p_tenant, p_route);
  e serve.experiment_policy := serve.experiment_policy_of(p_tenant, p_route);
BEGIN
  e.route := p_route;
  e.metric := p.decision_metric;
  e.alpha := p.decision_alpha;
  e.min_n := greatest(p.decision_min_n, 2);
  e.watch_window := p.watch_window;
  e.max_n_per_arm := NULL;
  e.max_duration := NULL;
  IF serve.current_prod(p_tenant, p_route) IS NULL THEN
    e.max_ttft_p95_increase := NULL;
  END IF;
  RETURN e;
END
$$;

-- The canary's budget, and a fixed-horizon reading: the canary of a cycle against the route's
-- prod, on obs.experiment_compare's numbers since the canary opened (decision_metric at
-- decision_alpha, regen_rate as guard). app/loop/decision.py uses its budget branches (one
-- final look when the budget runs out, so a single fixed-horizon test); the verdicts before the
-- budget runs out come from the always-valid serve.canary_decision:
--   promote  - significantly better on the metric, guard not significantly worse;
--   retire   - significantly worse on the metric, or on the guard;
--   continue - not yet (too few rows per arm, or no significant difference);
-- when the canary's budget (canary_max_users distinct users or canary_max_duration) runs out,
-- app/loop/decision.py retires the canary unless the always-valid rule found a significant win
-- (nothing is promoted for being "not worse"); this function's verdict on the budget's end
-- (not significantly worse, or no comparable traffic) is kept with the numbers for reading.
CREATE OR REPLACE FUNCTION loop.canary_verdict(p_cycle bigint)
RETURNS TABLE (decision text, code text, reason text, numbers jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  c       loop.cycle;
  p       loop.policy;
  v_exp   text;
  v_prod  text;
  m       jsonb;
  g       jsonb;
  v_users bigint;
  v_age   interval;
  v_out   boolean;
  v_num   jsonb;
  v_line  text;
BEGIN
  SELECT * INTO c FROM loop.cycle WHERE id = p_cycle;
  p := loop.effective_policy(c.tenant_id, c.route);
  SELECT coalesce(r.experiment, r.name) INTO v_exp FROM serve.route r
   WHERE r.tenant_id = c.tenant_id AND r.name = c.route;
  v_prod := serve.current_prod(c.tenant_id, c.route);
  SELECT to_jsonb(x) INTO m FROM obs.experiment_compare(v_exp, c.canary_started_at, now(), p.decision_alpha,
                                                  p_tenant_id => c.tenant_id) x
   WHERE x.canary_adapter = c.adapter_id AND x.metric = p.decision_metric
   ORDER BY x.n_canary DESC LIMIT 1;
  SELECT to_jsonb(x) INTO g FROM obs.experiment_compare(v_exp, c.canary_started_at, now(), p.decision_alpha,
                                                  p_tenant_id => c.tenant_id) x
   WHERE x.canary_adapter = c.adapter_id AND x.metric = 'regen_rate'
   ORDER BY x.n_canary DESC LIMIT 1;
  SELECT count(DISTINCT l.user_hash) INTO v_users FROM obs.inference_log l
   WHERE l.tenant_id = c.tenant_id AND l.adapter_id = c.adapter_id AND l.created_at >= c.canary_started_at;
  v_age := now() - c.canary_started_at;
  v_out := v_users >= p.canary_max_users OR v_age >= p.canary_max_duration;
  v_num := jsonb_build_object('experiment', v_exp, 'metric', m, 'guard_regen_rate', g,
    'prod', v_prod, 'canary_users', v_users, 'canary_age_s', extract(epoch FROM v_age),
    'budget', jsonb_build_object('max_users', p.canary_max_users, 'max_duration', p.canary_max_duration,
                                 'exhausted', v_out),
    'rule', 'obs.experiment_compare (fixed horizon) via loop.canary_verdict',
    'alpha', p.decision_alpha, 'min_n', p.decision_min_n, 'until', now());
  IF m IS NOT NULL THEN
    v_line := format('%s: prod %s, canary %s, diff %s [%s, %s], p = %s, n %s vs %s',
      p.decision_metric, round((m->>'control_value')::numeric, 4), round((m->>'canary_value')::numeric, 4),
      round((m->>'diff')::numeric, 4), round((m->>'diff_ci_low')::numeric, 4),
      round((m->>'diff_ci_high')::numeric, 4), round((m->>'p_value')::numeric, 4),
      m->>'n_control', m->>'n_canary');
  END IF;

  IF m IS NULL OR (v_prod IS NOT NULL AND m->>'control_adapter' IS DISTINCT FROM v_prod) THEN
    RETURN QUERY SELECT CASE WHEN v_out THEN 'retire' ELSE 'continue' END,
      CASE WHEN v_out THEN 'budget_no_data' ELSE 'no_data' END,
      format('no comparable traffic of canary %s and prod %s yet (%s users, %s)%s', c.adapter_id,
             coalesce(v_prod, 'none'), v_users, date_trunc('second', v_age),
             CASE WHEN v_out THEN ': budget exhausted' ELSE '' END), v_num;
  ELSIF (m->>'significant')::boolean AND (m->>'canary_better')::boolean IS FALSE THEN
    RETURN QUERY SELECT 'retire', 'worse', 'canary significantly worse: ' || v_line, v_num;
  ELSIF coalesce((g->>'significant')::boolean, false) AND (g->>'canary_better')::boolean IS FALSE
        AND p.decision_metric <> 'regen_rate' THEN
    RETURN QUERY SELECT 'retire', 'guard_regen',
      format('regenerations significantly higher (%s -> %s, p = %s); ',
             round((g->>'control_value')::numeric, 4), round((g->>'canary_value')::numeric, 4),
             round((g->>'p_value')::numeric, 4)) || v_line, v_num;
  ELSIF least((m->>'n_control')::bigint, (m->>'n_canary')::bigint) < p.decision_min_n THEN
    RETURN QUERY SELECT CASE WHEN v_out THEN 'promote' ELSE 'continue' END,
      CASE WHEN v_out THEN 'budget_non_inferior' ELSE 'insufficient_sample' END,
      CASE WHEN v_out THEN 'budget exhausted, not significantly worse: '
           ELSE format('waiting for %s rows per arm: ', p.decision_min_n) END || v_line, v_num;
  ELSIF (m->>'significant')::boolean AND (m->>'canary_better')::boolean THEN
    RETURN QUERY SELECT 'promote', 'better', 'canary significantly better: ' || v_line, v_num;
  ELSIF v_out THEN
    RETURN QUERY SELECT 'promote', 'budget_non_inferior',
      'budget exhausted, not significantly worse: ' || v_line, v_num;
  ELSE
    RETURN QUERY SELECT 'continue', 'not_significant', 'no significant difference yet: ' || v_line, v_num;
  END IF;
END
$$;

-- The watch after a promotion: the new prod's guard rates since its promotion against the
-- previous prod's over the day (or watch_window, if longer) before it, each by a one-sided
-- two-proportion z-test at watch_alpha with watch_min_n rows a side. Guards: regenerate rate
-- (of all rows) and thumbs-down rate (of rated rows). regressed = some guard is significantly
-- worse; done = the window is over.
CREATE OR REPLACE FUNCTION loop.watch_verdict(p_cycle bigint)
RETURNS TABLE (regressed boolean, done boolean, metric text, reason text, numbers jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  c     loop.cycle;
  p     loop.policy;
  v_len interval;
  a     record;
  b     record;
  tr    record;
  td    record;
  v_num jsonb;
  v_bad text;
BEGIN
  SELECT * INTO c FROM loop.cycle WHERE id = p_cycle;
  p := loop.effective_policy(c.tenant_id, c.route);
  v_len := greatest(p.watch_window, interval '1 day');
  SELECT count(*) AS n, count(*) FILTER (WHERE fb_regen) AS regen,
         count(*) FILTER (WHERE fb_explicit <> 0) AS rated,
         count(*) FILTER (WHERE fb_explicit < 0) AS down INTO a
    FROM obs.inference_log WHERE tenant_id = c.tenant_id AND route = c.route
     AND adapter_id = c.adapter_id AND created_at >= c.promoted_at;
  SELECT count(*) AS n, count(*) FILTER (WHERE fb_regen) AS regen,
         count(*) FILTER (WHERE fb_explicit <> 0) AS rated,
         count(*) FILTER (WHERE fb_explicit < 0) AS down INTO b
    FROM obs.inference_log WHERE tenant_id = c.tenant_id AND route = c.route
     AND created_at >= c.promoted_at - v_len AND created_at < c.promoted_at
     AND adapter_id IS DISTINCT FROM c.adapter_id
     AND (c.previous_prod_id IS NULL OR adapter_id = c.previous_prod_id);
  SELECT * INTO tr FROM loop.prop_test(b.regen, b.n, a.regen, a.n);
  SELECT * INTO td FROM loop.prop_test(b.down, b.rated, a.down, a.rated);
  v_num := jsonb_build_object('new_prod', c.adapter_id, 'previous_prod', c.previous_prod_id,
    'since', c.promoted_at, 'before_from', c.promoted_at - v_len, 'until', now(),
    'regen_rate', jsonb_build_object('before_n', b.n, 'before', tr.rate1, 'after_n', a.n,
                                     'after', tr.rate2, 'z', tr.z, 'p_value', tr.p_value),
    'thumbs_down_rate', jsonb_build_object('before_n', b.rated, 'before', td.rate1,
                                           'after_n', a.rated, 'after', td.rate2, 'z', td.z,
                                           'p_value', td.p_value),
    'alpha', p.watch_alpha, 'min_n', p.watch_min_n,
    'test', 'one-sided two-proportion z (pooled)');
  IF least(b.n, a.n) >= p.watch_min_n AND tr.p_value < p.watch_alpha THEN
    v_bad := 'regen_rate';
  ELSIF least(b.rated, a.rated) >= p.watch_min_n AND td.p_value < p.watch_alpha THEN
    v_bad := 'thumbs_down_rate';
  END IF;
  RETURN QUERY SELECT v_bad IS NOT NULL, now() >= c.watch_until, v_bad,
    CASE WHEN v_bad = 'regen_rate'
           THEN format('regenerate rate rose from %s to %s after promotion (p = %s < %s)',
                       round(tr.rate1::numeric, 4), round(tr.rate2::numeric, 4),
                       round(tr.p_value::numeric, 5), p.watch_alpha)
         WHEN v_bad = 'thumbs_down_rate'
           THEN format('thumbs-down rate rose from %s to %s after promotion (p = %s < %s)',
                       round(td.rate1::numeric, 4), round(td.rate2::numeric, 4),
                       round(td.p_value::numeric, 5), p.watch_alpha)
         ELSE format('guards hold: regen %s -> %s (n %s/%s), thumbs-down %s -> %s (n %s/%s)',
                     round(tr.rate1::numeric, 4), round(tr.rate2::numeric, 4), b.n, a.n,
                     round(td.rate1::numeric, 4), round(td.rate2::numeric, 4), b.rated, a.rated)
    END, v_num;
END
$$;
