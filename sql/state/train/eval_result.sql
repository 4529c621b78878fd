-- One score of one adapter, with who wrote it and the judge's rubric version. The author columns
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
