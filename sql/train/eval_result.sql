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
COMMENT ON COLUMN train.eval_result.judged_at IS 'When it was scored (last written).';
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
