-- As in the seed, plus who wrote each result and the judge's rubric version. The author columns
-- are set by the database from the writing session (train/eval_author.sql), never by the writer;
-- rubric_version (a judge-scored result: which rubric the judge applied) is the writer's.
CREATE TABLE train.eval_result (
  adapter_id  text REFERENCES serve.adapter(id),
  suite_id    text,
  metric      text,
  score       numeric,
  judge_model text,
  judged_at   timestamptz DEFAULT now(),
  author_kind text NOT NULL CHECK (author_kind IN ('evaluator', 'key', 'sql')),
  author_role text NOT NULL,
  author_key_id bigint,
  author      text NOT NULL,
  rubric_version text,
  PRIMARY KEY (adapter_id, suite_id, metric)
);
COMMENT ON COLUMN train.eval_result.author_role IS
  'Who wrote the result, as the policy''s trusted_authors names it: evaluator, a key''s role'
  ' (trainer, release, admin, ...), or a SQL role (owner, release, app, dashboard, other).';

-- The authors whose results satisfy a required rule unless a rule says otherwise
-- (train.promotion_policy.trusted_authors): the evaluator worker, the release role (a release
-- key or the cft_release SQL role) and the schema owner (migrations, the operator).
CREATE OR REPLACE FUNCTION train.default_trusted_authors() RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT ARRAY['evaluator', 'release', 'owner']
$$;
