-- Always-valid comparisons of two samples of traffic (an experiment's canary arm against its
-- control arm, or a new prod against the prod it replaced), metric by metric, with the
-- normal-mixture mSPRT of stats/sequential.sql. The decisions (serve.canary_decision,
-- serve.watch_decision) are built on these rows; obs.experiment_compare keeps the fixed-horizon
-- numbers for reading.
-- Every function runs as its caller: the API role (cft_app) sees only its tenant's rows.

COMMENT ON TYPE obs.arm_sample IS
  'Sufficient statistics of one adapter''s traffic in [since, until): rows, feedback (rated rows), '
  'thumbs, regenerations, edits, n_bad (status error or partial), tokens_out, ttft p95 and the '
  'rows whose ttft exceeds ttft_threshold.';

COMMENT ON COLUMN obs.arm_sample.adapter_id IS 'The adapter whose rows were sampled.';
COMMENT ON COLUMN obs.arm_sample.since IS 'Start of the window (inclusive).';
COMMENT ON COLUMN obs.arm_sample.until IS 'End of the window (exclusive).';
COMMENT ON COLUMN obs.arm_sample.first_at IS
  'When the sample''s first row was logged; NULL: no rows.';
COMMENT ON COLUMN obs.arm_sample.last_at IS
  'When the sample''s last row was logged; NULL: no rows.';
COMMENT ON COLUMN obs.arm_sample.n IS 'Rows in the sample.';
COMMENT ON COLUMN obs.arm_sample.n_feedback IS
  'Rows with explicit feedback (fb_explicit not NULL).';
COMMENT ON COLUMN obs.arm_sample.feedback_mean IS 'Mean fb_explicit over those rows (-1..1).';
COMMENT ON COLUMN obs.arm_sample.feedback_var IS 'Sample variance of fb_explicit over those rows.';
COMMENT ON COLUMN obs.arm_sample.n_thumbs_up IS 'Rows rated 1 (thumbs up).';
COMMENT ON COLUMN obs.arm_sample.n_thumbs_down IS 'Rows rated -1 (thumbs down).';
COMMENT ON COLUMN obs.arm_sample.n_regen IS 'Rows the user regenerated (fb_regen).';
COMMENT ON COLUMN obs.arm_sample.n_edited IS 'Rows the user corrected (fb_edited).';
COMMENT ON COLUMN obs.arm_sample.n_bad IS 'Rows with status error or partial.';
COMMENT ON COLUMN obs.arm_sample.n_tokens IS
  'Rows with a completion token count (tokens_out not NULL).';
COMMENT ON COLUMN obs.arm_sample.tokens_out_avg IS 'Mean completion tokens over those rows.';
COMMENT ON COLUMN obs.arm_sample.tokens_out_var IS
  'Sample variance of completion tokens over those rows.';
COMMENT ON COLUMN obs.arm_sample.n_ttft IS 'Rows with a time to first token (ttft_ms not NULL).';
COMMENT ON COLUMN obs.arm_sample.ttft_p95 IS
  '95th percentile of the time to first token, in ms (percentile_cont).';
COMMENT ON COLUMN obs.arm_sample.ttft_threshold IS
  'The time to first token the sample counts rows above, '
  'in ms (the sampler''s p_ttft_threshold); NULL: none.';
COMMENT ON COLUMN obs.arm_sample.n_ttft_over IS
  'Rows slower than ttft_threshold (0 when it is NULL).';
COMMENT ON COLUMN obs.arm_sample.n_responded IS
  'Rows with any feedback: rated (non-zero), regenerated or edited.';
COMMENT ON COLUMN obs.arm_sample.n_accepted IS
  'Rows accepted as they were: rated up, neither regenerated nor edited.';

-- One adapter's rows of a tenant in [since, until); with p_experiment, only that experiment's
-- rows and (p_control) only its control arm (variant A) or only its canary arms; with p_route,
-- only that route's rows. p_ttft_threshold: count the rows slower than it.
CREATE OR REPLACE FUNCTION obs.sample_arm(p_tenant int, p_adapter text, p_since timestamptz,
                                          p_until timestamptz, p_experiment text DEFAULT NULL,
                                          p_route text DEFAULT NULL, p_control boolean DEFAULT NULL,
                                          p_ttft_threshold float8 DEFAULT NULL)
RETURNS obs.arm_sample LANGUAGE sql STABLE AS $$
  SELECT p_adapter, p_since, p_until, min(l.created_at), max(l.created_at),
         count(*),
         count(l.fb_explicit),
         avg(l.fb_explicit)::float8,
         var_samp(l.fb_explicit)::float8,
         count(*) FILTER (WHERE l.fb_explicit = 1),
         count(*) FILTER (WHERE l.fb_explicit = -1),
         count(*) FILTER (WHERE l.fb_regen),
         count(*) FILTER (WHERE l.fb_edited),
         count(*) FILTER (WHERE l.status IN ('error', 'partial')),
         count(l.tokens_out),
         avg(l.tokens_out)::float8,
         var_samp(l.tokens_out)::float8,
         count(l.ttft_ms),
         percentile_cont(0.95) WITHIN GROUP (ORDER BY l.ttft_ms),
         p_ttft_threshold,
         count(*) FILTER (WHERE l.ttft_ms > p_ttft_threshold),
         count(*) FILTER (WHERE coalesce(l.fb_explicit, 0) <> 0 OR l.fb_regen OR l.fb_edited),
         count(*) FILTER (WHERE l.fb_explicit > 0 AND NOT l.fb_regen AND NOT l.fb_edited)
    FROM obs.inference_log l
   WHERE l.tenant_id = p_tenant AND l.adapter_id = p_adapter
     AND l.created_at >= p_since AND l.created_at < p_until
     AND (p_experiment IS NULL OR (l.experiment = p_experiment AND l.variant IS NOT NULL
                                   AND (p_control IS NULL OR (l.variant = 'A') = p_control)))
     AND (p_route IS NULL OR l.route = p_route)
$$;
COMMENT ON FUNCTION obs.sample_arm(int, text, timestamptz, timestamptz, text, text, boolean, float8) IS
  'The obs.arm_sample of one adapter''s rows of a tenant in [since, until), optionally of one '
  'experiment (and its control arm A, or its canary arms) or one route.';

-- Control (c) against canary (k), one row per metric: diff = canary - control, tested by the
-- normal-mixture mSPRT with mixing sd p_tau_rate (rates) or p_tau_mean (feedback_mean;
-- tokens_out_avg uses 10 % of the control's mean). Per-observation variances: var_samp for
-- means, p~(1-p~) with p~ = (x+0.5)/(n+1) for rates. ttft_p95: the share of the canary's rows
-- slower than k.ttft_threshold (the control's p95 times 1 + the allowed increase) against the
-- 5 % it would be if the canary's p95 were at the threshold: diff = share - 0.05, variance under
-- that null 0.05·0.95/n; ci_low > 0 means the canary's p95 is significantly above the threshold.
CREATE OR REPLACE FUNCTION obs.sequential_compare(c obs.arm_sample, k obs.arm_sample,
                                                  p_alpha float8 DEFAULT 0.05,
                                                  p_tau_rate float8 DEFAULT 0.05,
                                                  p_tau_mean float8 DEFAULT 0.1)
RETURNS TABLE (metric text, test text, higher_is_better boolean, n_control bigint,
               n_canary bigint, control_value float8, canary_value float8, diff float8,
               var_diff float8, tau float8, log_lr float8, p_value float8, alpha float8,
               ci_low float8, ci_high float8, significant boolean, canary_better boolean)
LANGUAGE sql STABLE AS $$
  WITH m (metric, test, hib, n_c, n_k, v_c, v_k, d, var_d, tau) AS (
    SELECT x.metric, x.test, x.hib, x.n_c, x.n_k, x.v_c, x.v_k,
           coalesce(x.d, x.v_k - x.v_c), x.var_d, x.tau
      FROM (VALUES
        ('feedback_mean', 'msprt_mean', true, c.n_feedback, k.n_feedback, c.feedback_mean,
         k.feedback_mean, NULL::float8,
         CASE WHEN c.n_feedback >= 2 AND k.n_feedback >= 2
              THEN c.feedback_var / c.n_feedback + k.feedback_var / k.n_feedback END, p_tau_mean),
        ('thumbs_up_rate', 'msprt_rate', true, c.n_feedback, k.n_feedback,
         c.n_thumbs_up::float8 / nullif(c.n_feedback, 0), k.n_thumbs_up::float8 / nullif(k.n_feedback, 0),
         NULL, stats.rate_var(c.n_thumbs_up, c.n_feedback) / nullif(c.n_feedback, 0)
               + stats.rate_var(k.n_thumbs_up, k.n_feedback) / nullif(k.n_feedback, 0), p_tau_rate),
        ('thumbs_down_rate', 'msprt_rate', false, c.n_feedback, k.n_feedback,
         c.n_thumbs_down::float8 / nullif(c.n_feedback, 0), k.n_thumbs_down::float8 / nullif(k.n_feedback, 0),
         NULL, stats.rate_var(c.n_thumbs_down, c.n_feedback) / nullif(c.n_feedback, 0)
               + stats.rate_var(k.n_thumbs_down, k.n_feedback) / nullif(k.n_feedback, 0), p_tau_rate),
        ('acceptance_rate', 'msprt_rate', true, c.n_responded, k.n_responded,
         c.n_accepted::float8 / nullif(c.n_responded, 0), k.n_accepted::float8 / nullif(k.n_responded, 0),
         NULL, stats.rate_var(c.n_accepted, c.n_responded) / nullif(c.n_responded, 0)
               + stats.rate_var(k.n_accepted, k.n_responded) / nullif(k.n_responded, 0), p_tau_rate),
        ('regen_rate', 'msprt_rate', false, c.n, k.n,
         c.n_regen::float8 / nullif(c.n, 0), k.n_regen::float8 / nullif(k.n, 0),
         NULL, stats.rate_var(c.n_regen, c.n) / nullif(c.n, 0)
               + stats.rate_var(k.n_regen, k.n) / nullif(k.n, 0), p_tau_rate),
        ('edit_rate', 'msprt_rate', false, c.n, k.n,
         c.n_edited::float8 / nullif(c.n, 0), k.n_edited::float8 / nullif(k.n, 0),
         NULL, stats.rate_var(c.n_edited, c.n) / nullif(c.n, 0)
               + stats.rate_var(k.n_edited, k.n) / nullif(k.n, 0), p_tau_rate),
        ('error_rate', 'msprt_rate', false, c.n, k.n,
         c.n_bad::float8 / nullif(c.n, 0), k.n_bad::float8 / nullif(k.n, 0),
         NULL, stats.rate_var(c.n_bad, c.n) / nullif(c.n, 0)
               + stats.rate_var(k.n_bad, k.n) / nullif(k.n, 0), p_tau_rate),
        ('tokens_out_avg', 'msprt_mean', false, c.n_tokens, k.n_tokens, c.tokens_out_avg,
         k.tokens_out_avg, NULL,
         CASE WHEN c.n_tokens >= 2 AND k.n_tokens >= 2
              THEN c.tokens_out_var / c.n_tokens + k.tokens_out_var / k.n_tokens END,
         0.1 * abs(c.tokens_out_avg)),
        ('ttft_p95', 'msprt_p95_exceedance', false, c.n_ttft, k.n_ttft, c.ttft_p95, k.ttft_p95,
         CASE WHEN k.ttft_threshold IS NOT NULL AND k.n_ttft > 0
              THEN k.n_ttft_over::float8 / k.n_ttft - 0.05 END,
         CASE WHEN k.ttft_threshold IS NOT NULL AND k.n_ttft > 0 THEN 0.05 * 0.95 / k.n_ttft END,
         p_tau_rate)
      ) AS x(metric, test, hib, n_c, n_k, v_c, v_k, d, var_d, tau)
  )
  SELECT m.metric, m.test, m.hib, m.n_c, m.n_k, m.v_c, m.v_k, m.d, m.var_d, m.tau,
         t.log_lr, t.p_value, p_alpha, t.ci_low, t.ci_high,
         coalesce(t.p_value <= p_alpha, false),
         CASE WHEN m.d IS NULL OR m.d = 0 THEN NULL ELSE (m.d > 0) = m.hib END
    FROM m
    LEFT JOIN LATERAL stats.msprt(m.d, m.var_d, m.tau, p_alpha) t ON true
$$;
COMMENT ON FUNCTION obs.sequential_compare(obs.arm_sample, obs.arm_sample, float8, float8, float8) IS
  'Control against canary per metric (feedback_mean, thumbs_up_rate, thumbs_down_rate of rated '
  'rows; acceptance_rate: accepted of the rows with any feedback; regen_rate, edit_rate, error_rate (error or partial) of all rows; tokens_out_avg; ttft_p95 '
  'as the canary''s share above the threshold minus 5 %): diff = canary - control, the mSPRT''s '
  'anytime-valid p-value and always-valid 1-alpha confidence sequence [ci_low, ci_high] '
  '(stats.msprt); significant = p_value <= alpha; canary_better follows higher_is_better.';
