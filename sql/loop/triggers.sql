-- Triggers of the loop: SQL functions the worker only calls. Each returns one row: whether it
-- fired, its current value and threshold, the numbers behind it (detail) and a line for people
-- ("waiting: 14 of 40 usable regenerate pairs"). Owner rights (the candidate views have no
-- row-level security), limited to the caller's tenant by loop.check_route.

-- A one-sided two-proportion z-test (pooled standard error): the p-value of "rate 2 > rate 1".
CREATE OR REPLACE FUNCTION loop.prop_test(x1 bigint, n1 bigint, x2 bigint, n2 bigint)
RETURNS TABLE (rate1 float8, rate2 float8, z float8, p_value float8)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  se float8;
BEGIN
  IF coalesce(n1, 0) <= 0 OR coalesce(n2, 0) <= 0 THEN
    RETURN QUERY SELECT NULL::float8, NULL::float8, NULL::float8, NULL::float8;
    RETURN;
  END IF;
  rate1 := x1::float8 / n1;
  rate2 := x2::float8 / n2;
  se := sqrt(((x1 + x2)::float8 / (n1 + n2)) * (1 - (x1 + x2)::float8 / (n1 + n2))
             * (1.0 / n1 + 1.0 / n2));
  IF se > 0 THEN
    z := (rate2 - rate1) / se;
    p_value := 1 - stats.norm_cdf(z);
  END IF;
  RETURN NEXT;
END
$$;

-- Usable examples of each signal of a route created since p_since (and within the snapshots'
-- default 60-day window): the candidate views (consent and pii_flags = 0 at their refresh), the
-- tenant's consent now, minus rows deleted or flagged since the refresh (obs.deleted_log, as
-- train.create_snapshot skips them), exact dedup by prompt hash (train.prompt_hash, the
-- snapshot's first dedup step). Semantic dedup is not applied: the count can exceed what a
-- snapshot keeps by the near-duplicates it drops. The views are as fresh as their last refresh
-- (`cft worker loop` refreshes them every --refresh seconds; a snapshot refreshes its own).
CREATE OR REPLACE FUNCTION loop.signal_counts(p_tenant int, p_route text,
                                              p_since timestamptz DEFAULT NULL)
RETURNS TABLE (edits bigint, regen_pairs bigint, pairs bigint, thumbs bigint, thumbs_up bigint,
               thumbs_down bigint, desirable bigint, since timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_since  timestamptz := greatest(coalesce(p_since, '-infinity'), now() - interval '60 days');
BEGIN
  PERFORM loop.check_route(p_tenant, p_route);
  IF NOT coalesce((SELECT t.consent_training FROM tenant t WHERE t.id = p_tenant), false) THEN
    RETURN QUERY SELECT 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint,
                        0::bigint, v_since;
    RETURN;
  END IF;
  RETURN QUERY
  WITH dead AS MATERIALIZED (
    SELECT d.log_id, d.created_at FROM obs.deleted_log d
     WHERE NOT EXISTS (SELECT 1 FROM obs.inference_log x
                        WHERE x.id = d.log_id AND x.created_at = d.created_at AND x.pii_flags = 0)
  ), pair AS (
    SELECT c.source, train.prompt_hash(c.example->'prompt') AS h
      FROM train.pair_candidate c
     WHERE c.tenant_id = p_tenant AND c.route = p_route AND c.created_at >= v_since
       AND (c.prompt_log_id, c.prompt_created_at) NOT IN (SELECT * FROM dead)
       AND (c.chosen_log_id, c.chosen_created_at) NOT IN (SELECT * FROM dead)
  ), thumb AS (
    SELECT c.label, train.prompt_hash(c.example->'prompt') AS h
      FROM train.kto_candidate c
     WHERE c.tenant_id = p_tenant AND c.route = p_route AND c.created_at >= v_since
       AND (c.prompt_log_id, c.prompt_created_at) NOT IN (SELECT * FROM dead)
  ), sft AS (
    SELECT c.source, train.prompt_hash((c.example->'messages') - (-1)) AS h
      FROM train.sft_candidate c
     WHERE c.tenant_id = p_tenant AND c.route = p_route AND c.created_at >= v_since
       AND (c.prompt_log_id, c.prompt_created_at) NOT IN (SELECT * FROM dead)
  ), n AS (
    SELECT (SELECT count(DISTINCT h) FROM sft WHERE source = 'edit') AS edits,
           (SELECT count(DISTINCT h) FROM pair WHERE source = 'regen') AS regen_pairs,
           (SELECT count(DISTINCT h) FROM pair) AS pairs,
           (SELECT count(DISTINCT h) FROM thumb) AS thumbs,
           (SELECT count(DISTINCT h) FROM thumb WHERE label) AS thumbs_up,
           (SELECT count(DISTINCT h) FROM thumb WHERE NOT label) AS thumbs_down
  )
  SELECT n.edits, n.regen_pairs, n.pairs, n.thumbs, n.thumbs_up, n.thumbs_down,
         n.edits + n.thumbs_up + n.regen_pairs, v_since
    FROM n;
END
$$;

CREATE OR REPLACE FUNCTION loop.last_cycle_at(p_tenant int, p_route text) RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
  SELECT max(created_at) FROM loop.cycle
   WHERE tenant_id = p_tenant AND route = p_route
     AND p_tenant = coalesce(auth.current_tenant_id(), p_tenant)
$$;

-- Volume: examples that can teach (edits, thumbs-up answers, regenerate pairs: an answer users
-- wanted) since the route's last cycle >= min_new_examples. Thumbs down alone never fire it: a
-- set with nothing users wanted cannot teach. With a pinned method, the signal that method
-- trains on.
CREATE OR REPLACE FUNCTION loop.trigger_volume(p_tenant int, p_route text)
RETURNS TABLE (trigger text, fired boolean, value float8, threshold float8, detail jsonb, line text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  p      loop.policy := loop.effective_policy(p_tenant, p_route);
  v_last timestamptz := loop.last_cycle_at(p_tenant, p_route);
  s      record;
  v_sig  text;
  v_n    bigint;
BEGIN
  SELECT * INTO s FROM loop.signal_counts(p_tenant, p_route, v_last);
  IF p.method = 'sft' THEN
    v_sig := 'edits and thumbs-up answers'; v_n := s.edits + s.thumbs_up;
  ELSIF p.method IN ('dpo', 'orpo', 'simpo') THEN
    v_sig := 'preference pairs'; v_n := s.pairs;
  ELSIF p.method = 'kto' THEN
    v_sig := 'thumbs with one up'; v_n := CASE WHEN s.thumbs_up > 0 THEN s.thumbs ELSE 0 END;
  ELSE
    v_sig := 'examples that can teach (edits, thumbs up, regenerate pairs)'; v_n := s.desirable;
  END IF;
  RETURN QUERY SELECT 'volume'::text, v_n >= p.min_new_examples, v_n::float8,
    p.min_new_examples::float8,
    jsonb_build_object('signal', v_sig, 'edits', s.edits, 'thumbs_up', s.thumbs_up,
                       'thumbs_down', s.thumbs_down, 'regen_pairs', s.regen_pairs,
                       'pairs', s.pairs, 'thumbs', s.thumbs, 'desirable', s.desirable,
                       'since', s.since, 'last_cycle_at', v_last, 'dedup', 'exact (prompt hash)'),
    format('%s: %s of %s usable %s since %s',
           CASE WHEN v_n >= p.min_new_examples THEN 'fired' ELSE 'waiting' END,
           v_n, p.min_new_examples, v_sig,
           CASE WHEN v_last IS NULL THEN 'ever (60-day window)' ELSE 'the last cycle' END);
END
$$;

-- Schedule: a cycle at least every max_interval (from the last cycle, or from when the policy
-- was written). min_interval is a limit (loop.limits), not a trigger.
CREATE OR REPLACE FUNCTION loop.trigger_schedule(p_tenant int, p_route text)
RETURNS TABLE (trigger text, fired boolean, value float8, threshold float8, detail jsonb, line text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  p     loop.policy := loop.effective_policy(p_tenant, p_route);
  v_ref timestamptz := coalesce(loop.last_cycle_at(p_tenant, p_route), p.created_at);
  v_age float8 := extract(epoch FROM now() - v_ref);
  v_max float8 := extract(epoch FROM p.max_interval);
BEGIN
  RETURN QUERY SELECT 'schedule'::text, coalesce(v_age >= v_max, false), v_age, v_max,
    jsonb_build_object('since', v_ref, 'max_interval', p.max_interval, 'min_interval', p.min_interval),
    CASE WHEN p.max_interval IS NULL THEN 'off: no max_interval'
         WHEN v_age >= v_max THEN format('fired: %s since the last cycle (at least every %s)',
                                         date_trunc('second', now() - v_ref), p.max_interval)
         ELSE format('waiting: %s of %s since the last cycle', date_trunc('second', now() - v_ref),
                     p.max_interval) END;
END
$$;

-- Decline: the prod adapter's thumbs-up rate (of rated rows) over the last decline_window is
-- lower than over the first decline_window after its promotion, by a one-sided two-proportion
-- z-test at decline_alpha, with at least decline_min_n rated rows in each window (the windows
-- may not overlap).
CREATE OR REPLACE FUNCTION loop.trigger_decline(p_tenant int, p_route text)
RETURNS TABLE (trigger text, fired boolean, value float8, threshold float8, detail jsonb, line text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  p      loop.policy := loop.effective_policy(p_tenant, p_route);
  v_prod serve.adapter%ROWTYPE;
  v_t0   timestamptz;
  b      record;
  l      record;
  t      record;
  v_d    jsonb;
BEGIN
  SELECT * INTO v_prod FROM serve.adapter a
   WHERE a.tenant_id = p_tenant AND a.route = p_route AND a.status = 'prod';
  IF NOT p.decline_enabled OR v_prod.id IS NULL THEN
    RETURN QUERY SELECT 'decline'::text, false, NULL::float8, p.decline_alpha,
      jsonb_build_object('prod', v_prod.id),
      CASE WHEN NOT p.decline_enabled THEN 'off' ELSE 'no prod adapter to watch' END;
    RETURN;
  END IF;
  v_t0 := coalesce(v_prod.promoted_at, v_prod.created_at);
  SELECT count(*) AS n, count(*) FILTER (WHERE fb_explicit > 0) AS x INTO b
    FROM obs.inference_log WHERE tenant_id = v_prod.tenant_id AND adapter_id = v_prod.id
     AND created_at >= v_t0 AND created_at < v_t0 + p.decline_window AND fb_explicit <> 0;
  SELECT count(*) AS n, count(*) FILTER (WHERE fb_explicit > 0) AS x INTO l
    FROM obs.inference_log WHERE tenant_id = v_prod.tenant_id AND adapter_id = v_prod.id
     AND created_at >= greatest(now() - p.decline_window, v_t0 + p.decline_window)
     AND fb_explicit <> 0;
  -- p_value of "baseline rate > live rate"
  SELECT * INTO t FROM loop.prop_test(l.x, l.n, b.x, b.n);
  v_d := jsonb_build_object('prod', v_prod.id, 'since_promotion', v_t0,
    'baseline', jsonb_build_object('n', b.n, 'thumbs_up', b.x, 'rate', t.rate2),
    'live', jsonb_build_object('n', l.n, 'thumbs_up', l.x, 'rate', t.rate1),
    'z', t.z, 'p_value', t.p_value, 'alpha', p.decline_alpha, 'min_n', p.decline_min_n,
    'test', 'one-sided two-proportion z (pooled)');
  IF now() < v_t0 + 2 * p.decline_window THEN
    RETURN QUERY SELECT 'decline'::text, false, t.rate1, t.rate2, v_d,
      format('waiting: prod %s has served %s of the %s needed for two windows', v_prod.id,
             date_trunc('second', now() - v_t0), 2 * p.decline_window);
  ELSIF b.n < p.decline_min_n OR l.n < p.decline_min_n THEN
    RETURN QUERY SELECT 'decline'::text, false, t.rate1, t.rate2, v_d,
      format('waiting: %s and %s rated rows (after promotion, now), %s each needed', b.n, l.n,
             p.decline_min_n);
  ELSE
    RETURN QUERY SELECT 'decline'::text, coalesce(t.p_value < p.decline_alpha, false), t.rate1,
      t.rate2, v_d,
      format('%s: thumbs-up %s now vs %s after promotion (p = %s, alpha %s)',
             CASE WHEN t.p_value < p.decline_alpha THEN 'fired' ELSE 'steady' END,
             round(t.rate1::numeric, 3), round(t.rate2::numeric, 3),
             round(t.p_value::numeric, 4), p.decline_alpha);
  END IF;
END
$$;

-- Drift: of the route's last drift_sample embedded prompts logged after the prod adapter's
-- training snapshot was taken, the share whose nearest training prompt (cosine distance to the
-- embeddings of the snapshot's source log rows, train.dataset_example.log_ids) is farther than
-- drift_distance. Fires when that share >= drift_share over at least drift_min_n prompts.
-- Exact nearest neighbours (a scan of the snapshot's prompts per recent prompt): drift_sample x
-- training rows distances, ~1 s at 200 x 10k.
CREATE OR REPLACE FUNCTION loop.trigger_drift(p_tenant int, p_route text)
RETURNS TABLE (trigger text, fired boolean, value float8, threshold float8, detail jsonb, line text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  p      loop.policy := loop.effective_policy(p_tenant, p_route);
  v_prod serve.adapter%ROWTYPE;
  v_snap train.dataset_snapshot%ROWTYPE;
  r      record;
  v_d    jsonb;
BEGIN
  SELECT * INTO v_prod FROM serve.adapter a
   WHERE a.tenant_id = p_tenant AND a.route = p_route AND a.status = 'prod';
  SELECT * INTO v_snap FROM train.dataset_snapshot s WHERE s.id = v_prod.dataset_snapshot_id;
  IF NOT p.drift_enabled OR v_snap.id IS NULL THEN
    RETURN QUERY SELECT 'drift'::text, false, NULL::float8, p.drift_share,
      jsonb_build_object('prod', v_prod.id),
      CASE WHEN NOT p.drift_enabled THEN 'off'
           WHEN v_prod.id IS NULL THEN 'no prod adapter to compare with'
           ELSE format('prod %s has no training snapshot to compare with', v_prod.id) END;
    RETURN;
  END IF;
  WITH train_rows AS MATERIALIZED (
    SELECT l.embedding FROM obs.inference_log l
     WHERE l.tenant_id = v_prod.tenant_id AND l.embedding IS NOT NULL
       AND l.id IN (SELECT unnest(e.log_ids) FROM train.dataset_example e
                     WHERE e.snapshot_id = v_snap.id)
  ), recent AS (
    SELECT l.embedding FROM obs.inference_log l
     WHERE l.tenant_id = v_prod.tenant_id AND l.route = p_route AND l.created_at > v_snap.created_at
       AND l.embedding IS NOT NULL
     ORDER BY l.created_at DESC LIMIT p.drift_sample
  ), d AS (
    SELECT (SELECT min(r2.embedding <=> t.embedding) FROM train_rows t) AS dist FROM recent r2
  )
  SELECT (SELECT count(*) FROM train_rows) AS n_train, count(*) AS n,
         count(*) FILTER (WHERE d.dist > p.drift_distance) AS far, avg(d.dist) AS mean_dist
    INTO r FROM d;
  v_d := jsonb_build_object('prod', v_prod.id, 'snapshot_id', v_snap.id,
    'training_prompts', r.n_train, 'recent_prompts', r.n, 'far', r.far,
    'mean_nearest_distance', r.mean_dist, 'distance', p.drift_distance,
    'sample', p.drift_sample, 'min_n', p.drift_min_n);
  IF r.n_train = 0 THEN
    RETURN QUERY SELECT 'drift'::text, false, NULL::float8, p.drift_share, v_d,
      format('no embedded training prompt in snapshot %s', v_snap.id);
  ELSIF r.n < p.drift_min_n THEN
    RETURN QUERY SELECT 'drift'::text, false, (r.far::float8 / nullif(r.n, 0)), p.drift_share, v_d,
      format('waiting: %s of %s embedded prompts since the prod''s snapshot', r.n, p.drift_min_n);
  ELSE
    RETURN QUERY SELECT 'drift'::text, r.far::float8 / r.n >= p.drift_share,
      r.far::float8 / r.n, p.drift_share, v_d,
      format('%s: %s of %s recent prompts (%s %%) are farther than %s from every training prompt'
             ' (fires at %s %%)',
             CASE WHEN r.far::float8 / r.n >= p.drift_share THEN 'fired' ELSE 'steady' END,
             r.far, r.n, round(100.0 * r.far / r.n, 1), p.drift_distance,
             round((100 * p.drift_share)::numeric, 1));
  END IF;
END
$$;

-- Forget: the prod adapter is tainted (a user it was trained on was forgotten).
CREATE OR REPLACE FUNCTION loop.trigger_forget(p_tenant int, p_route text)
RETURNS TABLE (trigger text, fired boolean, value float8, threshold float8, detail jsonb, line text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_prod serve.adapter%ROWTYPE;
BEGIN
  PERFORM loop.check_route(p_tenant, p_route);
  SELECT * INTO v_prod FROM serve.adapter a
   WHERE a.tenant_id = p_tenant AND a.route = p_route AND a.status = 'prod';
  RETURN QUERY SELECT 'forget'::text, v_prod.tainted_at IS NOT NULL,
    CASE WHEN v_prod.tainted_at IS NOT NULL THEN 1 ELSE 0 END::float8, 1::float8,
    jsonb_build_object('prod', v_prod.id, 'tainted_at', v_prod.tainted_at,
                       'tainted_reason', v_prod.tainted_reason,
                       'forget_request_id',
                       (substring(v_prod.tainted_reason FROM 'forget request (\d+)'))::bigint),
    CASE WHEN v_prod.id IS NULL THEN 'no prod adapter'
         WHEN v_prod.tainted_at IS NOT NULL
           THEN format('fired: prod %s is tainted (%s)', v_prod.id, v_prod.tainted_reason)
         ELSE format('clean: prod %s is not tainted', v_prod.id) END;
END
$$;

-- Every trigger of a route, in the order a cycle start picks them (the first that fired).
CREATE OR REPLACE FUNCTION loop.triggers(p_tenant int, p_route text)
RETURNS TABLE (trigger text, fired boolean, value float8, threshold float8, detail jsonb, line text)
LANGUAGE sql VOLATILE AS $$
  SELECT * FROM loop.trigger_forget(p_tenant, p_route)
  UNION ALL SELECT * FROM loop.trigger_decline(p_tenant, p_route)
  UNION ALL SELECT * FROM loop.trigger_drift(p_tenant, p_route)
  UNION ALL SELECT * FROM loop.trigger_volume(p_tenant, p_route)
  UNION ALL SELECT * FROM loop.trigger_schedule(p_tenant, p_route)
$$;
COMMENT ON FUNCTION loop.triggers(int, text) IS
  'The live value of every loop trigger of a tenant''s route (forget, decline, drift, volume, schedule).';
