-- Promotion from live traffic: per-route policy (off by default) and the audit of its decisions.
CREATE TABLE serve.experiment_policy (
  route                 text NOT NULL,
  tenant_id             int NOT NULL,
  enabled               boolean NOT NULL DEFAULT false,
  metric                text NOT NULL DEFAULT 'feedback_mean'
                        CHECK (metric IN ('feedback_mean', 'thumbs_up_rate', 'regen_rate', 'edit_rate',
                                          'acceptance_rate')),
  alpha                 float8 NOT NULL DEFAULT 0.05 CHECK (alpha > 0 AND alpha < 0.5),
  min_n                 int NOT NULL DEFAULT 1000 CHECK (min_n >= 2),
  window_size           interval NOT NULL DEFAULT '7 days' CHECK (window_size > interval '0'),
  max_ttft_p95_increase float8 CHECK (max_ttft_p95_increase IS NULL OR max_ttft_p95_increase >= 0)
                        DEFAULT 0.10,
  rollback_enabled      boolean NOT NULL DEFAULT true,
  created_at            timestamptz NOT NULL DEFAULT now(),
  updated_at            timestamptz NOT NULL DEFAULT now(),
  -- The sequential decision rule, its budget, the guards and the watch after promotion.
  mixture_sd            float8 CHECK (mixture_sd > 0),
  max_n_per_arm         bigint CHECK (max_n_per_arm >= 2),
  max_duration          interval DEFAULT '14 days' CHECK (max_duration > interval '0'),
  guard_regen_margin    float8 DEFAULT 0.02 CHECK (guard_regen_margin >= 0),
  guard_thumbs_down_margin float8 DEFAULT 0.02 CHECK (guard_thumbs_down_margin >= 0),
  guard_error_margin    float8 DEFAULT 0.01 CHECK (guard_error_margin >= 0),
  guard_tokens_out_margin float8 DEFAULT 0.25 CHECK (guard_tokens_out_margin >= 0),
  watch_window          interval NOT NULL DEFAULT '3 days' CHECK (watch_window > interval '0'),
  FOREIGN KEY (route, tenant_id) REFERENCES serve.route (name, tenant_id) ON DELETE CASCADE,
  PRIMARY KEY (tenant_id, route)
);

CREATE TABLE serve.experiment_decision (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  route       text NOT NULL,
  tenant_id   int NOT NULL,
  experiment  text NOT NULL,
  canary_id   text NOT NULL,
  control_id  text,
  action      text NOT NULL CHECK (action IN ('promote', 'rollback', 'hold', 'blocked')),
  code        text NOT NULL,
  metric      text NOT NULL,
  reason      text NOT NULL,
  numbers     jsonb NOT NULL DEFAULT '{}',
  decided_by  text NOT NULL DEFAULT current_user,
  decided_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX experiment_decision_route_idx ON serve.experiment_decision (route, decided_at);
CREATE INDEX experiment_decision_canary_idx ON serve.experiment_decision (canary_id, id);
