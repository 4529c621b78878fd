-- Eval results are facts: no role updates or deletes them; a correction is a new row, and the
-- newest per author counts. The key (adapter, suite, metric) gives way to an id in write order.
ALTER TABLE train.eval_result DROP CONSTRAINT eval_result_pkey;
ALTER TABLE train.eval_result ALTER COLUMN adapter_id SET NOT NULL,
  ALTER COLUMN suite_id SET NOT NULL, ALTER COLUMN metric SET NOT NULL;
ALTER TABLE train.eval_result ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY;
CREATE INDEX eval_result_newest ON train.eval_result (adapter_id, suite_id, metric, judged_at DESC, id DESC);
