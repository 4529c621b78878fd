-- The training queue: workers claim runs with FOR UPDATE SKIP LOCKED, hold a lease they renew,
-- and a run whose worker died is reclaimed after its lease expires. attempts counts claims;
-- an expired run that has used max_attempts is failed instead of reclaimed.

-- Enqueueing (or re-queueing) wakes the workers that LISTEN on cft_training.
CREATE OR REPLACE FUNCTION train.training_run_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.status = 'queued' AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM 'queued') THEN
    PERFORM pg_notify('cft_training', NEW.id::text);
  END IF;
  IF TG_OP = 'UPDATE' AND NEW.cancel_requested AND NOT OLD.cancel_requested THEN
    PERFORM pg_notify('cft_training_cancel', NEW.id::text);
  END IF;
  RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER training_run_notify AFTER INSERT OR UPDATE OF status, cancel_requested
  ON train.training_run FOR EACH ROW EXECUTE FUNCTION train.training_run_notify();

-- Fail expired runs that have no attempts left; cancel expired runs whose cancel was requested.
CREATE OR REPLACE FUNCTION train.expire_training_runs() RETURNS int
LANGUAGE sql AS $$
  WITH expired AS (
    UPDATE train.training_run
       SET status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'failed' END,
           error = CASE WHEN cancel_requested THEN coalesce(error, 'cancelled')
                   ELSE format('lease expired %s times (worker %s stopped heartbeating); '
                               'giving up after max_attempts = %s',
                               attempts, coalesce(worker_id, '?'), max_attempts) END,
           finished_at = now(), lease_until = NULL, updated_at = now()
     WHERE status = 'running' AND lease_until < now()
       AND (attempts >= max_attempts OR cancel_requested)
    RETURNING 1)
  SELECT count(*)::int FROM expired
$$;

-- A worker claims one runnable run (queued, or running with an expired lease and attempts
-- left) that it can serve, or none. Several workers calling this at once never get the same
-- run. The worker passes its capacity: p_gpus devices, p_gpu_memory_gb on the smallest of them
-- (NULL: no GPU), p_device_kind ('cuda' or 'cpu'; NULL: unknown). Tenants take turns: the
-- tenant whose last run started longest ago (or never) goes first, and priority orders one
-- tenant's runs. Among runs of one priority the largest it can serve comes first, so a
-- multi-GPU worker is not kept busy by 1-GPU runs while a multi-GPU run waits.
CREATE OR REPLACE FUNCTION train.claim_training_run(
  p_worker text, p_lease interval, p_gpus int DEFAULT 1, p_gpu_memory_gb real DEFAULT NULL,
  p_device_kind text DEFAULT NULL, p_host text DEFAULT NULL, p_devices text DEFAULT NULL)
RETURNS SETOF train.training_run LANGUAGE plpgsql AS $$
BEGIN
  PERFORM train.expire_training_runs();
  IF p_host IS NOT NULL THEN
    INSERT INTO train.training_worker AS w
           (worker_id, host, devices, gpus, gpu_memory_gb, device_kind, seen_at, alive_until)
    VALUES (p_worker, p_host, coalesce(p_devices, ''), p_gpus, p_gpu_memory_gb, p_device_kind,
            now(), now() + p_lease)
    ON CONFLICT (worker_id) DO UPDATE
       SET host = EXCLUDED.host, devices = EXCLUDED.devices, gpus = EXCLUDED.gpus,
           gpu_memory_gb = EXCLUDED.gpu_memory_gb, device_kind = EXCLUDED.device_kind,
           seen_at = now(), alive_until = EXCLUDED.alive_until;
  END IF;
  RETURN QUERY
  UPDATE train.training_run r
     SET status = 'running', worker_id = p_worker, lease_until = now() + p_lease,
         attempts = r.attempts + 1, started_at = coalesce(r.started_at, now()),
         host = p_host, devices = p_devices,
         error = CASE WHEN r.status = 'running'
                      THEN format('attempt %s: lease of worker %s expired; reclaimed',
                                  r.attempts, coalesce(r.worker_id, '?'))
                      ELSE r.error END,
         updated_at = now()
   WHERE r.id = (SELECT q.id FROM train.training_run q
                  WHERE NOT q.cancel_requested
                    AND q.attempts < q.max_attempts
                    AND (q.status = 'queued' OR (q.status = 'running' AND q.lease_until < now()))
                    AND q.gpus <= p_gpus
                    AND (q.min_gpu_memory_gb IS NULL OR q.min_gpu_memory_gb <= p_gpu_memory_gb)
                    AND (q.device_kind IS NULL OR q.device_kind = p_device_kind)
                  -- Tenants take turns (the one served longest ago first); a run's priority
                  -- orders only its own tenant's runs, so no tenant starves the others.
                  ORDER BY (SELECT max(p.started_at) FROM train.training_run p
                             WHERE p.tenant_id = q.tenant_id) ASC NULLS FIRST,
                           q.priority DESC, q.gpus DESC, q.created_at, q.id
                  LIMIT 1 FOR UPDATE SKIP LOCKED)
  RETURNING r.*;
END
$$;

-- Every queued run with why it waits: no live worker, no live worker that can serve it (which
-- need is not met, against the live workers' capacity), or every worker able to serve it busy.
CREATE OR REPLACE VIEW train.training_run_wait AS
WITH live AS (
  SELECT w.*, EXISTS (SELECT 1 FROM train.training_run b
                       WHERE b.worker_id = w.worker_id AND b.status = 'running'
                         AND b.lease_until > now()) AS busy
    FROM train.training_worker w
), alive AS (
  SELECT * FROM live WHERE alive_until > now() OR busy
)
SELECT q.id, q.tenant_id, q.route, q.method, q.priority, q.gpus, q.min_gpu_memory_gb,
       q.device_kind, q.created_at, now() - q.created_at AS waiting_for,
       fit.able AS able_workers, fit.able_busy AS able_workers_busy,
       CASE
         WHEN NOT EXISTS (SELECT 1 FROM alive) THEN 'no live trainer worker'
         WHEN fit.able = 0 AND kind.n = 0 THEN
           format('needs device_kind %s; the live workers have %s', q.device_kind, kind.kinds)
         WHEN fit.able = 0 AND kind.max_gpus < q.gpus THEN
           format('needs %s devices in one worker; the largest live worker%s holds %s',
                  q.gpus, CASE WHEN q.device_kind IS NULL THEN ''
                               ELSE format(' of kind %s', q.device_kind) END, kind.max_gpus)
         WHEN fit.able = 0 AND q.min_gpu_memory_gb IS NOT NULL THEN
           format('needs %s GB per GPU on %s devices; the most on a live worker with %s devices'
                  ' is %s GB', q.min_gpu_memory_gb, q.gpus, q.gpus,
                  coalesce(kind.max_memory::text, 'none (no GPU)'))
         WHEN fit.able = 0 THEN 'no single live worker meets all its needs'
         WHEN fit.able_busy = fit.able THEN
           format('every live worker that can serve it is busy (%s)', fit.able)
         ELSE format('claimable: %s of %s able workers idle', fit.able - fit.able_busy, fit.able)
       END AS reason
  FROM train.training_run q
  CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE a.device_kind IS NOT DISTINCT FROM q.device_kind
                              OR q.device_kind IS NULL)::int AS n,
           string_agg(DISTINCT coalesce(a.device_kind, 'unknown'), ', ') AS kinds,
           max(a.gpus) FILTER (WHERE q.device_kind IS NULL OR a.device_kind = q.device_kind)
             AS max_gpus,
           max(a.gpu_memory_gb) FILTER (WHERE (q.device_kind IS NULL
                                               OR a.device_kind = q.device_kind)
                                              AND a.gpus >= q.gpus) AS max_memory
      FROM alive a) kind
  CROSS JOIN LATERAL (
    SELECT count(*)::int AS able, (count(*) FILTER (WHERE a.busy))::int AS able_busy
      FROM alive a
     WHERE q.gpus <= a.gpus
       AND (q.min_gpu_memory_gb IS NULL OR q.min_gpu_memory_gb <= a.gpu_memory_gb)
       AND (q.device_kind IS NULL OR q.device_kind = a.device_kind)) fit
 WHERE q.status = 'queued' AND NOT q.cancel_requested;

COMMENT ON TABLE train.training_worker IS
  'Trainer workers as last seen by a claim: capacity (devices, memory of the smallest GPU, kind) and liveness.';
COMMENT ON COLUMN train.training_worker.worker_id IS
  'The worker''s id, as it claims runs (training_run.worker_id).';
COMMENT ON COLUMN train.training_worker.host IS 'Host the worker runs on.';
COMMENT ON COLUMN train.training_worker.devices IS
  'Its devices: CUDA indices (0,1) or cpu slots (cpu+cpu).';
COMMENT ON COLUMN train.training_worker.gpus IS
  'How many devices it holds: it claims runs that need at most this many.';
COMMENT ON COLUMN train.training_worker.gpu_memory_gb IS
  'Memory of its smallest GPU in GiB (as torch reports it, or --gpu-memory-gb); NULL: no GPU.';
COMMENT ON COLUMN train.training_worker.device_kind IS 'cuda or cpu; NULL: unknown.';
COMMENT ON COLUMN train.training_worker.seen_at IS 'When it last asked for a run.';
COMMENT ON COLUMN train.training_worker.alive_until IS
  'Live until then (its last ask plus one lease); a worker holding a run '
  'with a live lease is live too.';
COMMENT ON FUNCTION train.claim_training_run(text, interval, int, real, text, text, text) IS
  'Claim one runnable run that a worker of this capacity can serve (FOR UPDATE SKIP LOCKED), or none.';
COMMENT ON VIEW train.training_run_wait IS
  'Every queued run with why it waits: no live worker, which need no live worker meets, or all able workers busy.';

COMMENT ON COLUMN train.training_run_wait.id IS 'The queued run (train.training_run.id).';
COMMENT ON COLUMN train.training_run_wait.tenant_id IS 'The tenant it trains for.';
COMMENT ON COLUMN train.training_run_wait.route IS 'The route its adapter is for.';
COMMENT ON COLUMN train.training_run_wait.method IS 'sft, dpo, kto, orpo or simpo.';
COMMENT ON COLUMN train.training_run_wait.priority IS 'Its priority: higher is claimed first.';
COMMENT ON COLUMN train.training_run_wait.gpus IS 'Devices it needs in one worker.';
COMMENT ON COLUMN train.training_run_wait.min_gpu_memory_gb IS
  'Least memory it needs on each GPU, in GiB; NULL: any.';
COMMENT ON COLUMN train.training_run_wait.device_kind IS
  'cuda or cpu, the kind of device it needs; NULL: any.';
COMMENT ON COLUMN train.training_run_wait.created_at IS 'When it was queued.';
COMMENT ON COLUMN train.training_run_wait.waiting_for IS
  'How long it has been queued (now() - created_at).';
COMMENT ON COLUMN train.training_run_wait.able_workers IS
  'Live trainer workers that meet all its needs (devices, memory per GPU, kind).';
COMMENT ON COLUMN train.training_run_wait.able_workers_busy IS
  'Of those, the ones holding a run with a live lease.';
COMMENT ON COLUMN train.training_run_wait.reason IS
  'Why it waits, in words: no live worker, which need no live worker '
  'meets, every able worker busy, or claimable (idle able workers).';

-- Renew a lease. Returns cancel_requested (true: stop), or NULL when the run is no longer
-- this worker's (reclaimed by another, or finished): the caller must stop either way.
CREATE OR REPLACE FUNCTION train.heartbeat_training_run(
  p_id uuid, p_worker text, p_lease interval, p_progress jsonb DEFAULT NULL)
RETURNS boolean LANGUAGE sql AS $$
  UPDATE train.training_run
     SET lease_until = now() + p_lease,
         progress = coalesce(p_progress, progress),
         updated_at = now()
   WHERE id = p_id AND worker_id = p_worker AND status = 'running'
  RETURNING cancel_requested
$$;

-- Mark a run succeeded (the caller inserts the adapter row in the same transaction).
-- Returns false when the run is not this worker's any more.
CREATE OR REPLACE FUNCTION train.finish_training_run(
  p_id uuid, p_worker text, p_adapter_id text, p_progress jsonb DEFAULT NULL)
RETURNS boolean LANGUAGE sql AS $$
  WITH done AS (
    UPDATE train.training_run
       SET status = 'succeeded', adapter_id = p_adapter_id, error = NULL,
           progress = coalesce(p_progress, progress),
           finished_at = now(), lease_until = NULL, updated_at = now()
     WHERE id = p_id AND worker_id = p_worker AND status = 'running'
    RETURNING 1)
  SELECT EXISTS (SELECT 1 FROM done)
$$;

-- Record a failed attempt. p_retry and attempts left: back to queued; otherwise failed.
-- A run whose cancel was requested ends cancelled. Returns the new status (NULL: not ours).
CREATE OR REPLACE FUNCTION train.fail_training_run(
  p_id uuid, p_worker text, p_error text, p_retry boolean DEFAULT false)
RETURNS text LANGUAGE sql AS $$
  UPDATE train.training_run
     SET status = CASE WHEN cancel_requested THEN 'cancelled'
                       WHEN p_retry AND attempts < max_attempts THEN 'queued'
                       ELSE 'failed' END,
         error = p_error,
         worker_id = CASE WHEN p_retry AND attempts < max_attempts AND NOT cancel_requested
                          THEN NULL ELSE worker_id END,
         finished_at = CASE WHEN p_retry AND attempts < max_attempts AND NOT cancel_requested
                            THEN NULL ELSE now() END,
         lease_until = NULL, updated_at = now()
   WHERE id = p_id AND worker_id = p_worker AND status = 'running'
  RETURNING status
$$;

-- Ask a run to stop: a queued run is cancelled at once, a running one when its worker sees it
-- (heartbeat) or its lease expires. Returns the run's status after the request.
CREATE OR REPLACE FUNCTION train.cancel_training_run(p_id uuid)
RETURNS text LANGUAGE sql AS $$
  UPDATE train.training_run
     SET cancel_requested = status IN ('queued', 'running') OR cancel_requested,
         status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE status END,
         finished_at = CASE WHEN status = 'queued' THEN now() ELSE finished_at END,
         error = CASE WHEN status = 'queued' THEN 'cancelled before it started' ELSE error END,
         updated_at = now()
   WHERE id = p_id
  RETURNING status
$$;
