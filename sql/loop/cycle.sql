-- A cycle: one pass of the loop on one route, a row with a state machine
--   triggered -> snapshot -> training -> evaluating -> canary -> deciding -> watching
--     -> promoted | rejected | rolled_back | failed
-- driven by `cft worker loop` (workers/loop). A worker claims a cycle (FOR UPDATE SKIP LOCKED,
-- with a lease), runs one step of its state and releases it; a worker that dies holding it is
-- replaced after its lease (attempts + 1), and after max_attempts the cycle fails readably.
-- Each step stores what it made before the state moves on (snapshot_id, training_run_id,
-- adapter_id), so a resumed step finds its own work instead of doing it twice.
CREATE TABLE loop.cycle (
  id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant_id         int NOT NULL,
  route             text NOT NULL,
  state             text NOT NULL DEFAULT 'triggered'
                    CHECK (state IN ('triggered', 'snapshot', 'training', 'evaluating', 'canary',
                                     'deciding', 'watching', 'promoted', 'rejected',
                                     'rolled_back', 'failed')),
  trigger           text NOT NULL
                    CHECK (trigger IN ('volume', 'schedule', 'decline', 'drift', 'forget', 'manual')),
  trigger_values    jsonb NOT NULL DEFAULT '{}',   -- every trigger and limit when it started
  policy            jsonb NOT NULL DEFAULT '{}',   -- the policy it runs under (frozen at start)
  signal_counts     jsonb,                         -- what the method rule read
  method            text CHECK (method IN ('sft', 'dpo', 'kto', 'orpo', 'simpo')),
  method_reason     text,
  hyperparameters   jsonb,                         -- as enqueued (after scaling and overrides)
  snapshot_id       uuid,
  snapshot_counts   jsonb,
  n_train           int,
  n_eval            int,
  training_run_id   uuid,
  adapter_id        text,
  current_prod_id   text,                          -- the prod the candidate competes with
  eval_scores       jsonb,
  blockers          jsonb,
  canary_pct        numeric(5,2),
  canary_started_at timestamptz,
  experiment        jsonb,                         -- the numbers the decision read
  decision          text CHECK (decision IN ('promote', 'retire', 'reject', 'rollback', 'keep')),
  decision_code     text,
  decision_reason   text,
  previous_prod_id  text,
  promoted_at       timestamptz,
  watch_until       timestamptz,
  watch             jsonb,                         -- the guard numbers of the watch
  forget_request_id bigint,
  error             text,
  waiting_for       text,                          -- what the current step waits for
  worker_id         text,
  lease_until       timestamptz,
  attempts          int NOT NULL DEFAULT 0,
  max_attempts      int NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
  next_step_at      timestamptz NOT NULL DEFAULT now(),  -- a waiting step is retried from then
  state_entered_at  timestamptz NOT NULL DEFAULT now(),
  created_at        timestamptz NOT NULL DEFAULT now(),
  updated_at        timestamptz NOT NULL DEFAULT now(),
  finished_at       timestamptz,
  FOREIGN KEY (route, tenant_id) REFERENCES serve.route (name, tenant_id) ON DELETE CASCADE
);
-- At most one cycle in flight per route (watching included: a new cycle waits for the watch).
CREATE UNIQUE INDEX cycle_one_active_per_route ON loop.cycle (route)
  WHERE state NOT IN ('promoted', 'rejected', 'rolled_back', 'failed');
CREATE INDEX cycle_route_created_idx ON loop.cycle (route, created_at);
CREATE INDEX cycle_adapter_idx ON loop.cycle (adapter_id) WHERE adapter_id IS NOT NULL;
CREATE INDEX cycle_runnable_idx ON loop.cycle (next_step_at)
  WHERE state NOT IN ('promoted', 'rejected', 'rolled_back', 'failed');
COMMENT ON TABLE loop.cycle IS
  'One pass of the loop on a route: trigger, method, snapshot, run, adapter, evals, canary, '
  'decision, watch; state moves triggered -> ... -> promoted | rejected | rolled_back | failed.';
COMMENT ON COLUMN loop.cycle.id IS 'The cycle''s number (cycle N in audit reasons and actors).';
COMMENT ON COLUMN loop.cycle.tenant_id IS 'The route''s tenant.';
COMMENT ON COLUMN loop.cycle.route IS 'The route it runs on.';
COMMENT ON COLUMN loop.cycle.state IS
  'Its step: triggered, snapshot, training, evaluating, canary, deciding, watching; finished: '
  'promoted, rejected, rolled_back, failed.';
COMMENT ON COLUMN loop.cycle.trigger IS
  'What started it: forget, decline, drift, volume or schedule (the first that fired; or manual).';
COMMENT ON COLUMN loop.cycle.trigger_values IS
  'Every trigger and limit when it started (loop.triggers, loop.limits), and '
  'the line of the one that fired.';
COMMENT ON COLUMN loop.cycle.policy IS
  'The loop policy when it started, for the record (steps read the route''s policy now).';
COMMENT ON COLUMN loop.cycle.signal_counts IS
  'The usable examples per signal the method rule read: new since '
  'the previous cycle, and in total.';
COMMENT ON COLUMN loop.cycle.method IS 'The method chosen: sft, dpo, kto, orpo or simpo.';
COMMENT ON COLUMN loop.cycle.method_reason IS 'Why that method (app/loop/method.py).';
COMMENT ON COLUMN loop.cycle.hyperparameters IS
  'The hyperparameters enqueued: scaled to the snapshot''s size, then the policy''s overrides.';
COMMENT ON COLUMN loop.cycle.snapshot_id IS 'The snapshot it froze (train.dataset_snapshot.id).';
COMMENT ON COLUMN loop.cycle.snapshot_counts IS
  'That snapshot''s counts (rows left after each step).';
COMMENT ON COLUMN loop.cycle.n_train IS 'That snapshot''s training examples.';
COMMENT ON COLUMN loop.cycle.n_eval IS 'That snapshot''s eval examples.';
COMMENT ON COLUMN loop.cycle.training_run_id IS
  'The training run it queued (train.training_run.id), stored at once so a '
  'resumed step does not queue another.';
COMMENT ON COLUMN loop.cycle.adapter_id IS 'The candidate adapter the run registered.';
COMMENT ON COLUMN loop.cycle.current_prod_id IS
  'The prod the candidate competes with (when the method was chosen, then when '
  'the gate was asked); NULL: none.';
COMMENT ON COLUMN loop.cycle.eval_scores IS
  'The candidate''s eval results when the gate was asked: {suite/metric: score}.';
COMMENT ON COLUMN loop.cycle.blockers IS
  'The gate''s blockers then (serve.promotion_blockers rows); empty: it holds.';
COMMENT ON COLUMN loop.cycle.canary_pct IS
  'The canary''s share of users as opened, in %: the policy''s, less if the '
  'route''s ceiling had less room.';
COMMENT ON COLUMN loop.cycle.canary_started_at IS
  'When the canary opened: its budget and the final look count from then.';
COMMENT ON COLUMN loop.cycle.experiment IS
  'The numbers the canary decision read (always-valid test, budget, '
  'canary users, fixed-horizon look).';
COMMENT ON COLUMN loop.cycle.decision IS
  'promote (through the gate), retire (the canary lost), reject (refused by the gate or the '
  'canary) or rollback (the watch).';
COMMENT ON COLUMN loop.cycle.decision_code IS
  'Why, as a code: the decision rule''s (e.g. significantly_better, guard_regen, '
  'budget_non_inferior), or gate, gate_refused, canary_refused, forget.';
COMMENT ON COLUMN loop.cycle.decision_reason IS
  'The decision in words, with the numbers behind it.';
COMMENT ON COLUMN loop.cycle.previous_prod_id IS
  'The prod the promotion replaced (serve.adapter.previous_prod_id): what a rollback restores.';
COMMENT ON COLUMN loop.cycle.promoted_at IS 'When the candidate became prod.';
COMMENT ON COLUMN loop.cycle.watch_until IS 'End of the watch: promoted_at + watch_window.';
COMMENT ON COLUMN loop.cycle.watch IS
  'The guard numbers of the watch (serve.watch_decision, or loop.watch_verdict).';
COMMENT ON COLUMN loop.cycle.forget_request_id IS
  'A forget cycle: the auth.forget_request that tainted the prod '
  '(forget_to_live_s counts from it).';
COMMENT ON COLUMN loop.cycle.error IS
  'Why it failed, or what went wrong in the last attempt (a failed step, a stopped worker).';
COMMENT ON COLUMN loop.cycle.waiting_for IS
  'What the current step waits for (a training slot, the trainer, the evaluator, '
  'canary traffic); NULL: not waiting.';
COMMENT ON COLUMN loop.cycle.worker_id IS 'The loop worker that holds it now; NULL between steps.';
COMMENT ON COLUMN loop.cycle.lease_until IS
  'End of that worker''s lease; past it another worker resumes the cycle (attempts + 1).';
COMMENT ON COLUMN loop.cycle.attempts IS 'Failed steps and stopped workers so far.';
COMMENT ON COLUMN loop.cycle.max_attempts IS
  'Attempts allowed (default 5): then the cycle fails with the reason.';
COMMENT ON COLUMN loop.cycle.next_step_at IS
  'When its step is due: a waiting or failed step is tried again from then.';
COMMENT ON COLUMN loop.cycle.state_entered_at IS
  'When it entered its state (eval_timeout counts from it).';
COMMENT ON COLUMN loop.cycle.created_at IS
  'When it started (max_cycles_per_day and min_interval count these).';
COMMENT ON COLUMN loop.cycle.updated_at IS 'Last change of the row.';
COMMENT ON COLUMN loop.cycle.finished_at IS
  'When it reached promoted, rejected, rolled_back or failed.';

-- Every transition with what it was decided on.
CREATE TABLE loop.cycle_event (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  cycle_id    bigint NOT NULL REFERENCES loop.cycle(id) ON DELETE CASCADE,
  tenant_id   int NOT NULL,
  from_state  text,
  to_state    text NOT NULL,
  worker_id   text,
  inputs      jsonb NOT NULL DEFAULT '{}',
  note        text,
  at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX cycle_event_cycle_idx ON loop.cycle_event (cycle_id, id);
COMMENT ON COLUMN loop.cycle_event.id IS 'Event number, in order.';
COMMENT ON COLUMN loop.cycle_event.cycle_id IS 'The cycle (loop.cycle.id).';
COMMENT ON COLUMN loop.cycle_event.tenant_id IS 'The cycle''s tenant.';
COMMENT ON COLUMN loop.cycle_event.from_state IS 'State before; NULL when the cycle started.';
COMMENT ON COLUMN loop.cycle_event.to_state IS
  'State after (the same as from_state for a retried or resumed step).';
COMMENT ON COLUMN loop.cycle_event.worker_id IS
  'The loop worker that made the transition; NULL when the cycle started.';
COMMENT ON COLUMN loop.cycle_event.inputs IS
  'What it was decided on: the step''s results, or every trigger and limit when the cycle started.';
COMMENT ON COLUMN loop.cycle_event.note IS
  'A line for people: why (the step''s note, or the error).';
COMMENT ON COLUMN loop.cycle_event.at IS 'When (the clock time).';

-- Wake loop workers (LISTEN cft_loop): a cycle started, a training run or an eval request ended.
CREATE OR REPLACE FUNCTION loop.notify() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public AS $$
BEGIN
  PERFORM pg_notify('cft_loop', TG_TABLE_NAME);
  RETURN NULL;
END
$$;
CREATE TRIGGER cycle_notify AFTER INSERT ON loop.cycle
  FOR EACH ROW EXECUTE FUNCTION loop.notify();
CREATE TRIGGER loop_training_run_notify AFTER UPDATE OF status ON train.training_run
  FOR EACH ROW WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled') AND OLD.status <> NEW.status)
  EXECUTE FUNCTION loop.notify();
CREATE TRIGGER loop_eval_request_notify AFTER UPDATE OF status ON train.eval_request
  FOR EACH ROW WHEN (NEW.status IN ('done', 'failed') AND OLD.status <> NEW.status)
  EXECUTE FUNCTION loop.notify();
