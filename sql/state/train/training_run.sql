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
  updated_at    timestamptz NOT NULL DEFAULT now(),
  -- What the run needs (a worker claims only runs it can serve: train.claim_training_run):
  -- devices in one launch (gpus > 1 runs through accelerate launch), the least memory of each
  -- GPU, and the kind of device (NULL: any).
  gpus          int NOT NULL DEFAULT 1 CHECK (gpus BETWEEN 1 AND 64),
  min_gpu_memory_gb real CHECK (min_gpu_memory_gb > 0 AND min_gpu_memory_gb <= 4096),
  device_kind   text CHECK (device_kind IN ('cuda', 'cpu')),
  -- Where it was (last) trained: the worker's host and its devices (CUDA indices, or cpu).
  host          text,
  devices       text
);
CREATE INDEX training_run_queue_idx ON train.training_run (priority DESC, created_at)
  WHERE status IN ('queued', 'running');
