"""Eval results with an author, judge calibration (issue 21, items 5 and 7).

train.eval_result gets author_kind / author_role / author_key_id / author, set by a BEFORE
INSERT OR UPDATE trigger from the session (train.current_author: the owner's sessions may act
for an API key, cft.key_id, or as the evaluator, cft.evaluator; anyone else is their SQL role),
and rubric_version. train.promotion_policy gets trusted_authors (default evaluator, release,
owner) and min_judge_kappa (default 0.6). Judge calibration: train.eval_calibration_case
(human-labelled answers), train.judge_calibration (accuracy, kappa, bias per judge model and
rubric version, computed by train.record_judge_calibration) and train.judge_verdict. The gate
(serve.promotion_blockers, two new result columns: candidate_author, current_author) takes a
required rule only from trusted authors, and a required judge-scored result only from a
calibrated judge with kappa >= min_judge_kappa; cft_release may record results.

Revision ID: 20261205
Revises: 20261204
"""

from alembic import op

revision = "20261205"
down_revision = "20261204"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
-- train.eval_result: who wrote each result (rows from before: an unknown author, trusted by
-- no default rule until the evaluator scores them again), and the judge's rubric version.
ALTER TABLE train.eval_result
  ADD COLUMN author_kind text NOT NULL DEFAULT 'sql'
    CHECK (author_kind IN ('evaluator', 'key', 'sql')),
  ADD COLUMN author_role text NOT NULL DEFAULT 'unknown',
  ADD COLUMN author_key_id bigint,
  ADD COLUMN author text NOT NULL
    DEFAULT 'unknown: recorded before authors were kept (migration 20261205)',
  ADD COLUMN rubric_version text;
ALTER TABLE train.eval_result
  ALTER COLUMN author_kind DROP DEFAULT,
  ALTER COLUMN author_role DROP DEFAULT,
  ALTER COLUMN author DROP DEFAULT;
COMMENT ON COLUMN train.eval_result.author_role IS
  'Who wrote the result, as the policy''s trusted_authors names it: evaluator, a key''s role'
  ' (trainer, release, admin, ...), or a SQL role (owner, release, app, dashboard, other).';

CREATE OR REPLACE FUNCTION train.default_trusted_authors() RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT ARRAY['evaluator', 'release', 'owner']
$$;

ALTER TABLE train.promotion_policy
  ADD COLUMN trusted_authors text[] NOT NULL DEFAULT train.default_trusted_authors(),
  ADD COLUMN min_judge_kappa numeric NOT NULL DEFAULT 0.6
    CHECK (min_judge_kappa BETWEEN -1 AND 1);

-- Who wrote an eval result (or ran a judge calibration), derived by the database from the
-- session, never taken from the writer:
--   * a session logged in as the schema owner (the API, the workers, migrations) may say for
--     whom it acts, transaction- or session-locally: cft.key_id (the API, for the request's
--     authenticated key: app.core.db.as_key) or cft.evaluator (the evaluator worker, for its
--     whole connection). Any other session's settings are ignored: a cft_app or cft_release
--     login can set any cft.* placeholder, so only the owner's can be believed.
--   * otherwise the SQL role writing: 'owner' (the owner or a superuser), 'release'
--     (cft_release), 'app' (cft_app), 'dashboard' (cft_dashboard), 'other'.
-- author_role is what train.promotion_policy.trusted_authors names.

-- Owner rights: the role and prefix of a live key, for the owner's sessions only (no one else may
-- learn about keys through it).
CREATE OR REPLACE FUNCTION train.key_author(p_key_id bigint)
RETURNS TABLE (role text, prefix text, tenant_id int)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
  SELECT k.role, k.prefix, k.tenant_id FROM auth.api_key k
   WHERE k.id = p_key_id AND k.revoked_at IS NULL
     AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = 'train.eval_result'::regclass
                    AND pg_has_role(session_user, c.relowner, 'USAGE'))
$$;
REVOKE EXECUTE ON FUNCTION train.key_author(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION train.key_author(bigint) TO cft_app, cft_release;

-- The author of what the current session writes now (see above).
CREATE OR REPLACE FUNCTION train.current_author()
RETURNS TABLE (author_kind text, author_role text, author_key_id bigint, author text,
               key_tenant_id int)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public AS $$
DECLARE
  v_owner     oid := (SELECT c.relowner FROM pg_class c WHERE c.oid = 'train.eval_result'::regclass);
  v_trusted   boolean;
  v_key       text := nullif(current_setting('cft.key_id', true), '');
  v_evaluator text := nullif(current_setting('cft.evaluator', true), '');
  k           record;
BEGIN
  v_trusted := pg_has_role(session_user, v_owner, 'USAGE');
  IF v_trusted AND v_key IS NOT NULL THEN
    SELECT * INTO k FROM train.key_author(v_key::bigint);
    IF NOT FOUND THEN
      RAISE insufficient_privilege USING
        MESSAGE = format('cft.key_id %s names no live API key', v_key);
    END IF;
    RETURN QUERY SELECT 'key'::text, k.role, v_key::bigint,
      format('key %s (%s, role %s)', v_key, k.prefix, k.role), k.tenant_id;
  ELSIF v_trusted AND v_evaluator IS NOT NULL THEN
    RETURN QUERY SELECT 'evaluator'::text, 'evaluator'::text, NULL::bigint,
      'evaluator ' || v_evaluator, NULL::int;
  ELSE
    RETURN QUERY SELECT 'sql'::text,
      CASE WHEN pg_has_role(current_user, v_owner, 'USAGE') THEN 'owner'
           WHEN pg_has_role(current_user, 'cft_release', 'USAGE') THEN 'release'
           WHEN pg_has_role(current_user, 'cft_app', 'USAGE') THEN 'app'
           WHEN pg_has_role(current_user, 'cft_dashboard', 'USAGE') THEN 'dashboard'
           ELSE 'other' END,
      NULL::bigint,
      'sql role ' || current_user::text
        || CASE WHEN session_user <> current_user THEN ' (session ' || session_user::text || ')'
                ELSE '' END,
      NULL::int;
  END IF;
END
$$;

-- Every INSERT and UPDATE of a result (an ON CONFLICT update, a raw UPDATE of a score) makes
-- the writing session its author, whatever the statement says about the author columns.
CREATE OR REPLACE FUNCTION train.eval_result_author() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public AS $$
DECLARE
  a record;
BEGIN
  SELECT * INTO a FROM train.current_author();
  IF a.author_kind = 'key' AND a.key_tenant_id IS DISTINCT FROM
       (SELECT s.tenant_id FROM serve.adapter s WHERE s.id = NEW.adapter_id) THEN
    RAISE insufficient_privilege USING
      MESSAGE = format('key %s may not write results of adapter %s', a.author_key_id, NEW.adapter_id);
  END IF;
  NEW.author_kind := a.author_kind;
  NEW.author_role := a.author_role;
  NEW.author_key_id := a.author_key_id;
  NEW.author := a.author;
  RETURN NEW;
END
$$;
CREATE TRIGGER eval_result_author BEFORE INSERT OR UPDATE ON train.eval_result
  FOR EACH ROW EXECUTE FUNCTION train.eval_result_author();

-- The release role records results too (its own or an external harness's): they count.
GRANT INSERT, UPDATE ON train.eval_result TO cft_release;
CREATE POLICY release_write ON train.eval_result FOR INSERT TO cft_release WITH CHECK (true);
CREATE POLICY release_update ON train.eval_result FOR UPDATE TO cft_release
  USING (true) WITH CHECK (true);

-- Judge calibration: a suite's calibration set (answers people labelled acceptable or not under
-- the suite's rubric), a judge run over it, and how well the judge agrees with the people:
-- accuracy, Cohen's kappa and bias (judge positive rate - human positive rate). The gate takes a
-- required judge-scored result (judge_model set) only from a judge calibrated on that suite with
-- that rubric version and kappa >= the rule's min_judge_kappa (serve/can_promote.sql).

CREATE TABLE train.eval_calibration_case (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  suite_id    text NOT NULL REFERENCES train.eval_suite(id) ON DELETE CASCADE,
  messages    jsonb NOT NULL CHECK (jsonb_typeof(messages) = 'array'),
  answer      text NOT NULL,     -- the answer to the conversation that people judged
  human_label boolean NOT NULL,  -- people's verdict: acceptable under the rubric
  author      text NOT NULL,     -- who labelled it (set by the database, train.current_author)
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX eval_calibration_case_suite_idx ON train.eval_calibration_case (suite_id, id);

-- One run of one judge (model + rubric version) over a suite's whole calibration set.
CREATE TABLE train.judge_calibration (
  id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  suite_id            text NOT NULL REFERENCES train.eval_suite(id) ON DELETE CASCADE,
  judge_model         text NOT NULL,
  rubric_version      text NOT NULL,
  threshold           numeric NOT NULL,  -- a judge score >= threshold reads as "acceptable"
  n                   int NOT NULL,
  accuracy            numeric,           -- share of cases where the judge agrees with people
  kappa               numeric,           -- Cohen's kappa; NULL if chance agreement is 1
  bias                numeric,           -- judge positive rate - human positive rate
  judge_positive_rate numeric,
  human_positive_rate numeric,
  author_role         text NOT NULL,     -- who ran it (train.current_author)
  author              text NOT NULL,
  calibrated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX judge_calibration_judge_idx
  ON train.judge_calibration (suite_id, judge_model, rubric_version, calibrated_at DESC);

-- The judge's verdict on each case of a calibration (the human label as it was then).
CREATE TABLE train.judge_verdict (
  calibration_id bigint NOT NULL REFERENCES train.judge_calibration(id) ON DELETE CASCADE,
  case_id        bigint NOT NULL REFERENCES train.eval_calibration_case(id) ON DELETE CASCADE,
  judge_score    numeric,          -- NULL: the reply held no score (read as not acceptable)
  judge_reply    text,
  judge_label    boolean NOT NULL,
  human_label    boolean NOT NULL,
  PRIMARY KEY (calibration_id, case_id)
);

CREATE OR REPLACE FUNCTION train.calibration_case_author() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public AS $$
BEGIN
  NEW.author := (SELECT a.author FROM train.current_author() a);
  RETURN NEW;
END
$$;
CREATE TRIGGER eval_calibration_case_author BEFORE INSERT OR UPDATE ON train.eval_calibration_case
  FOR EACH ROW EXECUTE FUNCTION train.calibration_case_author();

-- Record one judge's run over a suite's calibration set: p_verdicts is a JSON array of
-- {"case_id", "score" (0-10, null if unparsable), "reply"}, one per case of the set. The
-- agreement is computed here, from the stored human labels: accuracy p_o; kappa
-- (p_o - p_e) / (1 - p_e) with p_e = p_j p_h + (1 - p_j)(1 - p_h); bias p_j - p_h.
-- Runs as the caller: only the owner (the evaluator, `cft worker eval --calibrate`) may insert.
CREATE OR REPLACE FUNCTION train.record_judge_calibration(
  p_suite text, p_judge_model text, p_rubric_version text, p_verdicts jsonb,
  p_threshold numeric DEFAULT 5)
RETURNS train.judge_calibration LANGUAGE plpgsql SET search_path = pg_catalog, public AS $$
DECLARE
  v_cases bigint[];
  v_given bigint[];
  v_id    bigint;
  r       train.judge_calibration;
BEGIN
  SELECT array_agg(id ORDER BY id) INTO v_cases
    FROM train.eval_calibration_case WHERE suite_id = p_suite;
  IF v_cases IS NULL THEN
    RAISE invalid_parameter_value USING
      MESSAGE = format('suite %s has no calibration set', p_suite);
  END IF;
  SELECT array_agg((v->>'case_id')::bigint ORDER BY (v->>'case_id')::bigint) INTO v_given
    FROM jsonb_array_elements(p_verdicts) v;
  IF v_given IS DISTINCT FROM v_cases THEN
    RAISE invalid_parameter_value USING
      MESSAGE = format('a calibration judges every case of suite %s once: cases %s, verdicts %s',
                       p_suite, v_cases, v_given);
  END IF;
  INSERT INTO train.judge_calibration (suite_id, judge_model, rubric_version, threshold, n,
                                       author_role, author)
  SELECT p_suite, p_judge_model, p_rubric_version, p_threshold, 0, a.author_role, a.author
    FROM train.current_author() a
  RETURNING id INTO v_id;
  INSERT INTO train.judge_verdict (calibration_id, case_id, judge_score, judge_reply,
                                   judge_label, human_label)
  SELECT v_id, c.id, (v->>'score')::numeric, v->>'reply',
         coalesce((v->>'score')::numeric >= p_threshold, false), c.human_label
    FROM jsonb_array_elements(p_verdicts) v
    JOIN train.eval_calibration_case c ON c.id = (v->>'case_id')::bigint;
  WITH s AS (
    SELECT count(*)::int AS n, avg((judge_label = human_label)::int) AS po,
           avg(judge_label::int) AS pj, avg(human_label::int) AS ph
      FROM train.judge_verdict WHERE calibration_id = v_id
  ), e AS (
    SELECT s.*, s.pj * s.ph + (1 - s.pj) * (1 - s.ph) AS pe FROM s
  )
  UPDATE train.judge_calibration j
     SET n = e.n, accuracy = e.po, judge_positive_rate = e.pj, human_positive_rate = e.ph,
         bias = e.pj - e.ph,
         kappa = CASE WHEN e.pe = 1 THEN NULL ELSE (e.po - e.pe) / (1 - e.pe) END
    FROM e WHERE j.id = v_id
  RETURNING j.* INTO r;
  RETURN r;
END
$$;

ALTER TABLE train.eval_calibration_case ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON train.eval_calibration_case TO cft_app
  USING (EXISTS (SELECT 1 FROM train.eval_suite s WHERE s.id = suite_id))
  WITH CHECK (EXISTS (SELECT 1 FROM train.eval_suite s WHERE s.id = suite_id));
CREATE POLICY read_all ON train.eval_calibration_case FOR SELECT TO cft_dashboard, cft_release
  USING (true);
ALTER TABLE train.judge_calibration ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON train.judge_calibration FOR SELECT TO cft_app
  USING (EXISTS (SELECT 1 FROM train.eval_suite s WHERE s.id = suite_id));
CREATE POLICY read_all ON train.judge_calibration FOR SELECT TO cft_dashboard, cft_release
  USING (true);
ALTER TABLE train.judge_verdict ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON train.judge_verdict FOR SELECT TO cft_app
  USING (EXISTS (SELECT 1 FROM train.judge_calibration j WHERE j.id = calibration_id));
CREATE POLICY read_all ON train.judge_verdict FOR SELECT TO cft_dashboard, cft_release
  USING (true);

GRANT SELECT, INSERT, UPDATE, DELETE ON train.eval_calibration_case TO cft_app;
GRANT SELECT ON train.judge_calibration, train.judge_verdict TO cft_app;
GRANT SELECT ON train.eval_calibration_case, train.judge_calibration, train.judge_verdict
  TO cft_release, cft_dashboard;

-- The gate: authors, judge calibration; blockers name the authors (new result columns).
DROP FUNCTION serve.promotion_blockers(text, text);
CREATE OR REPLACE FUNCTION serve.promotion_blockers(candidate text, current text)
RETURNS TABLE (suite_id text, metric text, direction text, candidate_score numeric,
               current_score numeric, threshold numeric, reason text,
               candidate_author text, current_author text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public AS $$
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
    IF p.route <> c.route THEN
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
     WHERE pp.route = c.route OR pp.route IS NULL
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
    SELECT r.metric, 'higher', 0.02, false, true, train.default_trusted_authors(), NULL::numeric,
           r.suite_id
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
      LEFT JOIN train.eval_result cr
             ON cr.adapter_id = c.id AND cr.suite_id = pol.suite_id AND cr.metric = pol.metric
      LEFT JOIN train.eval_result pr
             ON pr.adapter_id = v_cur AND pr.suite_id = pol.suite_id AND pr.metric = pol.metric
      -- The judge's latest calibration on this suite with this rubric.
      LEFT JOIN LATERAL (
        SELECT jc.id, jc.kappa FROM train.judge_calibration jc
         WHERE jc.suite_id = pol.suite_id AND jc.judge_model = cr.judge_model
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
"""
DOWNGRADE_SQL = r"""
DROP FUNCTION serve.promotion_blockers(text, text);
CREATE OR REPLACE FUNCTION serve.promotion_blockers(candidate text, current text)
RETURNS TABLE (suite_id text, metric text, direction text, candidate_score numeric,
               current_score numeric, threshold numeric, reason text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public AS $$
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
      NULL::numeric, format('candidate adapter %s does not exist', coalesce(v_cand, 'NULL'));
    RETURN;
  END IF;
  IF v_cur IS NOT NULL THEN
    SELECT * INTO p FROM serve.adapter a WHERE a.id = v_cur;
    IF NOT FOUND THEN
      RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::numeric, NULL::numeric,
        NULL::numeric, format('current adapter %s does not exist', v_cur);
      RETURN;
    END IF;
    IF p.id = c.id THEN
      RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::numeric, NULL::numeric,
        NULL::numeric, 'candidate and current are the same adapter';
      RETURN;
    END IF;
    IF p.route <> c.route THEN
      RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::numeric, NULL::numeric,
        NULL::numeric, format('candidate is on route %s, current on route %s', c.route, p.route);
      RETURN;
    END IF;
    IF p.base_model <> c.base_model OR p.base_revision IS DISTINCT FROM c.base_revision THEN
      RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::numeric, NULL::numeric,
        NULL::numeric, format('candidate is built on %s%s, current on %s%s: not comparable',
          c.base_model, coalesce('@' || c.base_revision, ''),
          p.base_model, coalesce('@' || p.base_revision, ''));
      RETURN;
    END IF;
  END IF;
  IF c.status IN ('training', 'failed') THEN
    RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::numeric, NULL::numeric,
      NULL::numeric, format('candidate status is %s', c.status);
  END IF;
  IF c.tainted_at IS NOT NULL THEN
    RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::numeric, NULL::numeric,
      NULL::numeric, format('candidate is tainted: %s', coalesce(c.tainted_reason, 'no reason given'));
  END IF;
  IF NOT EXISTS (SELECT 1 FROM train.eval_result r WHERE r.adapter_id = c.id) THEN
    RETURN QUERY SELECT NULL::text, NULL::text, NULL::text, NULL::numeric, NULL::numeric,
      NULL::numeric, 'candidate has no eval results';
  END IF;

  RETURN QUERY
  WITH ruled AS (
    SELECT DISTINCT ON (pp.suite_id, pp.metric)
           pp.suite_id, pp.metric, pp.direction, pp.tolerance, pp.required
      FROM train.promotion_policy pp
     WHERE pp.route = c.route OR pp.route IS NULL
     ORDER BY pp.suite_id, pp.metric, pp.route NULLS LAST
  ), pol AS (
    SELECT q.metric, q.direction, q.tolerance, q.required, false AS by_default,
           CASE WHEN q.suite_id = 'heldout:snapshot' THEN 'heldout:' || c.dataset_snapshot_id::text
                ELSE q.suite_id END AS suite_id
      FROM ruled q
     WHERE q.direction <> 'ignore'
       AND NOT (q.suite_id = 'heldout:snapshot' AND c.dataset_snapshot_id IS NULL)
    UNION ALL
    -- The candidate's results that no rule names: the default rule.
    SELECT r.metric, 'higher', 0.02, false, true, r.suite_id
      FROM train.eval_result r
     WHERE r.adapter_id = c.id
       AND NOT EXISTS (SELECT 1 FROM ruled q
                        WHERE q.metric = r.metric
                          AND (q.suite_id = r.suite_id
                               OR (q.suite_id = 'heldout:snapshot' AND r.suite_id LIKE 'heldout:%')))
  ), cmp AS (
    SELECT pol.*,
           cr.adapter_id IS NOT NULL AS c_has, cr.score AS cs, cr.judge_model AS cj,
           pr.adapter_id IS NOT NULL AS p_has, pr.score AS ps, pr.judge_model AS pj
      FROM pol
      LEFT JOIN train.eval_result cr
             ON cr.adapter_id = c.id AND cr.suite_id = pol.suite_id AND cr.metric = pol.metric
      LEFT JOIN train.eval_result pr
             ON pr.adapter_id = v_cur AND pr.suite_id = pol.suite_id AND pr.metric = pol.metric
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
        WHEN v_cur IS NULL THEN NULL
        WHEN NOT p_has AND required
          THEN 'current adapter has no result for this required metric: evaluate it on the same suite'
        WHEN NOT p_has THEN NULL
        WHEN NOT p_ok THEN 'current score is not a finite number: not comparable'
        WHEN cj IS DISTINCT FROM pj
          THEN format('judged by different models (%s vs %s): not comparable',
                      coalesce(cj, 'none'), coalesce(pj, 'none'))
        WHEN direction = 'higher' AND cs < thr
          THEN format('regression: %s < %s (higher is better, tolerance %s%s)', cs, thr, tolerance,
                      CASE WHEN by_default THEN '; default rule: no policy names this metric' ELSE '' END)
        WHEN direction = 'lower' AND cs > thr
          THEN format('regression: %s > %s (lower is better, tolerance %s)', cs, thr, tolerance)
      END AS why
      FROM judged
  )
  SELECT v.suite_id, v.metric, v.direction, v.cs, v.ps, v.thr, v.why
    FROM verdict v WHERE v.why IS NOT NULL
  UNION ALL
  SELECT NULL, NULL, NULL, NULL, NULL, NULL,
         format('nothing compared: no metric of %s was compared with the current prod %s'
                ' (evaluate both on a common suite)', c.id, v_cur)
   WHERE v_cur IS NOT NULL
     AND NOT EXISTS (SELECT 1 FROM verdict v
                      WHERE v.c_ok AND v.p_ok AND v.cj IS NOT DISTINCT FROM v.pj)
   ORDER BY 1, 2;
END
$$;
COMMENT ON FUNCTION serve.promotion_blockers(text, text) IS
  'Why candidate may not replace current (NULL = no prod yet): one row per blocker, none = allowed.';

DROP FUNCTION train.record_judge_calibration(text, text, text, jsonb, numeric);
DROP TABLE train.judge_verdict, train.judge_calibration, train.eval_calibration_case;
DROP FUNCTION train.calibration_case_author();
DROP POLICY release_update ON train.eval_result;
DROP POLICY release_write ON train.eval_result;
REVOKE INSERT, UPDATE ON train.eval_result FROM cft_release;
DROP TRIGGER eval_result_author ON train.eval_result;
DROP FUNCTION train.eval_result_author();
DROP FUNCTION train.current_author();
DROP FUNCTION train.key_author(bigint);
ALTER TABLE train.promotion_policy DROP COLUMN trusted_authors, DROP COLUMN min_judge_kappa;
DROP FUNCTION train.default_trusted_authors();
ALTER TABLE train.eval_result DROP COLUMN author_kind, DROP COLUMN author_role,
  DROP COLUMN author_key_id, DROP COLUMN author, DROP COLUMN rubric_version;
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
