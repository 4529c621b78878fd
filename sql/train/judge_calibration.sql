COMMENT ON COLUMN train.eval_calibration_case.id IS
  'The case''s number (train.judge_verdict.case_id); a calibration judges cases in this order.';
COMMENT ON COLUMN train.eval_calibration_case.suite_id IS
  'The judge suite whose calibration set it belongs to (train.eval_suite.id).';
COMMENT ON COLUMN train.eval_calibration_case.messages IS
  'The conversation that was answered (OpenAI chat messages).';
COMMENT ON COLUMN train.eval_calibration_case.answer IS
  'The answer people judged; the judge is shown the conversation and this answer.';
COMMENT ON COLUMN train.eval_calibration_case.human_label IS
  'People''s verdict under the suite''s rubric (true: '
  'acceptable): the label of POST /v1/eval-suites.';
COMMENT ON COLUMN train.eval_calibration_case.author IS
  'Who added or last changed it, set by the database (train.current_author): '
  'key <id> (<prefix>, role <role>), evaluator <id> or sql role <role>.';
COMMENT ON COLUMN train.eval_calibration_case.created_at IS 'When the case was added.';
COMMENT ON COLUMN train.eval_calibration_case.tenant_id IS 'The tenant of its suite.';
COMMENT ON COLUMN train.judge_calibration.id IS 'The calibration''s number.';
COMMENT ON COLUMN train.judge_calibration.suite_id IS
  'The judge suite whose calibration set was judged.';
COMMENT ON COLUMN train.judge_calibration.judge_model IS 'The judge model.';
COMMENT ON COLUMN train.judge_calibration.rubric_version IS
  'Version of the rubric it judged by (12 hex of its sha256): an edited rubric '
  'needs a calibration of its own.';
COMMENT ON COLUMN train.judge_calibration.threshold IS
  'A judge score at or above it reads as acceptable (default 5, of 0-10).';
COMMENT ON COLUMN train.judge_calibration.n IS 'Calibration cases judged.';
COMMENT ON COLUMN train.judge_calibration.accuracy IS
  'Share of cases where the judge agrees with people.';
COMMENT ON COLUMN train.judge_calibration.kappa IS
  'Cohen''s kappa of the judge against people; NULL when chance agreement is 1. The gate '
  'compares it with min_judge_kappa.';
COMMENT ON COLUMN train.judge_calibration.bias IS 'Judge positive rate minus human positive rate.';
COMMENT ON COLUMN train.judge_calibration.judge_positive_rate IS
  'Share of cases the judge read as acceptable.';
COMMENT ON COLUMN train.judge_calibration.human_positive_rate IS
  'Share of cases people labelled acceptable.';
COMMENT ON COLUMN train.judge_calibration.author_role IS
  'Who ran it, as trusted_authors names authors (train.current_author).';
COMMENT ON COLUMN train.judge_calibration.author IS
  'Who ran it, for people (train.current_author).';
COMMENT ON COLUMN train.judge_calibration.calibrated_at IS 'When it ran.';
COMMENT ON COLUMN train.judge_calibration.tenant_id IS 'The tenant of its suite.';
COMMENT ON COLUMN train.judge_verdict.calibration_id IS
  'The calibration run (train.judge_calibration.id).';
COMMENT ON COLUMN train.judge_verdict.case_id IS
  'The calibration case judged (train.eval_calibration_case.id).';
COMMENT ON COLUMN train.judge_verdict.judge_score IS
  'The judge''s score, 0-10; NULL: its reply held no score (read as not acceptable).';
COMMENT ON COLUMN train.judge_verdict.judge_reply IS 'The judge''s reply as it came.';
COMMENT ON COLUMN train.judge_verdict.judge_label IS
  'The judge''s verdict (true: acceptable): judge_score at or above the calibration''s threshold.';
COMMENT ON COLUMN train.judge_verdict.human_label IS
  'People''s label of the case when it was judged (true: acceptable).';

CREATE OR REPLACE FUNCTION train.calibration_case_author() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  NEW.author := (SELECT a.author FROM train.current_author() a);
  RETURN NEW;
END
$$;
CREATE OR REPLACE TRIGGER eval_calibration_case_author BEFORE INSERT OR UPDATE ON train.eval_calibration_case
  FOR EACH ROW EXECUTE FUNCTION train.calibration_case_author();

-- Record one judge's run over the calibration set of suite p_suite of tenant p_tenant: p_verdicts
-- is a JSON array of {"case_id", "score" (0-10, null if unparsable), "reply"}, one per case of
-- the set. The agreement is computed here, from the stored human labels: accuracy p_o; kappa
-- (p_o - p_e) / (1 - p_e) with p_e = p_j p_h + (1 - p_j)(1 - p_h); bias p_j - p_h.
-- Runs as the caller: only the owner (the evaluator, `cft worker eval --calibrate`) may insert.
CREATE OR REPLACE FUNCTION train.record_judge_calibration(
  p_tenant int, p_suite text, p_judge_model text, p_rubric_version text, p_verdicts jsonb,
  p_threshold numeric DEFAULT 5)
RETURNS train.judge_calibration LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_cases bigint[];
  v_given bigint[];
  v_id    bigint;
  r       train.judge_calibration;
BEGIN
  SELECT array_agg(id ORDER BY id) INTO v_cases
    FROM train.eval_calibration_case WHERE tenant_id = p_tenant AND suite_id = p_suite;
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
  INSERT INTO train.judge_calibration (tenant_id, suite_id, judge_model, rubric_version,
                                       threshold, n, author_role, author)
  SELECT p_tenant, p_suite, p_judge_model, p_rubric_version, p_threshold, 0, a.author_role, a.author
    FROM train.current_author() a
  RETURNING id INTO v_id;
  INSERT INTO train.judge_verdict (calibration_id, case_id, judge_score, judge_reply,
                                   judge_label, human_label)
  SELECT v_id, c.id, (v->>'score')::numeric, v->>'reply',
         coalesce((v->>'score')::numeric >= p_threshold, false), c.human_label
    FROM jsonb_array_elements(p_verdicts) v
    JOIN train.eval_calibration_case c ON c.id = (v->>'case_id')::bigint
   WHERE c.tenant_id = p_tenant;
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
DROP POLICY IF EXISTS tenant_isolation ON train.eval_calibration_case;
CREATE POLICY tenant_isolation ON train.eval_calibration_case TO cft_app
  USING (tenant_id = auth.current_tenant_id()) WITH CHECK (tenant_id = auth.current_tenant_id());
DROP POLICY IF EXISTS read_all ON train.eval_calibration_case;
CREATE POLICY read_all ON train.eval_calibration_case FOR SELECT TO cft_dashboard, cft_release
  USING (true);
ALTER TABLE train.judge_calibration ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON train.judge_calibration;
CREATE POLICY tenant_isolation ON train.judge_calibration FOR SELECT TO cft_app
  USING (tenant_id = auth.current_tenant_id());
DROP POLICY IF EXISTS read_all ON train.judge_calibration;
CREATE POLICY read_all ON train.judge_calibration FOR SELECT TO cft_dashboard, cft_release
  USING (true);
ALTER TABLE train.judge_verdict ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON train.judge_verdict;
CREATE POLICY tenant_isolation ON train.judge_verdict FOR SELECT TO cft_app
  USING (EXISTS (SELECT 1 FROM train.judge_calibration j WHERE j.id = calibration_id));
DROP POLICY IF EXISTS read_all ON train.judge_verdict;
CREATE POLICY read_all ON train.judge_verdict FOR SELECT TO cft_dashboard, cft_release
  USING (true);

GRANT SELECT, INSERT, UPDATE, DELETE ON train.eval_calibration_case TO cft_app;
GRANT SELECT ON train.judge_calibration, train.judge_verdict TO cft_app;
GRANT SELECT ON train.eval_calibration_case, train.judge_calibration, train.judge_verdict
  TO cft_release, cft_dashboard;
