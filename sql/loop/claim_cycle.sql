-- Driving cycles: claim one (SKIP LOCKED + lease), move it on (advance: a new state and what the
-- step produced, recorded in loop.cycle_event), let it wait (same state, checked again later),
-- or count a failed step. A claimed cycle whose worker stopped (lease expired) is resumed by the
-- next claim in its stored state, attempts + 1; at max_attempts it fails with the reason.

CREATE OR REPLACE FUNCTION loop.claim_cycle(p_worker text, p_lease interval)
RETURNS SETOF loop.cycle LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v loop.cycle;
  v_err text;
BEGIN
  FOR v IN SELECT * FROM "loop".cycle  -- quoted: PL/pgSQL ends a FOR's query at LOOP
            WHERE state NOT IN ('promoted', 'rejected', 'rolled_back', 'failed')
              AND worker_id IS NOT NULL AND lease_until < now() AND attempts + 1 >= max_attempts
            FOR UPDATE SKIP LOCKED LOOP
    v_err := format('worker %s stopped in state %s (lease expired at %s); gave up after %s attempts',
                    v.worker_id, v.state, v.lease_until, v.attempts + 1);
    UPDATE loop.cycle SET state = 'failed', error = v_err, attempts = attempts + 1,
           worker_id = NULL, lease_until = NULL, finished_at = now(), updated_at = now(),
           state_entered_at = now(), waiting_for = NULL
     WHERE id = v.id;
    INSERT INTO loop.cycle_event (cycle_id, tenant_id, from_state, to_state, worker_id, note)
    VALUES (v.id, v.tenant_id, v.state, 'failed', v.worker_id, v_err);
  END LOOP;

  SELECT * INTO v FROM loop.cycle q
   WHERE q.state NOT IN ('promoted', 'rejected', 'rolled_back', 'failed')
     AND q.next_step_at <= now() AND (q.worker_id IS NULL OR q.lease_until < now())
   ORDER BY q.next_step_at, q.id LIMIT 1 FOR UPDATE SKIP LOCKED;
  IF v.id IS NULL THEN
    RETURN;
  END IF;
  IF v.worker_id IS NOT NULL THEN
    v_err := format('attempt %s: worker %s stopped in state %s (lease expired at %s); resumed by %s',
                    v.attempts + 1, v.worker_id, v.state, v.lease_until, p_worker);
    INSERT INTO loop.cycle_event (cycle_id, tenant_id, from_state, to_state, worker_id, note)
    VALUES (v.id, v.tenant_id, v.state, v.state, p_worker, v_err);
  END IF;
  RETURN QUERY
  UPDATE loop.cycle c
     SET worker_id = p_worker, lease_until = now() + p_lease,
         attempts = c.attempts + CASE WHEN c.worker_id IS NOT NULL THEN 1 ELSE 0 END,
         error = coalesce(v_err, c.error), updated_at = now()
   WHERE c.id = v.id
  RETURNING c.*;
END
$$;

-- Move a cycle this worker holds to p_to, storing p_set (columns of loop.cycle by name) and
-- recording the transition with p_inputs; releases it for the next step. Raises
-- object_not_in_prerequisite_state when the cycle is not this worker's any more.
CREATE OR REPLACE FUNCTION loop.advance_cycle(p_id bigint, p_worker text, p_to text,
                                              p_set jsonb DEFAULT '{}', p_inputs jsonb DEFAULT '{}',
                                              p_note text DEFAULT NULL)
RETURNS loop.cycle LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_from text;
  c      loop.cycle;
BEGIN
  SELECT state INTO v_from FROM loop.cycle WHERE id = p_id AND worker_id = p_worker FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'loop cycle % is not held by worker %', p_id, p_worker
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  UPDATE loop.cycle c0
     SET (signal_counts, method, method_reason, hyperparameters, snapshot_id, snapshot_counts,
          n_train, n_eval, training_run_id, adapter_id, current_prod_id, eval_scores, blockers,
          canary_pct, canary_started_at, experiment, decision, decision_code, decision_reason,
          previous_prod_id, promoted_at, watch_until, watch, error, settings_tried)
       = (SELECT r.signal_counts, r.method, r.method_reason, r.hyperparameters, r.snapshot_id,
                 r.snapshot_counts, r.n_train, r.n_eval, r.training_run_id, r.adapter_id,
                 r.current_prod_id, r.eval_scores, r.blockers, r.canary_pct, r.canary_started_at,
                 r.experiment, r.decision, r.decision_code, r.decision_reason, r.previous_prod_id,
                 r.promoted_at, r.watch_until, r.watch, r.error, r.settings_tried
            FROM jsonb_populate_record(c0, p_set) r),
         state = p_to,
         state_entered_at = CASE WHEN p_to <> v_from THEN now() ELSE c0.state_entered_at END,
         finished_at = CASE WHEN p_to IN ('promoted', 'rejected', 'rolled_back', 'failed')
                            THEN now() END,
         worker_id = NULL, lease_until = NULL, next_step_at = now(), waiting_for = NULL,
         updated_at = now()
   WHERE c0.id = p_id
  RETURNING * INTO c;
  INSERT INTO loop.cycle_event (cycle_id, tenant_id, from_state, to_state, worker_id, inputs, note)
  VALUES (p_id, c.tenant_id, v_from, p_to, p_worker, coalesce(p_inputs, '{}'), p_note);
  RETURN c;
END
$$;

-- The step cannot finish yet (training, evaluating, collecting canary traffic): store p_set,
-- say what it waits for, and check again after p_delay. No event (waiting_for shows it).
CREATE OR REPLACE FUNCTION loop.wait_cycle(p_id bigint, p_worker text, p_delay interval,
                                           p_waiting_for text, p_set jsonb DEFAULT '{}')
RETURNS boolean LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  UPDATE loop.cycle c0
     SET (experiment, watch, training_run_id, eval_scores)
       = (SELECT r.experiment, r.watch, r.training_run_id, r.eval_scores
            FROM jsonb_populate_record(c0, p_set) r),
         waiting_for = p_waiting_for, next_step_at = now() + p_delay,
         worker_id = NULL, lease_until = NULL, updated_at = now()
   WHERE c0.id = p_id AND c0.worker_id = p_worker;
  RETURN FOUND;
END
$$;

-- A step raised: count the attempt; retry after a pause, or fail the cycle at max_attempts.
-- Returns the state the cycle is in afterwards (NULL: not this worker's).
CREATE OR REPLACE FUNCTION loop.fail_step(p_id bigint, p_worker text, p_error text,
                                          p_final boolean DEFAULT false)
RETURNS text LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v loop.cycle;
BEGIN
  SELECT * INTO v FROM loop.cycle WHERE id = p_id AND worker_id = p_worker FOR UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF p_final OR v.attempts + 1 >= v.max_attempts THEN
    UPDATE loop.cycle SET state = 'failed', attempts = attempts + 1,
           error = format('%s failed: %s', v.state, p_error) ||
                   CASE WHEN p_final THEN '' ELSE format(' (after %s attempts)', v.attempts + 1) END,
           worker_id = NULL, lease_until = NULL, finished_at = now(), state_entered_at = now(),
           waiting_for = NULL, updated_at = now()
     WHERE id = p_id;
    INSERT INTO loop.cycle_event (cycle_id, tenant_id, from_state, to_state, worker_id, note)
    VALUES (p_id, v.tenant_id, v.state, 'failed', p_worker, p_error);
    RETURN 'failed';
  END IF;
  UPDATE loop.cycle SET attempts = attempts + 1,
         error = format('attempt %s in state %s: %s', v.attempts + 1, v.state, p_error),
         worker_id = NULL, lease_until = NULL,
         next_step_at = now() + least(interval '5 minutes', (v.attempts + 1) * interval '5 seconds'),
         updated_at = now()
   WHERE id = p_id;
  INSERT INTO loop.cycle_event (cycle_id, tenant_id, from_state, to_state, worker_id, note)
  VALUES (p_id, v.tenant_id, v.state, v.state, p_worker, 'step failed, will retry: ' || p_error);
  RETURN v.state;
END
$$;
