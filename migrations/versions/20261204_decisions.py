"""Decisions you can trust: sequential decisions and guard metrics (issue 21, items 1-3).

The experiment policy decides by the normal-mixture mSPRT (always valid under continuous
monitoring): stats.msprt, stats.rate_var; obs.arm_sample, obs.sample_arm and
obs.sequential_compare; serve.experiment_policy_of, serve.guard_verdicts, serve.guard_text,
serve.canary_decision(route) and serve.watch_decision(route, window);
serve.experiment_autopolicy acts on them (watch rollback first, then canaries).
serve.experiment_policy: guard_regen (boolean) gives way to guard margins (regen, thumbs-down,
error/partial, tokens_out; max_ttft_p95_increase stays the ttft guard), a budget (max_n_per_arm,
max_duration), mixture_sd and watch_window.

Revision ID: 20261204
Revises: 20261203
"""

from alembic import op

revision = "20261204"
down_revision = "20261203"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
ALTER TABLE serve.experiment_policy DROP COLUMN guard_regen;
ALTER TABLE serve.experiment_policy
  ADD COLUMN mixture_sd float8 CHECK (mixture_sd > 0),
  ADD COLUMN max_n_per_arm bigint CHECK (max_n_per_arm >= 2),
  ADD COLUMN max_duration interval DEFAULT '14 days' CHECK (max_duration > interval '0'),
  ADD COLUMN guard_regen_margin float8 DEFAULT 0.02 CHECK (guard_regen_margin >= 0),
  ADD COLUMN guard_thumbs_down_margin float8 DEFAULT 0.02 CHECK (guard_thumbs_down_margin >= 0),
  ADD COLUMN guard_error_margin float8 DEFAULT 0.01 CHECK (guard_error_margin >= 0),
  ADD COLUMN guard_tokens_out_margin float8 DEFAULT 0.25 CHECK (guard_tokens_out_margin >= 0),
  ADD COLUMN watch_window interval NOT NULL DEFAULT '3 days' CHECK (watch_window > interval '0');
COMMENT ON COLUMN serve.experiment_policy.enabled IS 'Off by default: nothing happens until it is true.';
COMMENT ON COLUMN serve.experiment_policy.metric IS
  'The primary metric: its always-valid test (obs.sequential_compare) decides promote or retire.';
COMMENT ON COLUMN serve.experiment_policy.alpha IS
  'Error bound of every automatic decision: the always-valid (mSPRT) test acts when its p-value '
  '<= alpha, which keeps the false-positive rate <= alpha however often the policy checks.';
COMMENT ON COLUMN serve.experiment_policy.min_n IS
  'Floor: no decision before both arms have this sample, in the metric''s unit (rated rows for '
  'feedback metrics, rows otherwise); it keeps the plug-in variances of the test honest.';
COMMENT ON COLUMN serve.experiment_policy.window_size IS
  'Window of the fixed-horizon numbers shown with a decision (obs.experiment_compare), for '
  'reading only: the decision itself uses all the canary''s traffic since its first row.';
COMMENT ON COLUMN serve.experiment_policy.max_ttft_p95_increase IS
  'Guard: the canary''s ttft p95 may exceed prod''s by at most this share (default 10 %); tripped '
  'when its share of rows above prod p95 x (1 + this) is significantly above 5 % (NULL = guard off).';
COMMENT ON COLUMN serve.experiment_policy.rollback_enabled IS
  'Retire a canary that loses, breaks a guard or runs out of budget, and roll back a new prod '
  'that breaks a guard during watch_window (serve.rollback); off = record the decision only.';
COMMENT ON COLUMN serve.experiment_policy.mixture_sd IS
  'tau of the primary metric''s mSPRT: the effect size the test is tuned for (NULL = 0.05 for '
  'rates, 0.1 for feedback_mean). Fixed before the data; any value keeps the error bound.';
COMMENT ON COLUMN serve.experiment_policy.max_n_per_arm IS
  'Sample budget: a canary undecided once both arms have this many (metric unit) is retired '
  '(NULL = no sample budget).';
COMMENT ON COLUMN serve.experiment_policy.max_duration IS
  'Time budget: a canary undecided this long after its first row is retired (default 14 days; '
  'NULL = none).';
COMMENT ON COLUMN serve.experiment_policy.guard_regen_margin IS
  'Guard: regeneration rate may rise by at most this (absolute, default 2 points; NULL = off).';
COMMENT ON COLUMN serve.experiment_policy.guard_thumbs_down_margin IS
  'Guard: thumbs-down rate of rated rows may rise by at most this (default 2 points; NULL = off).';
COMMENT ON COLUMN serve.experiment_policy.guard_error_margin IS
  'Guard: share of rows with status error or partial may rise by at most this (default 1 point; '
  'NULL = off).';
COMMENT ON COLUMN serve.experiment_policy.guard_tokens_out_margin IS
  'Guard: mean answer length (tokens_out) may change by at most this share of prod''s, either '
  'way (default 25 %; NULL = off).';
COMMENT ON COLUMN serve.experiment_policy.watch_window IS
  'After a promotion, serve.watch_decision compares the new prod with the prod it replaced on '
  'the guards for this long (the previous prod''s baseline: the same length before promotion).';
COMMENT ON COLUMN serve.experiment_decision.action IS
  'promote (became prod through the gate), rollback (canary retired), hold (not yet), blocked (the gate refused).';
COMMENT ON COLUMN serve.experiment_decision.code IS
  'Why, as a stable code: promoted, significantly_worse, budget_exhausted, guard_<guard> (regen, '
  'thumbs_down, error, tokens_out, ttft_p95), insufficient_sample, not_significant, gate_refused, '
  'no_control, control_not_prod; after a promotion watch_<code> of serve.watch_decision '
  '(watch_guard_<guard> = rolled back), rollback_refused.';
COMMENT ON COLUMN serve.experiment_decision.numbers IS
  'The numbers of serve.canary_decision / serve.watch_decision: the primary metric''s always-valid '
  'test, every guard with its margin, the sequential comparisons, the fixed-horizon row (reading '
  'only) and the policy.';
-- Always-valid inference: the mixture sequential probability ratio test (mSPRT) with a normal
-- mixing distribution, on the normal approximation of a difference of means (Johari, Pekelis &
-- Walsh 2017, "Always valid inference: continuous monitoring of A/B tests"; Robbins 1970; the
-- form Optimizely's Stats Engine uses).
--
-- Why this one: the estimate diff = mean(canary) - mean(control) with variance V is, in the
-- information time 1/V, a Brownian motion with drift theta. Mixing the likelihood ratio over
-- theta ~ N(0, tau^2) gives a closed form,
--     Lambda = sqrt(V / (V + tau^2)) * exp(tau^2 * diff^2 / (2 V (V + tau^2))),
-- a nonnegative martingale under theta = 0, so by Ville's inequality
-- P(Lambda ever reaches 1/alpha) <= alpha: checked after every row or every hour, stopped at any
-- time, the false-positive rate stays <= alpha. It needs only the sufficient statistics the
-- experiment views already have (n, mean, variance per arm), so one SQL expression decides, a
-- dashboard reproduces it with psql, and inverting it gives a confidence sequence with the same
-- guarantee. Against the alternative, the asymptotic confidence sequence of Waudby-Smith et al.
-- 2024, it is the same boundary shape (Howard et al. 2021's normal mixture) for the same
-- sufficient statistics; the mSPRT's tau is the effect size the test is tuned for (the policy's
-- mixture_sd), which reads more naturally to an experimenter than an intrinsic time rho.
-- The guarantee is asymptotic in the usual way: variances are estimated (plug-in) and the
-- allocation between arms is taken as constant; the policy's min_n keeps the plug-in honest, and
-- bench/sequential.py measures the false-positive rate at the policy's settings.
--
-- p_value = min(1, 1/Lambda) is an anytime-valid p-value: at any stopping time T,
-- P(p_T <= alpha) <= alpha (its running minimum is too). The interval
-- diff +/- sqrt(V (V + tau^2) / tau^2 * (2 ln(1/alpha) + ln((V + tau^2) / V)))
-- is the set of theta the test at alpha does not reject: it covers theta at all times at once with
-- probability >= 1 - alpha, so each of its bounds alone errs with probability <= alpha (a
-- one-sided test of a margin, theta <= m against theta > m, rejects when ci_low > m).

-- The two-sided normal-mixture mSPRT of theta = 0 for an estimate diff with variance var.
CREATE OR REPLACE FUNCTION stats.msprt(diff float8, var float8, tau float8, alpha float8,
                                       OUT log_lr float8, OUT p_value float8,
                                       OUT ci_low float8, OUT ci_high float8)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  WITH q AS (
    SELECT diff AS d, var AS v, tau * tau AS t2
     WHERE diff IS NOT NULL AND var > 0 AND tau > 0 AND alpha > 0 AND alpha < 1
  ), r AS (
    SELECT q.*,
           0.5 * ln(q.v / (q.v + q.t2)) + q.t2 * q.d * q.d / (2 * q.v * (q.v + q.t2)) AS llr,
           sqrt(q.v * (q.v + q.t2) / q.t2 * (2 * ln(1 / alpha) + ln((q.v + q.t2) / q.v))) AS radius
      FROM q
  )
  SELECT r.llr, least(1.0, exp(-least(r.llr, 700))), r.d - r.radius, r.d + r.radius FROM r
$$;
COMMENT ON FUNCTION stats.msprt(float8, float8, float8, float8) IS
  'Normal-mixture mSPRT (Johari et al. 2017) of theta = 0 for an estimate diff with variance var '
  'and mixing sd tau: log likelihood ratio, anytime-valid p-value min(1, 1/Lambda), and the '
  'always-valid 1-alpha confidence sequence [ci_low, ci_high] (valid under continuous monitoring).';

-- Per-observation variance of a rate for the test: p~ = (x + 0.5) / (n + 1), so a rate of 0 or 1
-- at small n does not claim zero variance (and infinite evidence).
CREATE OR REPLACE FUNCTION stats.rate_var(x bigint, n bigint) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN n > 0 THEN ((x + 0.5) / (n + 1.0) * (1 - (x + 0.5) / (n + 1.0)))::float8 END
$$;
-- Always-valid comparisons of two samples of traffic (an experiment's canary arm against its
-- control arm, or a new prod against the prod it replaced), metric by metric, with the
-- normal-mixture mSPRT of stats/sequential.sql. The decisions (serve.canary_decision,
-- serve.watch_decision) are built on these rows; obs.experiment_compare keeps the fixed-horizon
-- numbers for reading.
-- Every function runs as its caller: the API role (cft_app) sees only its tenant's rows.

-- The sufficient statistics of one sample of traffic.
CREATE TYPE obs.arm_sample AS (
  adapter_id      text,
  since           timestamptz,
  until           timestamptz,
  first_at        timestamptz,
  last_at         timestamptz,
  n               bigint,
  n_feedback      bigint,
  feedback_mean   float8,
  feedback_var    float8,
  n_thumbs_up     bigint,
  n_thumbs_down   bigint,
  n_regen         bigint,
  n_edited        bigint,
  n_bad           bigint,
  n_tokens        bigint,
  tokens_out_avg  float8,
  tokens_out_var  float8,
  n_ttft          bigint,
  ttft_p95        float8,
  ttft_threshold  float8,
  n_ttft_over     bigint
);
COMMENT ON TYPE obs.arm_sample IS
  'Sufficient statistics of one adapter''s traffic in [since, until): rows, feedback (rated rows), '
  'thumbs, regenerations, edits, n_bad (status error or partial), tokens_out, ttft p95 and the '
  'rows whose ttft exceeds ttft_threshold.';

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
         count(*) FILTER (WHERE l.ttft_ms > p_ttft_threshold)
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
  'rows; regen_rate, edit_rate, error_rate (error or partial) of all rows; tokens_out_avg; ttft_p95 '
  'as the canary''s share above the threshold minus 5 %): diff = canary - control, the mSPRT''s '
  'anytime-valid p-value and always-valid 1-alpha confidence sequence [ci_low, ci_high] '
  '(stats.msprt); significant = p_value <= alpha; canary_better follows higher_is_better.';
-- Decisions you can trust (DESIGN invariant 10): what to do with a route's canaries, and with a
-- newly promoted prod, from live traffic, by tests whose error bound holds however often they are
-- checked (the normal-mixture mSPRT, stats/sequential.sql) and never past a guard.
--   serve.canary_decision(route): per canary vs prod, promote / retire / continue;
--   serve.watch_decision(route):  the current prod vs the prod it replaced, since its promotion,
--                                 rollback / keep / continue.
-- Both only read and return the numbers behind the decision (jsonb); serve.experiment_autopolicy
-- (and the autonomous loop) act on them. They run as the caller.

-- The route's experiment policy, or a row of the table's defaults when the route has none (the
-- defaults are read from the catalog, so they are stated once, in serve/experiment_policy.sql).
CREATE OR REPLACE FUNCTION serve.experiment_policy_of(p_route text)
RETURNS serve.experiment_policy LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public AS $$
DECLARE
  pol    serve.experiment_policy;
  v_defs jsonb := '{}';
  v_val  jsonb;
  a      record;
BEGIN
  SELECT * INTO pol FROM serve.experiment_policy p WHERE p.route = p_route;
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
    'route', p_route, 'enabled', false,
    'tenant_id', (SELECT r.tenant_id FROM serve.route r WHERE r.name = p_route)));
END
$$;
COMMENT ON FUNCTION serve.experiment_policy_of(text) IS
  'The route''s serve.experiment_policy row, or one of the column defaults (enabled = false).';

-- The guards of a policy on obs.sequential_compare rows (a jsonb array). A guard is tripped when
-- the canary is significantly worse than its margin (the always-valid interval's bound past the
-- margin: each side errs with probability <= alpha under continuous monitoring), and holds when
-- it is significantly within it. Rates (regen, thumbs_down, error): margin absolute, lower is
-- better; tokens_out: margin a share of the control's mean, either way; ttft_p95: the canary's
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
           coalesce(CASE WHEN v.guard = 'tokens_out' THEN v.lo > v.bound OR v.hi < -v.bound
                         ELSE v.lo > v.bound END, false) AS tripped,
           coalesce(CASE WHEN v.guard = 'tokens_out' THEN v.lo > -v.bound AND v.hi < v.bound
                         ELSE v.hi < v.bound END, false) AS holds
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
                WHEN t.name = 'tokens_out' THEN format('±%s (%s %% of prod)',
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

-- The watch after a promotion: the route's current prod, since its promoted_at, against the prod
-- it replaced (serve.adapter.previous_prod_id) over the same length of time before the promotion,
-- on the policy's guards, until p_window (default the policy's watch_window) has passed:
--   rollback  a guard is broken (significantly worse than its margin, always valid);
--   keep      every guard holds significantly, or the window passed with none broken, or there
--             is nothing to watch (no_prod, no_previous_prod);
--   continue  otherwise (insufficient_sample below min_n, watching).
-- The baseline is historical (the old prod cannot serve beside the new one), so a change of
-- traffic at the promotion is attributed to the adapter. numbers.restorable says whether
-- serve.rollback(route, reason) can restore the previous prod. Reads only.
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
CREATE OR REPLACE FUNCTION serve.experiment_autopolicy(p_route text)
RETURNS SETOF serve.experiment_decision
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, public AS $$
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
  SELECT * INTO pol FROM serve.experiment_policy p WHERE p.route = p_route;
  IF NOT FOUND OR NOT pol.enabled THEN
    RETURN;
  END IF;
  SELECT * INTO v_rt FROM serve.route r WHERE r.name = p_route;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  v_exp := coalesce(v_rt.experiment, v_rt.name);

  -- The watch of a newly promoted prod comes first: a rollback changes what canaries compete with.
  FOR w IN SELECT * FROM serve.watch_decision(p_route) LOOP
    CONTINUE WHEN w.code IN ('no_prod', 'no_previous_prod');
    v_action := 'hold';
    v_code := 'watch_' || w.code;
    v_reason := 'watch: ' || w.reason;
    IF w.decision = 'rollback' THEN
      IF pol.rollback_enabled THEN
        BEGIN
          PERFORM serve.rollback(p_route, 'auto-policy ' || v_reason);
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

  FOR cd IN SELECT * FROM serve.canary_decision(p_route) LOOP
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
COMMENT ON FUNCTION serve.experiment_autopolicy(text) IS
  'Apply the route''s enabled serve.experiment_policy now: roll back a newly promoted prod that '
  'breaks a guard (serve.watch_decision), then per canary act on serve.canary_decision (promote '
  'through the gate; retire on significantly_worse, guard_*, budget_exhausted). Always-valid '
  'tests: checking as often as you like keeps the error bound. Returns the decisions (id NULL = '
  'same as the last recorded one, not stored again).';

-- Every route with an enabled policy, for the worker.
CREATE OR REPLACE FUNCTION serve.experiment_policy_routes() RETURNS SETOF text
LANGUAGE sql STABLE AS $$
  SELECT p.route FROM serve.experiment_policy p WHERE p.enabled ORDER BY p.route
$$;
"""

DOWNGRADE_SQL = r"""
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
DROP FUNCTION serve.watch_decision(text, interval);
DROP FUNCTION serve.canary_decision(text);
DROP FUNCTION serve.guard_text(jsonb);
DROP FUNCTION serve.guard_verdicts(jsonb, serve.experiment_policy);
DROP FUNCTION serve.experiment_policy_of(text);
DROP FUNCTION obs.sequential_compare(obs.arm_sample, obs.arm_sample, float8, float8, float8);
DROP FUNCTION obs.sample_arm(int, text, timestamptz, timestamptz, text, text, boolean, float8);
DROP TYPE obs.arm_sample;
DROP FUNCTION stats.rate_var(bigint, bigint);
DROP FUNCTION stats.msprt(float8, float8, float8, float8);
ALTER TABLE serve.experiment_policy
  DROP COLUMN mixture_sd, DROP COLUMN max_n_per_arm, DROP COLUMN max_duration,
  DROP COLUMN guard_regen_margin, DROP COLUMN guard_thumbs_down_margin,
  DROP COLUMN guard_error_margin, DROP COLUMN guard_tokens_out_margin, DROP COLUMN watch_window;
ALTER TABLE serve.experiment_policy ADD COLUMN guard_regen boolean NOT NULL DEFAULT true;
COMMENT ON COLUMN serve.experiment_policy.enabled IS 'Off by default: nothing happens until it is true.';
COMMENT ON COLUMN serve.experiment_policy.metric IS 'The metric of obs.experiment_compare that decides.';
COMMENT ON COLUMN serve.experiment_policy.alpha IS 'Significance level: act only when p < alpha.';
COMMENT ON COLUMN serve.experiment_policy.min_n IS
  'Minimum sample per arm, in the metric''s unit (rated rows for feedback metrics, rows otherwise).';
COMMENT ON COLUMN serve.experiment_policy.window_size IS 'Traffic window the decision looks at.';
COMMENT ON COLUMN serve.experiment_policy.guard_regen IS
  'Never promote a canary whose regeneration rate is significantly higher than prod''s.';
COMMENT ON COLUMN serve.experiment_policy.max_ttft_p95_increase IS
  'Never promote a canary whose ttft p95 exceeds prod''s by more than this share (NULL = no guard).';
COMMENT ON COLUMN serve.experiment_policy.rollback_enabled IS
  'Retire a canary that is significantly worse on the metric (or on regeneration).';
COMMENT ON COLUMN serve.experiment_decision.action IS
  'promote (became prod through the gate), rollback (canary retired), hold (not yet), blocked (the gate refused).';
COMMENT ON COLUMN serve.experiment_decision.code IS
  'Why, as a stable code: promoted, rolled_back, insufficient_sample, not_significant, guard_regen, '
  'guard_ttft_p95, gate_refused, no_control, control_not_prod.';
COMMENT ON COLUMN serve.experiment_decision.numbers IS
  'The obs.experiment_compare rows (metric and guards) the decision was taken on.';
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
