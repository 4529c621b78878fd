-- A/B metrics of experiments over obs.inference_log, per arm (experiment × variant × adapter),
-- per hour/day, and canary versus prod with confidence intervals and p-values.
--
-- Differences from the naive per-adapter query (STDDEV(fb_explicit) / SQRT(COUNT(*)), ±2 SE):
--   * the standard error divides by the number of rows WITH explicit feedback: STDDEV skips NULLs
--     but COUNT(*) does not, so that query understated the error (by √(rated share));
--   * arms are variant × adapter, not adapter alone (one adapter can serve two experiments);
--   * the 95 % interval uses Student's t with n-1 degrees of freedom, not ±2 SE.
-- Every function runs as its caller: the API role (cft_app) sees only its tenant's rows. An
-- experiment name is unique per tenant only: p_tenant_id (NULL = every tenant the caller can
-- see) keeps one tenant's arms apart from another's for roles that read every tenant (the
-- dashboard, release managers, the loop's own functions).

-- One row per group; p_bucket NULL = the whole window, 'hour' or 'day' = one row per bucket.
CREATE OR REPLACE FUNCTION obs.experiment_agg(p_experiment text, p_since timestamptz,
                                                 p_until timestamptz, p_bucket text,
                                                 p_alpha float8 DEFAULT 0.05,
                                                 p_tenant_id int DEFAULT NULL)
RETURNS TABLE (experiment text, bucket_at timestamptz, variant text, adapter_id text, route text,
               n bigint, n_error bigint, n_feedback bigint,
               feedback_mean float8, feedback_var float8, feedback_se float8,
               feedback_ci_low float8, feedback_ci_high float8,
               n_thumbs_up bigint, n_thumbs_down bigint, thumbs_up_rate float8,
               thumbs_up_ci_low float8, thumbs_up_ci_high float8,
               n_regen bigint, regen_rate float8, n_edited bigint, edit_rate float8,
               n_ttft bigint, ttft_avg float8, ttft_var float8, ttft_p50 float8, ttft_p95 float8,
               tokens_out_avg float8, tokens_out_sum bigint,
               first_at timestamptz, last_at timestamptz)
LANGUAGE sql STABLE AS $$
  WITH g AS (
    SELECT l.experiment,
           CASE WHEN p_bucket IS NULL THEN NULL ELSE date_trunc(p_bucket, l.created_at) END AS bucket_at,
           l.variant::text AS variant, l.adapter_id,
           min(l.route) AS route,
           count(*) AS n,
           count(*) FILTER (WHERE l.status = 'error') AS n_error,
           count(l.fb_explicit) AS n_feedback,
           avg(l.fb_explicit)::float8 AS feedback_mean,
           var_samp(l.fb_explicit)::float8 AS feedback_var,
           count(*) FILTER (WHERE l.fb_explicit = 1) AS n_thumbs_up,
           count(*) FILTER (WHERE l.fb_explicit = -1) AS n_thumbs_down,
           count(*) FILTER (WHERE l.fb_regen) AS n_regen,
           count(*) FILTER (WHERE l.fb_edited) AS n_edited,
           count(l.ttft_ms) AS n_ttft,
           avg(l.ttft_ms)::float8 AS ttft_avg,
           var_samp(l.ttft_ms)::float8 AS ttft_var,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY l.ttft_ms) AS ttft_p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY l.ttft_ms) AS ttft_p95,
           avg(l.tokens_out)::float8 AS tokens_out_avg,
           sum(l.tokens_out)::bigint AS tokens_out_sum,
           min(l.created_at) AS first_at, max(l.created_at) AS last_at
      FROM obs.inference_log l
     WHERE l.experiment = p_experiment AND l.created_at >= p_since AND l.created_at < p_until
       AND l.variant IS NOT NULL AND (p_tenant_id IS NULL OR l.tenant_id = p_tenant_id)
     GROUP BY 1, 2, 3, 4
  )
  SELECT g.experiment, g.bucket_at, g.variant, g.adapter_id, g.route, g.n, g.n_error, g.n_feedback,
         g.feedback_mean, g.feedback_var,
         sqrt(g.feedback_var / g.n_feedback),
         g.feedback_mean - stats.t_ppf(1 - p_alpha / 2, g.n_feedback - 1) * sqrt(g.feedback_var / g.n_feedback),
         g.feedback_mean + stats.t_ppf(1 - p_alpha / 2, g.n_feedback - 1) * sqrt(g.feedback_var / g.n_feedback),
         g.n_thumbs_up, g.n_thumbs_down,
         g.n_thumbs_up::float8 / nullif(g.n_feedback, 0),
         w.low, w.high,
         g.n_regen, g.n_regen::float8 / g.n, g.n_edited, g.n_edited::float8 / g.n,
         g.n_ttft, g.ttft_avg, g.ttft_var, g.ttft_p50, g.ttft_p95,
         g.tokens_out_avg, g.tokens_out_sum, g.first_at, g.last_at
    FROM g
    LEFT JOIN LATERAL stats.wilson(g.n_thumbs_up, g.n_feedback, p_alpha) w ON true
   ORDER BY g.bucket_at NULLS FIRST, g.variant, g.adapter_id
$$;

-- Per arm over a window.
CREATE OR REPLACE FUNCTION obs.experiment_arms(p_experiment text,
                                               p_since timestamptz DEFAULT now() - interval '7 days',
                                               p_until timestamptz DEFAULT now(),
                                               p_alpha float8 DEFAULT 0.05,
                                               p_tenant_id int DEFAULT NULL)
RETURNS TABLE (experiment text, variant text, adapter_id text, route text,
               n bigint, n_error bigint, n_feedback bigint,
               feedback_mean float8, feedback_var float8, feedback_se float8,
               feedback_ci_low float8, feedback_ci_high float8,
               n_thumbs_up bigint, n_thumbs_down bigint, thumbs_up_rate float8,
               thumbs_up_ci_low float8, thumbs_up_ci_high float8,
               n_regen bigint, regen_rate float8, n_edited bigint, edit_rate float8,
               n_ttft bigint, ttft_avg float8, ttft_var float8, ttft_p50 float8, ttft_p95 float8,
               tokens_out_avg float8, tokens_out_sum bigint,
               first_at timestamptz, last_at timestamptz)
LANGUAGE sql STABLE AS $$
  SELECT a.experiment, a.variant, a.adapter_id, a.route, a.n, a.n_error, a.n_feedback,
         a.feedback_mean, a.feedback_var, a.feedback_se, a.feedback_ci_low, a.feedback_ci_high,
         a.n_thumbs_up, a.n_thumbs_down, a.thumbs_up_rate, a.thumbs_up_ci_low, a.thumbs_up_ci_high,
         a.n_regen, a.regen_rate, a.n_edited, a.edit_rate,
         a.n_ttft, a.ttft_avg, a.ttft_var, a.ttft_p50, a.ttft_p95,
         a.tokens_out_avg, a.tokens_out_sum, a.first_at, a.last_at
    FROM obs.experiment_agg(p_experiment, p_since, p_until, NULL, p_alpha, p_tenant_id) a
$$;
COMMENT ON FUNCTION obs.experiment_arms(text, timestamptz, timestamptz, float8, int) IS
  'Per arm (variant × adapter) of an experiment in [since, until), of one tenant (p_tenant_id; '
  'NULL = every tenant the caller sees): n = rows; n_feedback = rows with '
  'explicit feedback; feedback_mean/var/se over those, CI = mean ± t(1-α/2, n_feedback-1)·se; '
  'thumbs_up_rate = thumbs up / n_feedback with a Wilson interval; regen_rate, edit_rate = share of '
  'all rows; ttft_* over rows with a ttft (percentile_cont); tokens_out_*; first_at/last_at.';

-- Time series per hour or day, for plots.
CREATE OR REPLACE FUNCTION obs.experiment_series(p_experiment text,
                                                 p_since timestamptz DEFAULT now() - interval '7 days',
                                                 p_until timestamptz DEFAULT now(),
                                                 p_bucket text DEFAULT 'hour',
                                                 p_alpha float8 DEFAULT 0.05,
                                                 p_tenant_id int DEFAULT NULL)
RETURNS TABLE (experiment text, bucket_at timestamptz, variant text, adapter_id text,
               n bigint, n_feedback bigint, feedback_mean float8,
               feedback_ci_low float8, feedback_ci_high float8,
               thumbs_up_rate float8, thumbs_up_ci_low float8, thumbs_up_ci_high float8,
               regen_rate float8, edit_rate float8,
               ttft_avg float8, ttft_p50 float8, ttft_p95 float8, tokens_out_avg float8)
LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF p_bucket NOT IN ('hour', 'day') THEN
    RAISE invalid_parameter_value USING MESSAGE = format('bucket must be hour or day, not %s', p_bucket);
  END IF;
  RETURN QUERY
  SELECT a.experiment, a.bucket_at, a.variant, a.adapter_id, a.n, a.n_feedback, a.feedback_mean,
         a.feedback_ci_low, a.feedback_ci_high, a.thumbs_up_rate, a.thumbs_up_ci_low,
         a.thumbs_up_ci_high, a.regen_rate, a.edit_rate, a.ttft_avg, a.ttft_p50, a.ttft_p95,
         a.tokens_out_avg
    FROM obs.experiment_agg(p_experiment, p_since, p_until, p_bucket, p_alpha, p_tenant_id) a;
END
$$;
COMMENT ON FUNCTION obs.experiment_series(text, timestamptz, timestamptz, text, float8, int) IS
  'experiment_arms per hour or day (bucket_at = date_trunc(bucket, created_at)), for plots; '
  'p_tenant_id as there.';

-- Canary versus prod: one row per canary arm and metric.
CREATE OR REPLACE FUNCTION obs.experiment_compare(p_experiment text,
                                                  p_since timestamptz DEFAULT now() - interval '7 days',
                                                  p_until timestamptz DEFAULT now(),
                                                  p_alpha float8 DEFAULT 0.05,
                                                  p_power float8 DEFAULT 0.8,
                                                  p_mde_mean float8 DEFAULT 0.1,
                                                  p_mde_rate float8 DEFAULT 0.05,
                                                  p_tenant_id int DEFAULT NULL)
RETURNS TABLE (experiment text, metric text, test text, higher_is_better boolean,
               control_variant text, control_adapter text, canary_variant text, canary_adapter text,
               n_control bigint, n_canary bigint, control_value float8, canary_value float8,
               diff float8, diff_ci_low float8, diff_ci_high float8, statistic float8, df float8,
               p_value float8, alpha float8, significant boolean, canary_better boolean,
               mde float8, power float8, n_required_per_arm bigint, n_more_needed bigint)
LANGUAGE sql STABLE AS $$
  WITH arms AS (
    SELECT * FROM obs.experiment_arms(p_experiment, p_since, p_until, p_alpha, p_tenant_id)
  ), control AS (
    SELECT * FROM arms WHERE arms.variant = 'A' ORDER BY arms.n DESC, arms.adapter_id LIMIT 1
  ), pairs AS (
    SELECT c.experiment, c.variant AS cv, c.adapter_id AS ca, k.variant AS kv, k.adapter_id AS ka,
           m.metric, m.test, m.hib, m.n_c, m.n_k, m.v_c, m.v_k, m.var_c, m.var_k, m.x_c, m.x_k
      FROM control c
      JOIN arms k ON k.variant <> 'A'
      CROSS JOIN LATERAL (VALUES
        ('feedback_mean', 'welch_t', true, c.n_feedback, k.n_feedback, c.feedback_mean,
         k.feedback_mean, c.feedback_var, k.feedback_var, NULL::bigint, NULL::bigint),
        ('thumbs_up_rate', 'two_proportion_z', true, c.n_feedback, k.n_feedback, c.thumbs_up_rate,
         k.thumbs_up_rate, NULL, NULL, c.n_thumbs_up, k.n_thumbs_up),
        ('regen_rate', 'two_proportion_z', false, c.n, k.n, c.regen_rate, k.regen_rate, NULL, NULL,
         c.n_regen, k.n_regen),
        ('edit_rate', 'two_proportion_z', false, c.n, k.n, c.edit_rate, k.edit_rate, NULL, NULL,
         c.n_edited, k.n_edited),
        ('ttft_avg', 'welch_t', false, c.n_ttft, k.n_ttft, c.ttft_avg, k.ttft_avg, c.ttft_var,
         k.ttft_var, NULL, NULL),
        ('ttft_p95', 'none', false, c.n_ttft, k.n_ttft, c.ttft_p95, k.ttft_p95, NULL, NULL, NULL, NULL)
      ) AS m(metric, test, hib, n_c, n_k, v_c, v_k, var_c, var_k, x_c, x_k)
  ), se AS (
    SELECT p.*,
           p.v_k - p.v_c AS d,
           CASE p.test
             WHEN 'welch_t' THEN
               CASE WHEN p.n_c >= 2 AND p.n_k >= 2 THEN sqrt(p.var_c / p.n_c + p.var_k / p.n_k) END
             WHEN 'two_proportion_z' THEN
               CASE WHEN p.n_c > 0 AND p.n_k > 0
                    THEN sqrt(p.v_c * (1 - p.v_c) / p.n_c + p.v_k * (1 - p.v_k) / p.n_k) END
           END AS se_diff,
           -- the test statistic's standard error: pooled under H0 for proportions
           CASE p.test
             WHEN 'welch_t' THEN
               CASE WHEN p.n_c >= 2 AND p.n_k >= 2 THEN sqrt(p.var_c / p.n_c + p.var_k / p.n_k) END
             WHEN 'two_proportion_z' THEN
               CASE WHEN p.n_c > 0 AND p.n_k > 0 THEN
                 sqrt(((p.x_c + p.x_k)::float8 / (p.n_c + p.n_k))
                      * (1 - (p.x_c + p.x_k)::float8 / (p.n_c + p.n_k))
                      * (1.0 / p.n_c + 1.0 / p.n_k)) END
           END AS se_test,
           CASE WHEN p.test = 'welch_t' AND p.n_c >= 2 AND p.n_k >= 2
                     AND (p.var_c / p.n_c + p.var_k / p.n_k) > 0 THEN
             power(p.var_c / p.n_c + p.var_k / p.n_k, 2)
               / (power(p.var_c / p.n_c, 2) / (p.n_c - 1) + power(p.var_k / p.n_k, 2) / (p.n_k - 1))
           END AS welch_df
      FROM pairs p
  ), tested AS (
    SELECT se.*,
           CASE WHEN se.se_test > 0 THEN se.d / se.se_test END AS stat,
           CASE se.test
             WHEN 'welch_t' THEN stats.t_ppf(1 - p_alpha / 2, se.welch_df)
             WHEN 'two_proportion_z' THEN stats.norm_ppf(1 - p_alpha / 2)
           END AS crit
      FROM se
  ), final AS (
    SELECT t.*,
           CASE t.test
             WHEN 'welch_t' THEN stats.t_pvalue(t.stat, t.welch_df)
             WHEN 'two_proportion_z' THEN stats.norm_pvalue(t.stat)
           END AS p,
           CASE t.test
             WHEN 'welch_t' THEN p_mde_mean * CASE WHEN t.metric = 'ttft_avg' THEN 0 ELSE 1 END
             WHEN 'two_proportion_z' THEN p_mde_rate
           END AS mde_used
      FROM tested t
  )
  SELECT f.experiment, f.metric, f.test, f.hib, f.cv, f.ca, f.kv, f.ka, f.n_c, f.n_k, f.v_c, f.v_k,
         f.d, f.d - f.crit * f.se_diff, f.d + f.crit * f.se_diff, f.stat, f.welch_df, f.p, p_alpha,
         coalesce(f.p < p_alpha, false),
         CASE WHEN f.d IS NULL OR f.d = 0 THEN NULL ELSE (f.d > 0) = f.hib END,
         nullif(f.mde_used, 0), p_power, n_req.n,
         greatest(0, n_req.n - least(f.n_c, f.n_k))
    FROM final f
    CROSS JOIN LATERAL (SELECT CASE f.test
        WHEN 'welch_t' THEN stats.sample_size_mean(f.var_c, coalesce(f.var_k, f.var_c),
                                                   nullif(f.mde_used, 0), p_alpha, p_power)
        WHEN 'two_proportion_z' THEN stats.sample_size_prop(f.v_c, f.mde_used, p_alpha, p_power)
      END AS n) n_req
   ORDER BY f.kv, f.ka, f.metric
$$;
COMMENT ON FUNCTION obs.experiment_compare(text, timestamptz, timestamptz, float8, float8, float8, float8, int) IS
  'Each canary arm (variant <> ''A'') against the control (the ''A'' arm with the most rows), one row '
  'per metric. diff = canary - control. feedback_mean and ttft_avg: Welch''s t-test (statistic = t, '
  'df = Welch-Satterthwaite, CI = diff ± t(1-α/2, df)·se); thumbs_up_rate (of rated rows), '
  'regen_rate and edit_rate (of all rows): two-proportion z-test (pooled se for z, unpooled for the '
  'CI); ttft_p95: no test. The CI level is 1-α, so it excludes 0 exactly when p < α. '
  'canary_better follows higher_is_better. n_required_per_arm detects an effect of mde '
  '(p_mde_mean for means, p_mde_rate for rates, absolute) at α and power; n_more_needed = what the '
  'smaller arm still lacks. p_tenant_id: one tenant''s arms (NULL = every tenant the caller sees).';
