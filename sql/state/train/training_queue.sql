-- The trainer workers the queue has seen: each claim records the worker's capacity (host,
-- devices, memory per GPU, kind), so a run no live worker can serve says why it waits
-- (train.training_run_wait). A worker is live while it polls (alive_until, one lease ahead) or
-- holds a run with a live lease.
CREATE TABLE train.training_worker (
  worker_id     text PRIMARY KEY,
  host          text NOT NULL,
  devices       text NOT NULL,
  gpus          int NOT NULL,
  gpu_memory_gb real,
  device_kind   text,
  seen_at       timestamptz NOT NULL DEFAULT now(),
  alive_until   timestamptz NOT NULL
);
