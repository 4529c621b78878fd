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

CREATE TRIGGER training_run_notify AFTER INSERT OR UPDATE OF status, cancel_requested
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
-- left), or none. Several workers calling this at once never get the same run.
CREATE OR REPLACE FUNCTION train.claim_training_run(p_worker text, p_lease interval)
RETURNS SETOF train.training_run LANGUAGE plpgsql AS $$
BEGIN
  PERFORM train.expire_training_runs();
  RETURN QUERY
  UPDATE train.training_run r
     SET status = 'running', worker_id = p_worker, lease_until = now() + p_lease,
         attempts = r.attempts + 1, started_at = coalesce(r.started_at, now()),
         error = CASE WHEN r.status = 'running'
                      THEN format('attempt %s: lease of worker %s expired; reclaimed',
                                  r.attempts, coalesce(r.worker_id, '?'))
                      ELSE r.error END,
         updated_at = now()
   WHERE r.id = (SELECT q.id FROM train.training_run q
                  WHERE NOT q.cancel_requested
                    AND q.attempts < q.max_attempts
                    AND (q.status = 'queued' OR (q.status = 'running' AND q.lease_until < now()))
                  ORDER BY q.priority DESC, q.created_at, q.id
                  LIMIT 1 FOR UPDATE SKIP LOCKED)
  RETURNING r.*;
END
$$;

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
