-- Experiments seen in traffic, and the last 7 days of their arms and comparisons, for dashboards.
-- security_invoker: the API role (cft_app) sees only its tenant's rows through them.
CREATE OR REPLACE VIEW obs.experiment WITH (security_invoker = true) AS
  SELECT l.experiment,
         l.tenant_id,
         min(l.route) AS route,
         count(*) AS n,
         array_agg(DISTINCT l.variant::text ORDER BY l.variant::text) AS variants,
         array_agg(DISTINCT l.adapter_id ORDER BY l.adapter_id) AS adapters,
         min(l.created_at) AS first_at,
         max(l.created_at) AS last_at,
         EXISTS (SELECT 1 FROM serve.route r
                   JOIN serve.adapter a ON a.tenant_id = r.tenant_id AND a.route = r.name
                  WHERE coalesce(r.experiment, r.name) = l.experiment AND r.tenant_id = l.tenant_id
                    AND a.status = 'canary') AS running
    FROM obs.inference_log l
   WHERE l.experiment IS NOT NULL AND l.variant IS NOT NULL
   GROUP BY l.experiment, l.tenant_id;
COMMENT ON VIEW obs.experiment IS
  'One row per experiment (and tenant) in traffic: rows, variants, adapters, first/last row, and '
  'running = a canary is live on a route whose experiment (or name) it is.';
COMMENT ON COLUMN obs.experiment.experiment IS 'Experiment name as logged (serve.route.experiment, or the route name).';
COMMENT ON COLUMN obs.experiment.n IS 'Logged inferences that carry the experiment and a variant.';
COMMENT ON COLUMN obs.experiment.variants IS 'Variant letters seen: A = prod, B.. = canaries.';
COMMENT ON COLUMN obs.experiment.running IS 'A canary currently serves on the experiment''s route.';
COMMENT ON COLUMN obs.experiment.tenant_id IS 'The tenant whose traffic it is.';
COMMENT ON COLUMN obs.experiment.route IS
  'The route logged (the first by name if several carry the experiment).';
COMMENT ON COLUMN obs.experiment.adapters IS 'Adapters that served its arms.';
COMMENT ON COLUMN obs.experiment.first_at IS 'When its first row was logged.';
COMMENT ON COLUMN obs.experiment.last_at IS 'When its last row was logged.';

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
