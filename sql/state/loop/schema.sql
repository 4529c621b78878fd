-- The loop: per-route policy, a global control row, cycles with a state machine.
-- Every policy field has a default here, and only here: `{"enabled": true}` turns a route's loop
-- on; PUT /v1/routes/{route}/loop writes the fields it names and resets the others to DEFAULT.
CREATE SCHEMA IF NOT EXISTS loop;

-- The global kill switch and the platform-wide caps: exactly one row.
CREATE TABLE loop.control (
  id                      boolean PRIMARY KEY DEFAULT true CHECK (id),
  paused                  boolean NOT NULL DEFAULT false,
  reason                  text,
  changed_by              text,
  changed_at              timestamptz NOT NULL DEFAULT now(),
  max_concurrent_training int NOT NULL DEFAULT 2 CHECK (max_concurrent_training >= 0)
);
INSERT INTO loop.control (id) VALUES (true);

CREATE TABLE loop.policy (
  route                   text NOT NULL,
  tenant_id               int NOT NULL,
  enabled                 boolean NOT NULL DEFAULT false,
  paused                  boolean NOT NULL DEFAULT false,
  paused_reason           text,
  method                  text CHECK (method IN ('sft', 'dpo', 'kto', 'orpo', 'simpo')),
  min_new_examples        int NOT NULL DEFAULT 40 CHECK (min_new_examples >= 1),
  min_interval            interval NOT NULL DEFAULT '1 hour' CHECK (min_interval >= interval '0'),
  max_interval            interval CHECK (max_interval > interval '0'),
  decline_enabled         boolean NOT NULL DEFAULT true,
  decline_alpha           float8 NOT NULL DEFAULT 0.01 CHECK (decline_alpha > 0 AND decline_alpha < 0.5),
  decline_window          interval NOT NULL DEFAULT '1 day' CHECK (decline_window > interval '0'),
  decline_min_n           int NOT NULL DEFAULT 100 CHECK (decline_min_n >= 2),
  drift_enabled           boolean NOT NULL DEFAULT true,
  drift_distance          float8 NOT NULL DEFAULT 0.35 CHECK (drift_distance > 0 AND drift_distance <= 2),
  drift_share             float8 NOT NULL DEFAULT 0.3 CHECK (drift_share > 0 AND drift_share <= 1),
  drift_sample            int NOT NULL DEFAULT 200 CHECK (drift_sample BETWEEN 1 AND 10000),
  drift_min_n             int NOT NULL DEFAULT 50 CHECK (drift_min_n >= 1),
  max_cycles_per_day      int NOT NULL DEFAULT 4 CHECK (max_cycles_per_day >= 0),
  max_concurrent_training int NOT NULL DEFAULT 1 CHECK (max_concurrent_training >= 0),
  cooldown_after_reject   interval NOT NULL DEFAULT '6 hours' CHECK (cooldown_after_reject >= interval '0'),
  canary_pct              numeric(5,2) NOT NULL DEFAULT 10 CHECK (canary_pct > 0 AND canary_pct <= 100),
  canary_max_users        int NOT NULL DEFAULT 2000 CHECK (canary_max_users >= 1),
  canary_max_duration     interval NOT NULL DEFAULT '3 days' CHECK (canary_max_duration > interval '0'),
  decision_metric         text NOT NULL DEFAULT 'acceptance_rate'
                          CHECK (decision_metric IN ('feedback_mean', 'thumbs_up_rate', 'regen_rate', 'edit_rate', 'acceptance_rate')),
  decision_alpha          float8 NOT NULL DEFAULT 0.05 CHECK (decision_alpha > 0 AND decision_alpha < 0.5),
  decision_min_n          int NOT NULL DEFAULT 100 CHECK (decision_min_n >= 2),
  watch_window            interval NOT NULL DEFAULT '1 hour' CHECK (watch_window >= interval '0'),
  watch_alpha             float8 NOT NULL DEFAULT 0.01 CHECK (watch_alpha > 0 AND watch_alpha < 0.5),
  watch_min_n             int NOT NULL DEFAULT 50 CHECK (watch_min_n >= 2),
  eval_timeout            interval NOT NULL DEFAULT '2 hours' CHECK (eval_timeout > interval '0'),
  memory_tight            boolean NOT NULL DEFAULT false,
  hyperparameters         jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(hyperparameters) = 'object'),
  created_at              timestamptz NOT NULL DEFAULT now(),
  updated_at              timestamptz NOT NULL DEFAULT now(),
  updated_by              text,
  min_offline_gain        float8 NOT NULL DEFAULT 0.05 CHECK (min_offline_gain >= 0 AND min_offline_gain <= 1),
  FOREIGN KEY (route, tenant_id) REFERENCES serve.route (name, tenant_id) ON DELETE CASCADE,
  PRIMARY KEY (tenant_id, route)
);
