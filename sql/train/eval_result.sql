-- As in the seed.
CREATE TABLE train.eval_result (
  adapter_id  text REFERENCES serve.adapter(id),
  suite_id    text,
  metric      text,
  score       numeric,
  judge_model text,
  judged_at   timestamptz DEFAULT now(),
  PRIMARY KEY (adapter_id, suite_id, metric)
);
