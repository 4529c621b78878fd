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
  settings_tried    jsonb,                         -- each training setting with its held-out numbers
  FOREIGN KEY (route, tenant_id) REFERENCES serve.route (name, tenant_id) ON DELETE CASCADE
);
-- At most one cycle in flight per route (watching included: a new cycle waits for the watch).
CREATE UNIQUE INDEX cycle_one_active_per_route ON loop.cycle (tenant_id, route)
  WHERE state NOT IN ('promoted', 'rejected', 'rolled_back', 'failed');
CREATE INDEX cycle_route_created_idx ON loop.cycle (route, created_at);
CREATE INDEX cycle_adapter_idx ON loop.cycle (adapter_id) WHERE adapter_id IS NOT NULL;
CREATE INDEX cycle_runnable_idx ON loop.cycle (next_step_at)
  WHERE state NOT IN ('promoted', 'rejected', 'rolled_back', 'failed');

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
