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
