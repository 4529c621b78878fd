COMMENT ON COLUMN train.eval_result.id IS 'The result''s id, in the order results were written.';
COMMENT ON COLUMN train.eval_result.adapter_id IS 'The adapter scored.';
COMMENT ON COLUMN train.eval_result.suite_id IS
  'What it was scored on: a suite''s id (train.eval_suite), or heldout:<snapshot '
  'id> for a snapshot''s eval split.';
COMMENT ON COLUMN train.eval_result.metric IS
  'The metric, e.g. pass_rate (task suite), judge_score (judge suite, 0-10), loss, perplexity, '
  'preference_accuracy (held out).';
COMMENT ON COLUMN train.eval_result.score IS
  'The value, in the metric''s unit; NULL or NaN: the evaluation failed (the gate refuses it).';
COMMENT ON COLUMN train.eval_result.judge_model IS
  'The judge model that scored it; NULL: computed, not judged.';
COMMENT ON COLUMN train.eval_result.judged_at IS 'When it was written (set by the database).';
COMMENT ON COLUMN train.eval_result.author_kind IS
  'How the database knew the author: evaluator (the worker), key (an '
  'API key) or sql (the SQL role).';
COMMENT ON COLUMN train.eval_result.author_key_id IS
  'The API key that wrote it (auth.api_key.id) when author_kind is key.';
COMMENT ON COLUMN train.eval_result.author IS
  'Who wrote it, for people: evaluator <id>, key <id> (<prefix>, role <role>) or sql role <role>.';
COMMENT ON COLUMN train.eval_result.rubric_version IS
  'A judge-scored result: the version of the rubric the judge applied (the '
  'evaluator''s: 12 hex of its sha256).';
COMMENT ON COLUMN train.eval_result.author_role IS
  'Who wrote the result, as the policy''s trusted_authors names it: evaluator, a key''s role'
  ' (trainer, release, admin, ...), or a SQL role (owner, release, app, dashboard, other).';

-- The authors whose results satisfy a required rule unless a rule says otherwise
-- (train.promotion_policy.trusted_authors): the evaluator worker and the schema owner
-- (migrations, the operator). Not the release role: the role that promotes does not also write
-- the results that let it promote (its results are shown and audited, and count where a rule
-- names release). An UPDATE of a result re-stamps its author, so a release login that rewrites
-- a score makes it the release role's.
CREATE OR REPLACE FUNCTION train.default_trusted_authors() RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT ARRAY['evaluator', 'owner']
$$;

-- The newest result of each author per adapter, suite and metric: what is shown (an older row of
-- the same author is a superseded one, kept as history).
CREATE OR REPLACE VIEW train.eval_result_latest WITH (security_invoker = true) AS
SELECT DISTINCT ON (r.adapter_id, r.suite_id, r.metric, r.author) r.*
  FROM train.eval_result r
 ORDER BY r.adapter_id, r.suite_id, r.metric, r.author, r.judged_at DESC, r.id DESC;
COMMENT ON VIEW train.eval_result_latest IS
  'The newest result of each author per adapter, suite and metric (older ones are superseded).';

-- The one result per adapter, suite and metric that counts for authors trusted: the newest by
-- a trusted author, else the newest of all (shown, and refused where a rule requires trust).
CREATE OR REPLACE FUNCTION train.counted_result(
  p_adapter text, p_suite text, p_metric text,
  p_trusted text[] DEFAULT train.default_trusted_authors())
RETURNS SETOF train.eval_result
LANGUAGE sql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
  SELECT r.* FROM train.eval_result r
   WHERE r.adapter_id = p_adapter AND r.suite_id = p_suite AND r.metric = p_metric
   ORDER BY (r.author_role = ANY (p_trusted)) DESC, r.judged_at DESC, r.id DESC
   LIMIT 1
$$;

-- Per adapter, suite and metric, the result that counts under the default trusted authors
-- (train.counted_result's rule, applied to every key that has a result).
CREATE OR REPLACE VIEW train.eval_result_counted WITH (security_invoker = true) AS
SELECT c.*
  FROM (SELECT DISTINCT r.adapter_id, r.suite_id, r.metric FROM train.eval_result r) k
  CROSS JOIN LATERAL train.counted_result(k.adapter_id, k.suite_id, k.metric) c;
COMMENT ON VIEW train.eval_result_counted IS
  'Per adapter, suite and metric, the result that counts: the newest by a default trusted author'
  ' (train.default_trusted_authors), else the newest.';
