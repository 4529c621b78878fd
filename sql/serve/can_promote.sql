-- The promotion gate: may `candidate` replace `current` (NULL = the route has no prod yet)?
-- Fails closed: anything missing, failed (NULL/NaN/infinite) or incomparable is a blocker.
-- What is compared comes from train.promotion_policy (a route's row overrides the global one for
-- the same suite and metric): direction says which way is better, tolerance is relative to
-- |current score| (so a current score of 0 allows no regression at all). A result on a suite and
-- metric that no rule names is compared by the default rule (higher is better, 2 % tolerance,
-- not required) unless a rule says direction 'ignore'. The gate never passes on nothing: with a
-- current prod, at least one metric must have been compared (both scores finite, same judge,
-- both by authors the rule trusts).
--
-- Authors (train/eval_author.sql): a required rule is satisfied only by results whose author_role
-- is in the rule's trusted_authors (default evaluator, owner), on both sides of the
-- comparison; anyone else's (a trainer key's) results are shown, named in the blocker, and still
-- compared where a rule is not required, but satisfy nothing. A required judge-scored result
-- (judge_model set) also needs the latest calibration of that judge and rubric version on the
-- suite (train.judge_calibration) with kappa >= the rule's min_judge_kappa (default 0.6).
--
-- Runs as the caller: a caller sees only the adapters, results and policies its role may read, and
-- anything hidden from it counts as missing, which can only make the answer stricter.
--
-- The held-out family: a policy row with suite_id 'heldout:snapshot' means "the held-out split
-- of the CANDIDATE's own dataset snapshot": both the candidate's and the current prod's rows are
-- looked up as 'heldout:<candidate snapshot id>' (the evaluator scores the prod on the
-- candidate's split, so the pair is like for like; scores on different splits are never
-- compared). An adapter with no snapshot has no held-out split: the rule does not apply to it
-- (its task suites still do).

CREATE OR REPLACE FUNCTION serve.promotion_blockers(candidate text, current text)
RETURNS TABLE (suite_id text, metric text, direction text, candidate_score numeric,
               current_score numeric, threshold numeric, reason text,
               candidate_author text, current_author text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_cand text := $1;
  v_cur  text := $2;
  c serve.adapter%ROWTYPE;
  p serve.adapter%ROWTYPE;
BEGIN
  SELECT * INTO c FROM serve.adapter a WHERE a.id = v_cand;
  IF NOT FOUND THEN
    RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::numeric, NULL::numeric,
      NULL::numeric, format('candidate adapter %s does not exist', coalesce(v_cand, 'NULL')), NULL::text, NULL::text;
    RETURN;
  END IF;
  IF v_cur IS NOT NULL THEN
    SELECT * INTO p FROM serve.adapter a WHERE a.id = v_cur;
    IF NOT FOUND THEN
      RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::numeric, NULL::numeric,
        NULL::numeric, format('current adapter %s does not exist', v_cur), NULL::text, NULL::text;
      RETURN;
    END IF;
    IF p.id = c.id THEN
      RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::numeric, NULL::numeric,
        NULL::numeric, 'candidate and current are the same adapter', NULL::text, NULL::text;
      RETURN;
    END IF;
    IF (p.tenant_id, p.route) <> (c.tenant_id, c.route) THEN
      RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::numeric, NULL::numeric,
        NULL::numeric, format('candidate is on route %s, current on route %s', c.route, p.route), NULL::text, NULL::text;
      RETURN;
    END IF;
    IF p.base_model <> c.base_model OR p.base_revision IS DISTINCT FROM c.base_revision THEN
      RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::numeric, NULL::numeric,
        NULL::numeric, format('candidate is built on %s%s, current on %s%s: not comparable',
          c.base_model, coalesce('@' || c.base_revision, ''),
          p.base_model, coalesce('@' || p.base_revision, '')), NULL::text, NULL::text;
      RETURN;
    END IF;
  END IF;
  IF c.status IN ('training', 'failed') THEN
    RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::numeric, NULL::numeric,
      NULL::numeric, format('candidate status is %s', c.status), NULL::text, NULL::text;
  END IF;
  IF c.tainted_at IS NOT NULL THEN
    RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::numeric, NULL::numeric,
      NULL::numeric, format('candidate is tainted: %s', coalesce(c.tainted_reason, 'no reason given')), NULL::text, NULL::text;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM train.eval_result r WHERE r.adapter_id = c.id) THEN
    RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::numeric, NULL::numeric,
      NULL::numeric, 'candidate has no eval results', NULL::text, NULL::text;
  END IF;

  RETURN QUERY
  WITH ruled AS (
    SELECT DISTINCT ON (pp.suite_id, pp.metric)
           pp.suite_id, pp.metric, pp.direction, pp.tolerance, pp.required, pp.trusted_authors,
           pp.min_judge_kappa
      FROM train.promotion_policy pp
     WHERE (pp.tenant_id = c.tenant_id AND pp.route = c.route) OR pp.route IS NULL
     ORDER BY pp.suite_id, pp.metric, pp.route NULLS LAST
  ), pol AS (
    SELECT q.metric, q.direction, q.tolerance, q.required, false AS by_default,
           q.trusted_authors AS trusted, q.min_judge_kappa AS min_kappa,
           CASE WHEN q.suite_id = 'heldout:snapshot' THEN 'heldout:' || c.dataset_snapshot_id::text
                ELSE q.suite_id END AS suite_id
      FROM ruled q
     WHERE q.direction <> 'ignore'
       AND NOT (q.suite_id = 'heldout:snapshot' AND c.dataset_snapshot_id IS NULL)
    UNION ALL
    -- The candidate's results that no rule names: the default rule (never required, so no
    -- judge calibration is asked for; its comparison counts only between trusted authors).
    SELECT DISTINCT r.metric, 'higher', 0.02, false, true, train.default_trusted_authors(),
           NULL::numeric, r.suite_id
      FROM train.eval_result r
     WHERE r.adapter_id = c.id
       AND NOT EXISTS (SELECT 1 FROM ruled q
                        WHERE q.metric = r.metric
                          AND (q.suite_id = r.suite_id
                               OR (q.suite_id = 'heldout:snapshot' AND r.suite_id LIKE 'heldout:%')))
  ), cmp AS (
    SELECT pol.*,
           cr.adapter_id IS NOT NULL AS c_has, cr.score AS cs, cr.judge_model AS cj,
           cr.rubric_version AS cv, cr.author AS ca, cr.author_role = ANY (pol.trusted) AS c_trust,
           pr.adapter_id IS NOT NULL AS p_has, pr.score AS ps, pr.judge_model AS pj,
           pr.rubric_version AS pv, pr.author AS pa, pr.author_role = ANY (pol.trusted) AS p_trust,
           cal.id AS cal_id, cal.kappa AS kappa
      FROM pol
      -- Results are facts with authors: the one that counts is the newest by an author the
      -- rule trusts, else the newest (train.counted_result).
      LEFT JOIN LATERAL train.counted_result(c.id, pol.suite_id, pol.metric, pol.trusted) cr ON true
      LEFT JOIN LATERAL train.counted_result(v_cur, pol.suite_id, pol.metric, pol.trusted) pr ON true
      -- The judge's latest calibration on this suite with this rubric.
      LEFT JOIN LATERAL (
        SELECT jc.id, jc.kappa FROM train.judge_calibration jc
         WHERE jc.tenant_id = c.tenant_id AND jc.suite_id = pol.suite_id
           AND jc.judge_model = cr.judge_model
           AND jc.rubric_version = cr.rubric_version
         ORDER BY jc.calibrated_at DESC, jc.id DESC LIMIT 1) cal ON true
  ), lim AS (
    SELECT cmp.*,
           (cs IS NOT NULL AND cs NOT IN ('NaN', 'Infinity', '-Infinity')) AS c_ok,
           (ps IS NOT NULL AND ps NOT IN ('NaN', 'Infinity', '-Infinity')) AS p_ok
      FROM cmp
  ), judged AS (
    SELECT lim.*,
           CASE WHEN p_ok THEN
             CASE direction WHEN 'higher' THEN ps - tolerance * abs(ps)
                            ELSE ps + tolerance * abs(ps) END
           END AS thr
      FROM lim
  ), verdict AS (
    SELECT judged.*,
      CASE
        WHEN required AND NOT c_has THEN 'candidate has no result for this required metric'
        WHEN NOT c_has AND p_has THEN 'candidate lacks a policy metric the current adapter has'
        WHEN NOT c_has THEN NULL
        WHEN NOT c_ok THEN 'candidate score is not a finite number (failed evaluation)'
        WHEN required AND NOT c_trust
          THEN format('candidate result is by %s, whom this rule does not trust (trusted: %s):'
                      ' it does not satisfy a required rule', ca, array_to_string(trusted, ', '))
        WHEN p_has AND p_ok AND cj IS DISTINCT FROM pj
          THEN format('judged by different models (%s vs %s): not comparable',
                      coalesce(cj, 'none'), coalesce(pj, 'none'))
        WHEN p_has AND p_ok AND cv IS DISTINCT FROM pv
          THEN format('judged with different rubrics (%s vs %s): not comparable',
                      coalesce(cv, 'none'), coalesce(pv, 'none'))
        WHEN required AND cj IS NOT NULL AND cal_id IS NULL
          THEN format('judge %s (rubric %s) has no calibration on suite %s: a required'
                      ' judge-scored metric needs one (cft worker eval --calibrate %s)',
                      cj, coalesce(cv, 'unknown'), suite_id, suite_id)
        WHEN required AND cj IS NOT NULL AND (kappa IS NULL OR kappa < min_kappa)
          THEN format('judge %s (rubric %s) agrees too little with people on suite %s:'
                      ' kappa %s < %s (min_judge_kappa)', cj, coalesce(cv, 'unknown'), suite_id,
                      coalesce(trim_scale(round(kappa, 3))::text, 'undefined'), min_kappa)
        WHEN v_cur IS NULL THEN NULL
        WHEN NOT p_has AND required
          THEN 'current adapter has no result for this required metric: evaluate it on the same suite'
        WHEN NOT p_has THEN NULL
        WHEN NOT p_ok THEN 'current score is not a finite number: not comparable'
        WHEN required AND NOT p_trust
          THEN format('current adapter''s result is by %s, whom this rule does not trust'
                      ' (trusted: %s): not comparable (have the evaluator score it)', pa,
                      array_to_string(trusted, ', '))
        WHEN direction = 'higher' AND cs < thr
          THEN format('regression: %s < %s (higher is better, tolerance %s%s)', cs, thr, tolerance,
                      CASE WHEN by_default THEN '; default rule: no policy names this metric' ELSE '' END)
        WHEN direction = 'lower' AND cs > thr
          THEN format('regression: %s > %s (lower is better, tolerance %s)', cs, thr, tolerance)
      END AS why
      FROM judged
  )
  SELECT v.suite_id, v.metric, v.direction, v.cs, v.ps, v.thr, v.why, v.ca, v.pa
    FROM verdict v WHERE v.why IS NOT NULL
  UNION ALL
  SELECT NULL, NULL, NULL, NULL, NULL, NULL,
         format('nothing compared: no metric of %s was compared with the current prod %s'
                ' (evaluate both on a common suite)', c.id, v_cur),
         NULL, NULL
   WHERE v_cur IS NOT NULL
     AND NOT EXISTS (SELECT 1 FROM verdict v
                      WHERE v.c_ok AND v.p_ok AND v.c_trust AND v.p_trust
                        AND v.cj IS NOT DISTINCT FROM v.pj AND v.cv IS NOT DISTINCT FROM v.pv)
   ORDER BY 1, 2;
END
$$;
COMMENT ON FUNCTION serve.promotion_blockers(text, text) IS
  'Why candidate may not replace current (NULL = no prod yet): one row per blocker, none = allowed.';

-- The gate as a yes or no; true only when there is no blocker at all.
CREATE OR REPLACE FUNCTION serve.can_promote(candidate text, current text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
  SELECT NOT EXISTS (SELECT 1 FROM serve.promotion_blockers($1, $2))
$$;
COMMENT ON FUNCTION serve.can_promote(text, text) IS
  'Fail-closed promotion gate: may candidate replace current (NULL = no prod yet)? See promotion_blockers.';
