COMMENT ON COLUMN train.training_run.id IS 'The run''s id.';
COMMENT ON COLUMN train.training_run.tenant_id IS 'The tenant it trains for.';
COMMENT ON COLUMN train.training_run.route IS 'The route its adapter is for.';
COMMENT ON COLUMN train.training_run.method IS
  'sft, dpo, kto, orpo or simpo (its snapshot''s examples fit the method).';
COMMENT ON COLUMN train.training_run.base_model IS
  'The base model it trains on (the request''s, else CFT_BASE_MODEL; '
  'the loop''s runs: the route''s).';
COMMENT ON COLUMN train.training_run.params IS
  'The hyperparameters the request set (app.training.methods.Hyperparameters keys; '
  'the others take their defaults).';
COMMENT ON COLUMN train.training_run.snapshot_id IS
  'The frozen dataset it trains on (train.dataset_snapshot.id).';
COMMENT ON COLUMN train.training_run.status IS
  'queued, running (a worker holds its lease), succeeded, failed or cancelled.';
COMMENT ON COLUMN train.training_run.priority IS
  'Higher is claimed first (-1000..1000, default 0); then runs needing '
  'more devices, then the oldest.';
COMMENT ON COLUMN train.training_run.worker_id IS
  'The trainer worker that holds it, or held it last; NULL until claimed, '
  'and once a retry queues it again.';
COMMENT ON COLUMN train.training_run.lease_until IS
  'End of that worker''s lease, renewed by its heartbeats; past it the run is claimed '
  'again, or failed after max_attempts.';
COMMENT ON COLUMN train.training_run.attempts IS
  'Claims so far (a claim after an expired lease counts).';
COMMENT ON COLUMN train.training_run.max_attempts IS
  'Claims allowed (default 3): an expired run that has used them fails.';
COMMENT ON COLUMN train.training_run.cancel_requested IS
  'Asked to stop: a queued run is cancelled at once, a running one when its '
  'worker sees it or its lease expires.';
COMMENT ON COLUMN train.training_run.progress IS
  'Live progress from the worker (step, total, loss, eta_s, tokens_per_s, loss_history, '
  'updated_at); when it succeeds, also the metrics.';
COMMENT ON COLUMN train.training_run.error IS
  'Why the last attempt failed, was claimed again or was cancelled; NULL once it succeeded.';
COMMENT ON COLUMN train.training_run.adapter_id IS
  'The candidate adapter it registered (serve.adapter.id), once succeeded.';
COMMENT ON COLUMN train.training_run.created_by IS
  'Who queued it: key:<prefix> (API), cli, or loop cycle N.';
COMMENT ON COLUMN train.training_run.created_at IS 'When it was queued.';
COMMENT ON COLUMN train.training_run.started_at IS 'When it was first claimed.';
COMMENT ON COLUMN train.training_run.finished_at IS 'When it succeeded, failed or was cancelled.';
COMMENT ON COLUMN train.training_run.updated_at IS 'Last change of the row.';
COMMENT ON COLUMN train.training_run.gpus IS
  'Devices the run trains on at once; more than 1 runs through accelerate launch (DDP or FSDP) on one worker holding that many.';
COMMENT ON COLUMN train.training_run.min_gpu_memory_gb IS
  'Least memory of each GPU the run needs, in GiB as torch reports it (NULL: any).';
COMMENT ON COLUMN train.training_run.device_kind IS
  'cuda or cpu: the kind of device the run needs (NULL: any).';
COMMENT ON COLUMN train.training_run.host IS 'Host of the worker that (last) claimed the run.';
COMMENT ON COLUMN train.training_run.devices IS
  'That worker''s devices: CUDA indices (0,1) or cpu slots (cpu+cpu).';
