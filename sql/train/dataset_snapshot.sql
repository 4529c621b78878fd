COMMENT ON COLUMN train.dataset_snapshot.id IS
  'The snapshot''s id, as training runs and adapters name it.';
COMMENT ON COLUMN train.dataset_snapshot.tenant_id IS 'The tenant whose traffic it holds.';
COMMENT ON COLUMN train.dataset_snapshot.route IS 'The route whose traffic it holds.';
COMMENT ON COLUMN train.dataset_snapshot.method IS
  'The method its examples are for: its candidate view (sft: edits; kto: thumbs; dpo, '
  'orpo, simpo: preference pairs).';
COMMENT ON COLUMN train.dataset_snapshot.query_sql IS
  'The exact candidate query that produced its rows (params.write: the '
  'statement that wrote the examples).';
COMMENT ON COLUMN train.dataset_snapshot.params IS
  'Its inputs and rules: window (since, until), view, dedup threshold and neighbours, eval_pct, '
  'each step''s rule as text, step_ms.';
COMMENT ON COLUMN train.dataset_snapshot.counts IS
  'Rows left after each step (view_rows, in_window, live_ok, exact_dedup, '
  'semantic_dedup) and the dedup''s own counts.';
COMMENT ON COLUMN train.dataset_snapshot.n_train IS 'Examples in the train split.';
COMMENT ON COLUMN train.dataset_snapshot.n_eval IS
  'Examples in the eval split (held out: the evaluator''s held-out metrics).';
COMMENT ON COLUMN train.dataset_snapshot.set_hash IS
  'Hex sha256 over its sorted example hashes; set when the snapshot is sealed (NULL: a draft).';
COMMENT ON COLUMN train.dataset_snapshot.created_by IS
  'Who took it: api-key:<prefix>, cli, loop cycle N, or the SQL session user.';
COMMENT ON COLUMN train.dataset_snapshot.created_at IS 'When it was taken.';
COMMENT ON COLUMN train.dataset_snapshot.tainted_at IS
  'When a user whose rows it holds was forgotten (the one change a sealed '
  'snapshot admits); NULL: clean.';
COMMENT ON COLUMN train.dataset_snapshot.tainted_reason IS
  'Why it is tainted (the forget request that tainted it).';
COMMENT ON COLUMN train.dataset_example.snapshot_id IS
  'The snapshot it belongs to (train.dataset_snapshot.id, kept by trigger).';
COMMENT ON COLUMN train.dataset_example.example_hash IS
  'sha256 of the example''s canonical jsonb text (train.example_hash): '
  'its identity and split bucket.';
COMMENT ON COLUMN train.dataset_example.split IS
  'train or eval: eval when the hash''s bucket (train.split_bucket) is '
  'below the snapshot''s eval_pct.';
COMMENT ON COLUMN train.dataset_example.log_ids IS
  'ids of the obs.inference_log rows it was built from (one, or a '
  'pair''s rejected and chosen rows).';
COMMENT ON COLUMN train.dataset_example.example IS
  'The frozen example in TRL''s format for the snapshot''s method.';
