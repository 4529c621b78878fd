-- One score of one adapter, with who wrote it and the judge's rubric version: a fact, never
-- updated or deleted (a correction is a new row; the newest per author counts). The author
-- columns and judged_at are set by the database from the writing session (train/eval_author.sql),
-- never by the writer; rubric_version (a judge-scored result: which rubric the judge applied) is
-- the writer's.
CREATE TABLE train.eval_result (
  adapter_id  text NOT NULL REFERENCES serve.adapter(id),
  suite_id    text NOT NULL,
  metric      text NOT NULL,
  score       numeric,
  judge_model text,
  judged_at   timestamptz DEFAULT now(),
  author_kind text NOT NULL CHECK (author_kind IN ('evaluator', 'key', 'sql')),
  author_role text NOT NULL,
  author_key_id bigint,
  author      text NOT NULL,
  rubric_version text,
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY
);
CREATE INDEX eval_result_newest ON train.eval_result (adapter_id, suite_id, metric, judged_at DESC, id DESC);
