"""Training runs carry their resource needs; workers claim only runs they can serve.

train.training_run gains gpus (devices in one launch; > 1 runs through accelerate launch),
min_gpu_memory_gb and device_kind (the run's needs), and host and devices (where it was
trained). train.training_worker records each worker's capacity at every claim;
train.claim_training_run takes that capacity and filters in SQL (the old two-argument function
is replaced: its callers keep working through the defaults); train.training_run_wait says why a
queued run waits.

Revision ID: 20261209
Revises: 20261208
"""

from alembic import op

revision = "20261209"
down_revision = "20261208"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
ALTER TABLE train.training_run
  ADD COLUMN gpus int NOT NULL DEFAULT 1 CHECK (gpus BETWEEN 1 AND 64),
  ADD COLUMN min_gpu_memory_gb real CHECK (min_gpu_memory_gb > 0 AND min_gpu_memory_gb <= 4096),
  ADD COLUMN device_kind text CHECK (device_kind IN ('cuda', 'cpu')),
  ADD COLUMN host text,
  ADD COLUMN devices text;

DROP FUNCTION train.claim_training_run(text, interval);

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

-- A worker claims one runnable run (queued, or running with an expired lease and attempts
-- left) that it can serve, or none. Several workers calling this at once never get the same
-- run. The worker passes its capacity: p_gpus devices, p_gpu_memory_gb on the smallest of them
-- (NULL: no GPU), p_device_kind ('cuda' or 'cpu'; NULL: unknown). Among runs of one priority
-- the largest it can serve comes first, so a multi-GPU worker is not kept busy by 1-GPU runs
-- while a multi-GPU run waits.
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
                  ORDER BY q.priority DESC, q.gpus DESC, q.created_at, q.id
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

COMMENT ON COLUMN train.training_run.gpus IS
  'Devices the run trains on at once; more than 1 runs through accelerate launch (DDP or FSDP) on one worker holding that many.';
COMMENT ON COLUMN train.training_run.min_gpu_memory_gb IS
  'Least memory of each GPU the run needs, in GiB as torch reports it (NULL: any).';
COMMENT ON COLUMN train.training_run.device_kind IS
  'cuda or cpu: the kind of device the run needs (NULL: any).';
COMMENT ON COLUMN train.training_run.host IS 'Host of the worker that (last) claimed the run.';
COMMENT ON COLUMN train.training_run.devices IS
  'That worker''s devices: CUDA indices (0,1) or cpu slots (cpu+cpu).';
COMMENT ON TABLE train.training_worker IS
  'Trainer workers as last seen by a claim: capacity (devices, memory of the smallest GPU, kind) and liveness.';
COMMENT ON FUNCTION train.claim_training_run(text, interval, int, real, text, text, text) IS
  'Claim one runnable run that a worker of this capacity can serve (FOR UPDATE SKIP LOCKED), or none.';
COMMENT ON VIEW train.training_run_wait IS
  'Every queued run with why it waits: no live worker, which need no live worker meets, or all able workers busy.';
"""
DOWNGRADE_SQL = r"""
DROP VIEW train.training_run_wait;
DROP FUNCTION train.claim_training_run(text, interval, int, real, text, text, text);
DROP TABLE train.training_worker;
ALTER TABLE train.training_run
  DROP COLUMN gpus, DROP COLUMN min_gpu_memory_gb, DROP COLUMN device_kind,
  DROP COLUMN host, DROP COLUMN devices;

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
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
