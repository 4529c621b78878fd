CREATE TABLE train.dataset_snapshot (
  id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id      int NOT NULL REFERENCES tenant(id),
  route          text NOT NULL,
  method         text NOT NULL CHECK (method IN ('sft', 'dpo', 'kto', 'orpo', 'simpo')),
  query_sql      text NOT NULL,          -- the exact query that produced the rows
  params         jsonb NOT NULL DEFAULT '{}',
  counts         jsonb NOT NULL DEFAULT '{}',  -- rows before/after each filter and dedup step
  n_train        int NOT NULL DEFAULT 0,
  n_eval         int NOT NULL DEFAULT 0,
  set_hash       text,                   -- sha256 over the sorted example hashes
  created_by     text,
  created_at     timestamptz NOT NULL DEFAULT now(),
  tainted_at     timestamptz,
  tainted_reason text
);
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

-- Append-only, written in bulk (see train/dataset_example_guard.sql): no primary key, no
-- declared foreign key (triggers keep both rules), a plain index on snapshot_id for readers.

CREATE TABLE train.dataset_example (
  snapshot_id  uuid NOT NULL,                         -- train.dataset_snapshot(id), by trigger
  example_hash bytea NOT NULL,           -- sha256 of the canonical example
  split        text NOT NULL CHECK (split IN ('train', 'eval')),
  log_ids      bigint[] NOT NULL,        -- provenance: obs.inference_log ids
  example      jsonb NOT NULL            -- the frozen example in TRL's format

);
CREATE INDEX dataset_example_snapshot_idx ON train.dataset_example (snapshot_id);
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
