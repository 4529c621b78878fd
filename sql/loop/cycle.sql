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
COMMENT ON COLUMN loop.cycle.settings_tried IS
  'Each training setting the cycle tried: its hyperparameters, adapter, training run and held-out '
  'numbers against what the route serves (offline), and whether it was kept.';
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
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  PERFORM pg_notify('cft_loop', TG_TABLE_NAME);
  RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER cycle_notify AFTER INSERT ON loop.cycle
  FOR EACH ROW EXECUTE FUNCTION loop.notify();
CREATE OR REPLACE TRIGGER loop_training_run_notify AFTER UPDATE OF status ON train.training_run
  FOR EACH ROW WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled') AND OLD.status <> NEW.status)
  EXECUTE FUNCTION loop.notify();
CREATE OR REPLACE TRIGGER loop_eval_request_notify AFTER UPDATE OF status ON train.eval_request
  FOR EACH ROW WHEN (NEW.status IN ('done', 'failed') AND OLD.status <> NEW.status)
  EXECUTE FUNCTION loop.notify();
