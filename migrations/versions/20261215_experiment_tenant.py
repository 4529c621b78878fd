"""Experiment metrics per tenant: an experiment name is unique per tenant only.

obs.experiment_arm_7d and obs.experiment_compare_7d called obs.experiment_arms /
obs.experiment_compare by name only, and so did loop.canary_verdict and serve.canary_decision's
fixed-horizon numbers. For the roles that read every tenant (cft_dashboard, cft_release, the
loop's SECURITY DEFINER functions), two tenants logging the same experiment string had their
arms aggregated together. Now:

* obs.experiment_agg, obs.experiment_arms, obs.experiment_series and obs.experiment_compare take
  p_tenant_id int DEFAULT NULL (NULL = every tenant the caller sees, as before; under row-level
  security that is the caller's own tenant). The old signatures are dropped.
* The 7-day views pass their experiment's tenant and gain a tenant_id column (first).
* loop.canary_verdict and serve.canary_decision pass the route's tenant.

The downgrade restores the name-only functions and views.

Revision ID: 20261215
Revises: 20261214
"""

from alembic import op

revision = "20261215"
down_revision = "20261214"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
DROP VIEW obs.experiment_arm_7d, obs.experiment_compare_7d;
DROP FUNCTION obs.experiment_compare(text, timestamptz, timestamptz, float8, float8, float8, float8);
DROP FUNCTION obs.experiment_series(text, timestamptz, timestamptz, text, float8);
DROP FUNCTION obs.experiment_arms(text, timestamptz, timestamptz, float8);
DROP FUNCTION obs.experiment_agg(text, timestamptz, timestamptz, text, float8);

-- A/B metrics of experiments over obs.inference_log, per arm (experiment × variant × adapter),
-- per hour/day, and canary versus prod with confidence intervals and p-values.
--
-- Differences from the seed's sketch (STDDEV(fb_explicit) / SQRT(COUNT(*))):
--   * the standard error divides by the number of rows WITH explicit feedback: STDDEV skips NULLs
--     but COUNT(*) does not, so the sketch understated the error (by √(rated share));
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

CREATE OR REPLACE VIEW obs.experiment_arm_7d WITH (security_invoker = true) AS
  SELECT e.tenant_id, a.*
    FROM obs.experiment e
    CROSS JOIN LATERAL obs.experiment_arms(e.experiment, now() - interval '7 days', now(),
                                           p_tenant_id => e.tenant_id) a
   WHERE e.last_at > now() - interval '7 days';
COMMENT ON VIEW obs.experiment_arm_7d IS
  'obs.experiment_arms over the last 7 days for every recently active experiment (see that function for columns).';

COMMENT ON COLUMN obs.experiment_arm_7d.tenant_id IS
  'The tenant whose experiment it is (names are unique per tenant only).';
COMMENT ON COLUMN obs.experiment_arm_7d.experiment IS 'The experiment (obs.experiment.experiment).';
COMMENT ON COLUMN obs.experiment_arm_7d.variant IS
  'The arm''s variant: A = prod (the control), B.. = canaries.';
COMMENT ON COLUMN obs.experiment_arm_7d.adapter_id IS
  'The adapter that served the arm (an arm is variant × adapter).';
COMMENT ON COLUMN obs.experiment_arm_7d.route IS
  'The route logged (the first by name if the arm''s rows carry several).';
COMMENT ON COLUMN obs.experiment_arm_7d.n IS
  'The arm''s rows (logged inferences) in the last 7 days.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_error IS 'Rows with status error.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_feedback IS
  'Rows with explicit feedback (fb_explicit not NULL).';
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_mean IS
  'Mean fb_explicit over rated rows (-1..1).';
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_var IS
  'Sample variance of fb_explicit over rated rows.';
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_se IS
  'Standard error of feedback_mean: sqrt(feedback_var / n_feedback).';
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_ci_low IS
  'Low end of the 95 % interval of feedback_mean (Student''s t, n_feedback - 1 df).';
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_ci_high IS
  'High end of the 95 % interval of feedback_mean.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_thumbs_up IS 'Rows rated 1 (thumbs up).';
COMMENT ON COLUMN obs.experiment_arm_7d.n_thumbs_down IS 'Rows rated -1 (thumbs down).';
COMMENT ON COLUMN obs.experiment_arm_7d.thumbs_up_rate IS
  'n_thumbs_up / n_feedback (neutral ratings count as not up); NULL: none rated.';
COMMENT ON COLUMN obs.experiment_arm_7d.thumbs_up_ci_low IS
  'Low end of the 95 % Wilson interval of thumbs_up_rate.';
COMMENT ON COLUMN obs.experiment_arm_7d.thumbs_up_ci_high IS
  'High end of the 95 % Wilson interval of thumbs_up_rate.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_regen IS 'Rows the user regenerated (fb_regen).';
COMMENT ON COLUMN obs.experiment_arm_7d.regen_rate IS 'n_regen / n.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_edited IS 'Rows the user corrected (fb_edited).';
COMMENT ON COLUMN obs.experiment_arm_7d.edit_rate IS 'n_edited / n.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_ttft IS
  'Rows with a time to first token (ttft_ms not NULL).';
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_avg IS 'Mean time to first token, in ms.';
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_var IS
  'Sample variance of the time to first token, in ms squared.';
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_p50 IS
  'Median time to first token, in ms (percentile_cont).';
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_p95 IS
  '95th percentile of the time to first token, in ms (percentile_cont).';
COMMENT ON COLUMN obs.experiment_arm_7d.tokens_out_avg IS
  'Mean completion tokens per row (of rows with a count).';
COMMENT ON COLUMN obs.experiment_arm_7d.tokens_out_sum IS
  'Completion tokens of all the arm''s rows.';
COMMENT ON COLUMN obs.experiment_arm_7d.first_at IS
  'When the arm''s first row in the window was logged.';
COMMENT ON COLUMN obs.experiment_arm_7d.last_at IS
  'When the arm''s last row in the window was logged.';

CREATE OR REPLACE VIEW obs.experiment_compare_7d WITH (security_invoker = true) AS
  SELECT e.tenant_id, c.*
    FROM obs.experiment e
    CROSS JOIN LATERAL obs.experiment_compare(e.experiment, now() - interval '7 days', now(),
                                              p_tenant_id => e.tenant_id) c
   WHERE e.last_at > now() - interval '7 days';
COMMENT ON VIEW obs.experiment_compare_7d IS
  'obs.experiment_compare over the last 7 days (α 0.05, power 0.8) for every recently active experiment.';

COMMENT ON COLUMN obs.experiment_compare_7d.tenant_id IS
  'The tenant whose experiment it is (names are unique per tenant only).';
COMMENT ON COLUMN obs.experiment_compare_7d.experiment IS
  'The experiment (obs.experiment.experiment).';
COMMENT ON COLUMN obs.experiment_compare_7d.metric IS
  'What is compared: feedback_mean, thumbs_up_rate, regen_rate, edit_rate, ttft_avg or ttft_p95.';
COMMENT ON COLUMN obs.experiment_compare_7d.test IS
  'welch_t (feedback_mean, ttft_avg), two_proportion_z (the rates) or none (ttft_p95).';
COMMENT ON COLUMN obs.experiment_compare_7d.higher_is_better IS
  'True for feedback_mean and thumbs_up_rate; false for the regen, edit and ttft metrics.';
COMMENT ON COLUMN obs.experiment_compare_7d.control_variant IS 'The control arm''s variant (A).';
COMMENT ON COLUMN obs.experiment_compare_7d.control_adapter IS
  'The control arm''s adapter: of the A arms, the one with the most rows.';
COMMENT ON COLUMN obs.experiment_compare_7d.canary_variant IS 'The canary arm''s variant (B..).';
COMMENT ON COLUMN obs.experiment_compare_7d.canary_adapter IS 'The canary arm''s adapter.';
COMMENT ON COLUMN obs.experiment_compare_7d.n_control IS
  'The control''s observations of the metric: rated rows (feedback_mean, '
  'thumbs_up_rate), all rows (regen_rate, edit_rate) or rows with a ttft.';
COMMENT ON COLUMN obs.experiment_compare_7d.n_canary IS
  'The canary''s observations of the metric, counted as n_control.';
COMMENT ON COLUMN obs.experiment_compare_7d.control_value IS
  'The metric on the control arm (ttft metrics in ms).';
COMMENT ON COLUMN obs.experiment_compare_7d.canary_value IS
  'The metric on the canary arm (ttft metrics in ms).';
COMMENT ON COLUMN obs.experiment_compare_7d.diff IS 'canary_value - control_value.';
COMMENT ON COLUMN obs.experiment_compare_7d.diff_ci_low IS
  'Low end of the 95 % interval of diff; NULL: no test, or too few rows.';
COMMENT ON COLUMN obs.experiment_compare_7d.diff_ci_high IS
  'High end of the 95 % interval of diff; NULL: no test, or too few rows.';
COMMENT ON COLUMN obs.experiment_compare_7d.statistic IS
  'Welch''s t, or the pooled two-proportion z; NULL: no test, too few rows or zero standard error.';
COMMENT ON COLUMN obs.experiment_compare_7d.df IS
  'Welch-Satterthwaite degrees of freedom (welch_t only; NULL otherwise).';
COMMENT ON COLUMN obs.experiment_compare_7d.p_value IS
  'Two-sided p-value of the test; NULL: no test or no statistic.';
COMMENT ON COLUMN obs.experiment_compare_7d.alpha IS 'The significance level: 0.05.';
COMMENT ON COLUMN obs.experiment_compare_7d.significant IS
  'p_value < alpha (false when there is no p-value).';
COMMENT ON COLUMN obs.experiment_compare_7d.canary_better IS
  'diff goes the better way (per higher_is_better); NULL: diff 0 or unknown.';
COMMENT ON COLUMN obs.experiment_compare_7d.mde IS
  'The absolute effect the sample size is for: 0.1 for '
  'feedback_mean, 0.05 for the rates; NULL for the ttft metrics.';
COMMENT ON COLUMN obs.experiment_compare_7d.power IS 'The power the sample size is for: 0.8.';
COMMENT ON COLUMN obs.experiment_compare_7d.n_required_per_arm IS
  'Observations each arm needs to detect mde at alpha with that '
  'power; NULL: no mde, or no variance or rate to size from.';
COMMENT ON COLUMN obs.experiment_compare_7d.n_more_needed IS
  'n_required_per_arm minus the smaller of n_control and '
  'n_canary, at least 0 (0 also when n_required_per_arm is NULL).';

GRANT SELECT ON obs.experiment, obs.experiment_arm_7d, obs.experiment_compare_7d
  TO cft_app, cft_release, cft_dashboard;

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

CREATE OR REPLACE FUNCTION loop.canary_verdict(p_cycle bigint)
RETURNS TABLE (decision text, code text, reason text, numbers jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
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
  p := loop.effective_policy(c.route);
  SELECT coalesce(r.experiment, r.name) INTO v_exp FROM serve.route r WHERE r.name = c.route;
  v_prod := serve.current_prod(c.route);
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
"""

DOWNGRADE_SQL = r"""
DROP VIEW obs.experiment_arm_7d, obs.experiment_compare_7d;
DROP FUNCTION obs.experiment_compare(text, timestamptz, timestamptz, float8, float8, float8, float8, int);
DROP FUNCTION obs.experiment_series(text, timestamptz, timestamptz, text, float8, int);
DROP FUNCTION obs.experiment_arms(text, timestamptz, timestamptz, float8, int);
DROP FUNCTION obs.experiment_agg(text, timestamptz, timestamptz, text, float8, int);

-- A/B metrics of experiments over obs.inference_log, per arm (experiment × variant × adapter),
-- per hour/day, and canary versus prod with confidence intervals and p-values.
--
-- Differences from the seed's sketch (STDDEV(fb_explicit) / SQRT(COUNT(*))):
--   * the standard error divides by the number of rows WITH explicit feedback: STDDEV skips NULLs
--     but COUNT(*) does not, so the sketch understated the error (by √(rated share));
--   * arms are variant × adapter, not adapter alone (one adapter can serve two experiments);
--   * the 95 % interval uses Student's t with n-1 degrees of freedom, not ±2 SE.
-- Every function runs as its caller: the API role (cft_app) sees only its tenant's rows.

-- One row per group; p_bucket NULL = the whole window, 'hour' or 'day' = one row per bucket.
CREATE OR REPLACE FUNCTION obs.experiment_agg(p_experiment text, p_since timestamptz,
                                                 p_until timestamptz, p_bucket text,
                                                 p_alpha float8 DEFAULT 0.05)
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
       AND l.variant IS NOT NULL
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
                                               p_alpha float8 DEFAULT 0.05)
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
    FROM obs.experiment_agg(p_experiment, p_since, p_until, NULL, p_alpha) a
$$;
COMMENT ON FUNCTION obs.experiment_arms(text, timestamptz, timestamptz, float8) IS
  'Per arm (variant × adapter) of an experiment in [since, until): n = rows; n_feedback = rows with '
  'explicit feedback; feedback_mean/var/se over those, CI = mean ± t(1-α/2, n_feedback-1)·se; '
  'thumbs_up_rate = thumbs up / n_feedback with a Wilson interval; regen_rate, edit_rate = share of '
  'all rows; ttft_* over rows with a ttft (percentile_cont); tokens_out_*; first_at/last_at.';

-- Time series per hour or day, for plots.
CREATE OR REPLACE FUNCTION obs.experiment_series(p_experiment text,
                                                 p_since timestamptz DEFAULT now() - interval '7 days',
                                                 p_until timestamptz DEFAULT now(),
                                                 p_bucket text DEFAULT 'hour',
                                                 p_alpha float8 DEFAULT 0.05)
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
    FROM obs.experiment_agg(p_experiment, p_since, p_until, p_bucket, p_alpha) a;
END
$$;
COMMENT ON FUNCTION obs.experiment_series(text, timestamptz, timestamptz, text, float8) IS
  'experiment_arms per hour or day (bucket_at = date_trunc(bucket, created_at)), for plots.';

-- Canary versus prod: one row per canary arm and metric.
CREATE OR REPLACE FUNCTION obs.experiment_compare(p_experiment text,
                                                  p_since timestamptz DEFAULT now() - interval '7 days',
                                                  p_until timestamptz DEFAULT now(),
                                                  p_alpha float8 DEFAULT 0.05,
                                                  p_power float8 DEFAULT 0.8,
                                                  p_mde_mean float8 DEFAULT 0.1,
                                                  p_mde_rate float8 DEFAULT 0.05)
RETURNS TABLE (experiment text, metric text, test text, higher_is_better boolean,
               control_variant text, control_adapter text, canary_variant text, canary_adapter text,
               n_control bigint, n_canary bigint, control_value float8, canary_value float8,
               diff float8, diff_ci_low float8, diff_ci_high float8, statistic float8, df float8,
               p_value float8, alpha float8, significant boolean, canary_better boolean,
               mde float8, power float8, n_required_per_arm bigint, n_more_needed bigint)
LANGUAGE sql STABLE AS $$
  WITH arms AS (
    SELECT * FROM obs.experiment_arms(p_experiment, p_since, p_until, p_alpha)
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
COMMENT ON FUNCTION obs.experiment_compare(text, timestamptz, timestamptz, float8, float8, float8, float8) IS
  'Each canary arm (variant <> ''A'') against the control (the ''A'' arm with the most rows), one row '
  'per metric. diff = canary - control. feedback_mean and ttft_avg: Welch''s t-test (statistic = t, '
  'df = Welch-Satterthwaite, CI = diff ± t(1-α/2, df)·se); thumbs_up_rate (of rated rows), '
  'regen_rate and edit_rate (of all rows): two-proportion z-test (pooled se for z, unpooled for the '
  'CI); ttft_p95: no test. The CI level is 1-α, so it excludes 0 exactly when p < α. '
  'canary_better follows higher_is_better. n_required_per_arm detects an effect of mde '
  '(p_mde_mean for means, p_mde_rate for rates, absolute) at α and power; n_more_needed = what the '
  'smaller arm still lacks.';

CREATE OR REPLACE VIEW obs.experiment_arm_7d WITH (security_invoker = true) AS
  SELECT a.*
    FROM obs.experiment e
    CROSS JOIN LATERAL obs.experiment_arms(e.experiment, now() - interval '7 days', now()) a
   WHERE e.last_at > now() - interval '7 days';
COMMENT ON VIEW obs.experiment_arm_7d IS
  'obs.experiment_arms over the last 7 days for every recently active experiment (see that function for columns).';

COMMENT ON COLUMN obs.experiment_arm_7d.experiment IS 'The experiment (obs.experiment.experiment).';
COMMENT ON COLUMN obs.experiment_arm_7d.variant IS
  'The arm''s variant: A = prod (the control), B.. = canaries.';
COMMENT ON COLUMN obs.experiment_arm_7d.adapter_id IS
  'The adapter that served the arm (an arm is variant × adapter).';
COMMENT ON COLUMN obs.experiment_arm_7d.route IS
  'The route logged (the first by name if the arm''s rows carry several).';
COMMENT ON COLUMN obs.experiment_arm_7d.n IS
  'The arm''s rows (logged inferences) in the last 7 days.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_error IS 'Rows with status error.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_feedback IS
  'Rows with explicit feedback (fb_explicit not NULL).';
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_mean IS
  'Mean fb_explicit over rated rows (-1..1).';
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_var IS
  'Sample variance of fb_explicit over rated rows.';
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_se IS
  'Standard error of feedback_mean: sqrt(feedback_var / n_feedback).';
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_ci_low IS
  'Low end of the 95 % interval of feedback_mean (Student''s t, n_feedback - 1 df).';
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_ci_high IS
  'High end of the 95 % interval of feedback_mean.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_thumbs_up IS 'Rows rated 1 (thumbs up).';
COMMENT ON COLUMN obs.experiment_arm_7d.n_thumbs_down IS 'Rows rated -1 (thumbs down).';
COMMENT ON COLUMN obs.experiment_arm_7d.thumbs_up_rate IS
  'n_thumbs_up / n_feedback (neutral ratings count as not up); NULL: none rated.';
COMMENT ON COLUMN obs.experiment_arm_7d.thumbs_up_ci_low IS
  'Low end of the 95 % Wilson interval of thumbs_up_rate.';
COMMENT ON COLUMN obs.experiment_arm_7d.thumbs_up_ci_high IS
  'High end of the 95 % Wilson interval of thumbs_up_rate.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_regen IS 'Rows the user regenerated (fb_regen).';
COMMENT ON COLUMN obs.experiment_arm_7d.regen_rate IS 'n_regen / n.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_edited IS 'Rows the user corrected (fb_edited).';
COMMENT ON COLUMN obs.experiment_arm_7d.edit_rate IS 'n_edited / n.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_ttft IS
  'Rows with a time to first token (ttft_ms not NULL).';
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_avg IS 'Mean time to first token, in ms.';
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_var IS
  'Sample variance of the time to first token, in ms squared.';
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_p50 IS
  'Median time to first token, in ms (percentile_cont).';
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_p95 IS
  '95th percentile of the time to first token, in ms (percentile_cont).';
COMMENT ON COLUMN obs.experiment_arm_7d.tokens_out_avg IS
  'Mean completion tokens per row (of rows with a count).';
COMMENT ON COLUMN obs.experiment_arm_7d.tokens_out_sum IS
  'Completion tokens of all the arm''s rows.';
COMMENT ON COLUMN obs.experiment_arm_7d.first_at IS
  'When the arm''s first row in the window was logged.';
COMMENT ON COLUMN obs.experiment_arm_7d.last_at IS
  'When the arm''s last row in the window was logged.';

CREATE OR REPLACE VIEW obs.experiment_compare_7d WITH (security_invoker = true) AS
  SELECT c.*
    FROM obs.experiment e
    CROSS JOIN LATERAL obs.experiment_compare(e.experiment, now() - interval '7 days', now()) c
   WHERE e.last_at > now() - interval '7 days';
COMMENT ON VIEW obs.experiment_compare_7d IS
  'obs.experiment_compare over the last 7 days (α 0.05, power 0.8) for every recently active experiment.';

COMMENT ON COLUMN obs.experiment_compare_7d.experiment IS
  'The experiment (obs.experiment.experiment).';
COMMENT ON COLUMN obs.experiment_compare_7d.metric IS
  'What is compared: feedback_mean, thumbs_up_rate, regen_rate, edit_rate, ttft_avg or ttft_p95.';
COMMENT ON COLUMN obs.experiment_compare_7d.test IS
  'welch_t (feedback_mean, ttft_avg), two_proportion_z (the rates) or none (ttft_p95).';
COMMENT ON COLUMN obs.experiment_compare_7d.higher_is_better IS
  'True for feedback_mean and thumbs_up_rate; false for the regen, edit and ttft metrics.';
COMMENT ON COLUMN obs.experiment_compare_7d.control_variant IS 'The control arm''s variant (A).';
COMMENT ON COLUMN obs.experiment_compare_7d.control_adapter IS
  'The control arm''s adapter: of the A arms, the one with the most rows.';
COMMENT ON COLUMN obs.experiment_compare_7d.canary_variant IS 'The canary arm''s variant (B..).';
COMMENT ON COLUMN obs.experiment_compare_7d.canary_adapter IS 'The canary arm''s adapter.';
COMMENT ON COLUMN obs.experiment_compare_7d.n_control IS
  'The control''s observations of the metric: rated rows (feedback_mean, '
  'thumbs_up_rate), all rows (regen_rate, edit_rate) or rows with a ttft.';
COMMENT ON COLUMN obs.experiment_compare_7d.n_canary IS
  'The canary''s observations of the metric, counted as n_control.';
COMMENT ON COLUMN obs.experiment_compare_7d.control_value IS
  'The metric on the control arm (ttft metrics in ms).';
COMMENT ON COLUMN obs.experiment_compare_7d.canary_value IS
  'The metric on the canary arm (ttft metrics in ms).';
COMMENT ON COLUMN obs.experiment_compare_7d.diff IS 'canary_value - control_value.';
COMMENT ON COLUMN obs.experiment_compare_7d.diff_ci_low IS
  'Low end of the 95 % interval of diff; NULL: no test, or too few rows.';
COMMENT ON COLUMN obs.experiment_compare_7d.diff_ci_high IS
  'High end of the 95 % interval of diff; NULL: no test, or too few rows.';
COMMENT ON COLUMN obs.experiment_compare_7d.statistic IS
  'Welch''s t, or the pooled two-proportion z; NULL: no test, too few rows or zero standard error.';
COMMENT ON COLUMN obs.experiment_compare_7d.df IS
  'Welch-Satterthwaite degrees of freedom (welch_t only; NULL otherwise).';
COMMENT ON COLUMN obs.experiment_compare_7d.p_value IS
  'Two-sided p-value of the test; NULL: no test or no statistic.';
COMMENT ON COLUMN obs.experiment_compare_7d.alpha IS 'The significance level: 0.05.';
COMMENT ON COLUMN obs.experiment_compare_7d.significant IS
  'p_value < alpha (false when there is no p-value).';
COMMENT ON COLUMN obs.experiment_compare_7d.canary_better IS
  'diff goes the better way (per higher_is_better); NULL: diff 0 or unknown.';
COMMENT ON COLUMN obs.experiment_compare_7d.mde IS
  'The absolute effect the sample size is for: 0.1 for '
  'feedback_mean, 0.05 for the rates; NULL for the ttft metrics.';
COMMENT ON COLUMN obs.experiment_compare_7d.power IS 'The power the sample size is for: 0.8.';
COMMENT ON COLUMN obs.experiment_compare_7d.n_required_per_arm IS
  'Observations each arm needs to detect mde at alpha with that '
  'power; NULL: no mde, or no variance or rate to size from.';
COMMENT ON COLUMN obs.experiment_compare_7d.n_more_needed IS
  'n_required_per_arm minus the smaller of n_control and '
  'n_canary, at least 0 (0 also when n_required_per_arm is NULL).';

GRANT SELECT ON obs.experiment, obs.experiment_arm_7d, obs.experiment_compare_7d
  TO cft_app, cft_release, cft_dashboard;

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

CREATE OR REPLACE FUNCTION loop.canary_verdict(p_cycle bigint)
RETURNS TABLE (decision text, code text, reason text, numbers jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
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
  p := loop.effective_policy(c.route);
  SELECT coalesce(r.experiment, r.name) INTO v_exp FROM serve.route r WHERE r.name = c.route;
  v_prod := serve.current_prod(c.route);
  SELECT to_jsonb(x) INTO m FROM obs.experiment_compare(v_exp, c.canary_started_at, now(), p.decision_alpha) x
   WHERE x.canary_adapter = c.adapter_id AND x.metric = p.decision_metric
   ORDER BY x.n_canary DESC LIMIT 1;
  SELECT to_jsonb(x) INTO g FROM obs.experiment_compare(v_exp, c.canary_started_at, now(), p.decision_alpha) x
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
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
