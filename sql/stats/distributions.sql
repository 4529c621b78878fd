-- Distribution functions for experiment statistics, in plain SQL and PL/pgSQL so a dashboard can
-- reproduce every number with psql. Exact to ~1e-12 against scipy.stats (tested): the Student t
-- CDF goes through the regularised incomplete beta function (Lentz continued fraction), the
-- normal through erfc (PostgreSQL 16+), quantiles through safeguarded Newton steps.
COMMENT ON SCHEMA stats IS 'Distribution functions used by the experiment metrics (obs.experiment_*).';

-- Φ(z), the standard normal CDF.
CREATE OR REPLACE FUNCTION stats.norm_cdf(z float8) RETURNS float8
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT 0.5 * erfc(-z / sqrt(2.0::float8))
$$;

-- Two-sided p-value of a z statistic: P(|Z| >= |z|).
CREATE OR REPLACE FUNCTION stats.norm_pvalue(z float8) RETURNS float8
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT erfc(abs(z) / sqrt(2.0::float8))
$$;

-- Φ⁻¹(p): Acklam's rational approximation refined by one Halley step (full double precision).
CREATE OR REPLACE FUNCTION stats.norm_ppf(p float8) RETURNS float8
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
  a float8[] := ARRAY[-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                      1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00];
  b float8[] := ARRAY[-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                      6.680131188771972e+01, -1.328068155288572e+01];
  c float8[] := ARRAY[-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                      -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00];
  d float8[] := ARRAY[7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                      3.754408661907416e+00];
  q float8;
  r float8;
  x float8;
  e float8;
  u float8;
BEGIN
  IF p <= 0 THEN RETURN '-Infinity'; END IF;
  IF p >= 1 THEN RETURN 'Infinity'; END IF;
  IF p < 0.02425 THEN
    q := sqrt(-2 * ln(p));
    x := (((((c[1]*q + c[2])*q + c[3])*q + c[4])*q + c[5])*q + c[6]) /
         ((((d[1]*q + d[2])*q + d[3])*q + d[4])*q + 1);
  ELSIF p > 1 - 0.02425 THEN
    q := sqrt(-2 * ln(1 - p));
    x := -(((((c[1]*q + c[2])*q + c[3])*q + c[4])*q + c[5])*q + c[6]) /
          ((((d[1]*q + d[2])*q + d[3])*q + d[4])*q + 1);
  ELSE
    q := p - 0.5;
    r := q * q;
    x := (((((a[1]*r + a[2])*r + a[3])*r + a[4])*r + a[5])*r + a[6]) * q /
         (((((b[1]*r + b[2])*r + b[3])*r + b[4])*r + b[5])*r + 1);
  END IF;
  e := 0.5 * erfc(-x / sqrt(2.0::float8)) - p;
  u := e * sqrt(2 * pi()) * exp(x * x / 2);
  RETURN x - u / (1 + x * u / 2);
END
$$;

-- I_x(a, b), the regularised incomplete beta function (Numerical Recipes' betai with a modified
-- Lentz continued fraction; the symmetry I_x(a,b) = 1 - I_{1-x}(b,a) keeps it convergent).
-- y = 1 - x may be given when the caller knows it more precisely than 1 - x can be computed.
CREATE OR REPLACE FUNCTION stats.betainc(a float8, b float8, x float8, y float8 DEFAULT NULL)
RETURNS float8 LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
  tiny constant float8 := 1e-300;
  eps  constant float8 := 1e-16;
  swap boolean;
  aa float8; bb float8; xx float8; yy float8;
  front float8;
  c float8; d float8; f float8; num float8; del float8;
  m int; mm float8;
BEGIN
  IF a IS NULL OR b IS NULL OR x IS NULL OR a <= 0 OR b <= 0 OR x < 0 OR x > 1 THEN
    RETURN NULL;
  END IF;
  y := coalesce(y, 1 - x);
  IF x = 0 THEN RETURN 0; END IF;
  IF x = 1 THEN RETURN 1; END IF;
  swap := x > (a + 1) / (a + b + 2);
  IF swap THEN aa := b; bb := a; xx := y; yy := x; ELSE aa := a; bb := b; xx := x; yy := y; END IF;
  front := exp(lgamma(aa + bb) - lgamma(aa) - lgamma(bb) + aa * ln(xx) + bb * ln(yy)) / aa;
  -- Continued fraction 1/(1+ d1/(1+ d2/(1+ ...))) evaluated by Lentz's method.
  f := 1; c := 1; d := 0;
  FOR i IN 0..20000 LOOP
    m := i / 2;
    mm := m;
    IF i = 0 THEN
      num := 1;
    ELSIF i % 2 = 0 THEN
      num := (mm * (bb - mm) * xx) / ((aa + 2 * mm - 1) * (aa + 2 * mm));
    ELSE
      num := -((aa + mm) * (aa + bb + mm) * xx) / ((aa + 2 * mm) * (aa + 2 * mm + 1));
    END IF;
    d := 1 + num * d;
    IF abs(d) < tiny THEN d := tiny; END IF;
    d := 1 / d;
    c := 1 + num / c;
    IF abs(c) < tiny THEN c := tiny; END IF;
    del := c * d;
    f := f * del;
    IF abs(1 - del) < eps THEN
      EXIT;
    END IF;
  END LOOP;
  -- f now holds 1 + (the fraction); the NR form is front * (f - 1).
  IF swap THEN
    RETURN 1 - front * (f - 1);
  END IF;
  RETURN front * (f - 1);
END
$$;

-- Two-sided p-value of a Student t statistic with df degrees of freedom (df may be fractional,
-- as Welch's is): P(|T| >= |t|) = I_{df/(df+t²)}(df/2, 1/2), the complement given exactly.
CREATE OR REPLACE FUNCTION stats.t_pvalue(t float8, df float8) RETURNS float8
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT CASE
    WHEN df <= 0 OR t = 'NaN' THEN NULL
    WHEN t IN ('Infinity', '-Infinity') THEN 0
    -- Past 1e7 degrees of freedom the t and normal tails differ by < 1e-7, while lgamma of
    -- df/2 starts to cost digits: the normal is then the more exact of the two.
    WHEN df > 1e7 THEN stats.norm_pvalue(t)
    ELSE least(1.0, stats.betainc(df / 2, 0.5, df / (df + t * t), t * t / (df + t * t)))
  END
$$;

-- The Student t CDF.
CREATE OR REPLACE FUNCTION stats.t_cdf(t float8, df float8) RETURNS float8
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT CASE WHEN t > 0 THEN 1 - stats.t_pvalue(t, df) / 2 ELSE stats.t_pvalue(t, df) / 2 END
$$;

-- The Student t density.
CREATE OR REPLACE FUNCTION stats.t_pdf(t float8, df float8) RETURNS float8
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT exp(lgamma((df + 1) / 2) - lgamma(df / 2) - 0.5 * ln(df * pi())
             - (df + 1) / 2 * ln(1 + t * t / df))
$$;

-- The Student t quantile: Newton steps on t_cdf, kept inside a shrinking bracket.
CREATE OR REPLACE FUNCTION stats.t_ppf(p float8, df float8) RETURNS float8
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
  x float8;
  lo float8;
  hi float8;
  fx float8;
  step float8;
BEGIN
  IF df <= 0 OR p < 0 OR p > 1 THEN RETURN NULL; END IF;
  IF p = 0 THEN RETURN '-Infinity'; END IF;
  IF p = 1 THEN RETURN 'Infinity'; END IF;
  IF p = 0.5 THEN RETURN 0; END IF;
  IF p < 0.5 THEN RETURN -stats.t_ppf(1 - p, df); END IF;
  IF df = 1 THEN RETURN tan(pi() * (p - 0.5)); END IF;
  IF df = 2 THEN RETURN (2 * p - 1) / sqrt(2 * p * (1 - p)); END IF;
  x := stats.norm_ppf(p);
  x := x + (x * x * x + x) / (4 * df);  -- Cornish-Fisher start
  lo := 0;
  hi := greatest(2 * x, 1);
  WHILE stats.t_cdf(hi, df) < p LOOP
    lo := hi;
    hi := hi * 2;
  END LOOP;
  FOR i IN 1..200 LOOP
    fx := stats.t_cdf(x, df) - p;
    IF fx > 0 THEN hi := least(hi, x); ELSE lo := greatest(lo, x); END IF;
    step := fx / stats.t_pdf(x, df);
    EXIT WHEN fx = 0 OR abs(step) < 1e-14 * greatest(1, abs(x));
    x := x - step;
    IF x < lo OR x > hi OR step = 'NaN' THEN
      x := (lo + hi) / 2;
    END IF;
    EXIT WHEN hi - lo < 1e-15 * greatest(1, abs(x));
  END LOOP;
  RETURN x;
END
$$;

-- Per-arm sample size to detect a difference of means `mde` with a two-sided test at alpha and
-- the given power, for arms with variances var_a and var_b (normal approximation).
CREATE OR REPLACE FUNCTION stats.sample_size_mean(var_a float8, var_b float8, mde float8,
                                                  alpha float8 DEFAULT 0.05, power float8 DEFAULT 0.8)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN mde IS NULL OR mde = 0 OR var_a IS NULL OR var_b IS NULL THEN NULL
    ELSE ceil(power(stats.norm_ppf(1 - alpha / 2) + stats.norm_ppf(power), 2)
              * (var_a + var_b) / (mde * mde))::bigint END
$$;

-- Per-arm sample size to tell a rate p_a from p_a ± mde (two-sided two-proportion z-test).
-- The effect is taken upwards unless that leaves [0, 1].
CREATE OR REPLACE FUNCTION stats.sample_size_prop(p_a float8, mde float8,
                                                  alpha float8 DEFAULT 0.05, power float8 DEFAULT 0.8)
RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  WITH q AS (
    SELECT p_a AS p1, CASE WHEN p_a + abs(mde) <= 1 THEN p_a + abs(mde) ELSE p_a - abs(mde) END AS p2
  )
  SELECT CASE WHEN p_a IS NULL OR mde IS NULL OR mde = 0 OR p2 < 0 THEN NULL
    ELSE ceil(power(stats.norm_ppf(1 - alpha / 2) * sqrt(2 * ((p1 + p2) / 2) * (1 - (p1 + p2) / 2))
                    + stats.norm_ppf(power) * sqrt(p1 * (1 - p1) + p2 * (1 - p2)), 2)
              / (mde * mde))::bigint END
    FROM q
$$;

-- Wilson score interval of a proportion (behaves at small n and at 0 % or 100 %).
CREATE OR REPLACE FUNCTION stats.wilson(successes bigint, n bigint, alpha float8 DEFAULT 0.05,
                                        OUT low float8, OUT high float8)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  WITH q AS (SELECT successes::float8 / nullif(n, 0) AS p, nullif(n, 0)::float8 AS m, stats.norm_ppf(1 - alpha / 2) AS z
              WHERE n > 0)
  -- m, not n: a constant n = 0 must not be folded into a division at plan time.
  SELECT (p + z * z / (2 * m) - z * sqrt(p * (1 - p) / m + z * z / (4.0 * m * m))) / (1 + z * z / m),
         (p + z * z / (2 * m) + z * sqrt(p * (1 - p) / m + z * z / (4.0 * m * m))) / (1 + z * z / m)
    FROM q
$$;

GRANT USAGE ON SCHEMA stats TO cft_app, cft_release, cft_dashboard;
