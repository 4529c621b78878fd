-- The evaluator: task suites per route, evaluation requests, and the default global policy.

COMMENT ON COLUMN train.eval_suite.id IS
  'The suite''s id (eval_result.suite_id), unique within its tenant; no '':'', so it never '
  'collides with heldout:<snapshot id>.';
COMMENT ON COLUMN train.eval_suite.tenant_id IS 'The tenant that owns it.';
COMMENT ON COLUMN train.eval_suite.route IS 'The route it scores; NULL: every route of the tenant.';
COMMENT ON COLUMN train.eval_suite.name IS 'A name for people (default: the id).';
COMMENT ON COLUMN train.eval_suite.kind IS
  'task: each answer is checked, the score is the pass rate; judge: a judge model scores '
  'each answer 0-10 by the rubric.';
COMMENT ON COLUMN train.eval_suite.rubric IS
  'Kind judge: what the judge scores (0-10); NULL: the configured default (CFT_EVAL_JUDGE_RUBRIC).';
COMMENT ON COLUMN train.eval_suite.created_at IS 'When the suite was created.';
COMMENT ON COLUMN train.eval_case.id IS 'The case''s number (cases run in this order).';
COMMENT ON COLUMN train.eval_case.suite_id IS 'The suite it belongs to.';
COMMENT ON COLUMN train.eval_case.tenant_id IS 'The tenant of its suite.';
COMMENT ON COLUMN train.eval_case.messages IS
  'The conversation the adapter answers (OpenAI chat messages).';
COMMENT ON COLUMN train.eval_case.check_kind IS
  'How a task suite checks the answer: exact, contains, regex, json_schema or max_length '
  '(a judge suite does not check).';
COMMENT ON COLUMN train.eval_case.expected IS
  'What the check compares with: the text, a string or list of strings (all contained, any case), '
  'a pattern, a JSON Schema, or a length in characters.';
COMMENT ON COLUMN train.eval_case.max_tokens IS
  'Most tokens the answer may have (1-4096, default 32).';
COMMENT ON COLUMN train.eval_request.id IS 'The request''s number (claimed in this order).';
COMMENT ON COLUMN train.eval_request.tenant_id IS 'The adapter''s tenant.';
COMMENT ON COLUMN train.eval_request.adapter_id IS 'The adapter to evaluate.';
COMMENT ON COLUMN train.eval_request.status IS
  'queued, running (an evaluator holds its lease), done or failed.';
COMMENT ON COLUMN train.eval_request.requested_by IS
  'Who asked: key:<prefix> (API), or "evaluator: new candidate" for a candidate never evaluated.';
COMMENT ON COLUMN train.eval_request.worker_id IS 'The evaluator worker that claimed it last.';
COMMENT ON COLUMN train.eval_request.lease_until IS
  'End of that worker''s lease; past it the request is claimed again (failed after 3 attempts).';
COMMENT ON COLUMN train.eval_request.attempts IS 'Claims so far.';
COMMENT ON COLUMN train.eval_request.error IS 'Why the last attempt failed; NULL once done.';
COMMENT ON COLUMN train.eval_request.created_at IS 'When it was asked for.';
COMMENT ON COLUMN train.eval_request.started_at IS 'When it was first claimed.';
COMMENT ON COLUMN train.eval_request.finished_at IS 'When it ended, done or failed.';

ALTER TABLE train.eval_suite ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON train.eval_suite;
CREATE POLICY tenant_isolation ON train.eval_suite TO cft_app
  USING (tenant_id = auth.current_tenant_id()) WITH CHECK (tenant_id = auth.current_tenant_id());
DROP POLICY IF EXISTS read_all ON train.eval_suite;
CREATE POLICY read_all ON train.eval_suite FOR SELECT TO cft_dashboard, cft_release USING (true);
ALTER TABLE train.eval_case ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON train.eval_case;
CREATE POLICY tenant_isolation ON train.eval_case TO cft_app
  USING (tenant_id = auth.current_tenant_id()) WITH CHECK (tenant_id = auth.current_tenant_id());
DROP POLICY IF EXISTS read_all ON train.eval_case;
CREATE POLICY read_all ON train.eval_case FOR SELECT TO cft_dashboard, cft_release USING (true);
ALTER TABLE train.eval_request ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON train.eval_request;
CREATE POLICY tenant_isolation ON train.eval_request TO cft_app
  USING (tenant_id = auth.current_tenant_id()) WITH CHECK (tenant_id = auth.current_tenant_id());
DROP POLICY IF EXISTS read_all ON train.eval_request;
CREATE POLICY read_all ON train.eval_request FOR SELECT TO cft_dashboard, cft_release USING (true);

GRANT SELECT, INSERT, UPDATE, DELETE ON train.eval_suite, train.eval_case TO cft_app;
GRANT SELECT, INSERT ON train.eval_request TO cft_app;
GRANT SELECT ON train.eval_suite, train.eval_case, train.eval_request TO cft_release, cft_dashboard;

-- Wake evaluators: a request, or an adapter becoming a candidate.
CREATE OR REPLACE FUNCTION train.eval_notify() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  PERFORM pg_notify('cft_eval', NEW.adapter_id);
  RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER eval_request_notify AFTER INSERT ON train.eval_request
  FOR EACH ROW EXECUTE FUNCTION train.eval_notify();

CREATE OR REPLACE FUNCTION serve.adapter_candidate_notify() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  PERFORM pg_notify('cft_eval', NEW.id);
  RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER adapter_candidate_notify AFTER INSERT OR UPDATE OF status ON serve.adapter
  FOR EACH ROW WHEN (NEW.status = 'candidate') EXECUTE FUNCTION serve.adapter_candidate_notify();

-- An evaluator claims one request, first queueing one for every candidate never evaluated.
-- A request whose worker died is reclaimed after its lease; after 3 attempts it fails.
CREATE OR REPLACE FUNCTION train.claim_eval_request(p_worker text, p_lease interval)
RETURNS SETOF train.eval_request LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO train.eval_request (tenant_id, adapter_id, requested_by)
  SELECT a.tenant_id, a.id, 'evaluator: new candidate' FROM serve.adapter a
   WHERE a.status = 'candidate' AND a.weights_uri IS NOT NULL
     AND NOT EXISTS (SELECT 1 FROM train.eval_request r WHERE r.adapter_id = a.id)
     AND NOT EXISTS (SELECT 1 FROM train.eval_result e WHERE e.adapter_id = a.id)
  ON CONFLICT DO NOTHING;
  UPDATE train.eval_request SET status = 'failed', finished_at = now(),
         error = coalesce(error, 'lease expired ' || attempts || ' times')
   WHERE status = 'running' AND lease_until < now() AND attempts >= 3;
  RETURN QUERY
  UPDATE train.eval_request SET status = 'running', worker_id = p_worker, attempts = attempts + 1,
         lease_until = now() + p_lease, started_at = coalesce(started_at, now())
   WHERE id = (SELECT id FROM train.eval_request
                WHERE status = 'queued' OR (status = 'running' AND lease_until < now())
                ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
  RETURNING *;
END
$$;
