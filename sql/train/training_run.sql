CREATE TABLE train.training_run (
  id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id     int NOT NULL REFERENCES tenant(id),
  route         text NOT NULL,
  method        text NOT NULL CHECK (method IN ('sft', 'dpo', 'kto', 'orpo', 'simpo')),
  base_model    text NOT NULL,
  params        jsonb NOT NULL DEFAULT '{}',
  snapshot_id   uuid REFERENCES train.dataset_snapshot(id),
  status        text NOT NULL DEFAULT 'queued'
                CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
  priority      int NOT NULL DEFAULT 0,
  worker_id     text,
  lease_until   timestamptz,
  attempts      int NOT NULL DEFAULT 0,
  max_attempts  int NOT NULL DEFAULT 3 CHECK (max_attempts > 0),
  cancel_requested boolean NOT NULL DEFAULT false,
  progress      jsonb NOT NULL DEFAULT '{}',
  error         text,
  adapter_id    text,
  created_by    text,
  created_at    timestamptz NOT NULL DEFAULT now(),
  started_at    timestamptz,
  finished_at   timestamptz,
  updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX training_run_queue_idx ON train.training_run (priority DESC, created_at)
  WHERE status IN ('queued', 'running');
