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
  -- The floors only keep the planner's constant folding safe: in a PL/pgSQL caller the
  -- arguments are known when the plan is made, and ln(0) or a division by zero would be folded
  -- (and raise) before the WHERE could drop the row; a row with var <= 0 is still dropped.
  WITH q AS (
    SELECT diff AS d, greatest(var, 1e-12) AS v, greatest(tau * tau, 1e-12) AS t2,
           least(greatest(alpha, 1e-12), 0.999999) AS a
     WHERE diff IS NOT NULL AND var > 0 AND tau > 0 AND alpha > 0 AND alpha < 1
  ), r AS (
    SELECT q.*,
           0.5 * ln(q.v / (q.v + q.t2)) + q.t2 * q.d * q.d / (2 * q.v * (q.v + q.t2)) AS llr,
           sqrt(q.v * (q.v + q.t2) / q.t2 * (2 * ln(1 / q.a) + ln((q.v + q.t2) / q.v))) AS radius
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
