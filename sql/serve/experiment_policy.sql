-- Promotion from live traffic: per-route policy (off by default) and the audit of its decisions.
CREATE TABLE serve.experiment_policy (
  route                 text PRIMARY KEY,
  tenant_id             int NOT NULL,
  enabled               boolean NOT NULL DEFAULT false,
  metric                text NOT NULL DEFAULT 'feedback_mean'
                        CHECK (metric IN ('feedback_mean', 'thumbs_up_rate', 'regen_rate', 'edit_rate')),
  alpha                 float8 NOT NULL DEFAULT 0.05 CHECK (alpha > 0 AND alpha < 0.5),
  min_n                 int NOT NULL DEFAULT 1000 CHECK (min_n >= 2),
  window_size           interval NOT NULL DEFAULT '7 days' CHECK (window_size > interval '0'),
  guard_regen           boolean NOT NULL DEFAULT true,
  max_ttft_p95_increase float8 CHECK (max_ttft_p95_increase IS NULL OR max_ttft_p95_increase >= 0)
                        DEFAULT 0.10,
  rollback_enabled      boolean NOT NULL DEFAULT true,
  created_at            timestamptz NOT NULL DEFAULT now(),
  updated_at            timestamptz NOT NULL DEFAULT now(),
  FOREIGN KEY (route, tenant_id) REFERENCES serve.route (name, tenant_id) ON DELETE CASCADE
);
COMMENT ON TABLE serve.experiment_policy IS
  'Automatic promotion/rollback of a route''s canaries from live traffic (serve.experiment_autopolicy).';
COMMENT ON COLUMN serve.experiment_policy.enabled IS 'Off by default: nothing happens until it is true.';
COMMENT ON COLUMN serve.experiment_policy.metric IS 'The metric of obs.experiment_compare that decides.';
COMMENT ON COLUMN serve.experiment_policy.alpha IS 'Significance level: act only when p < alpha.';
COMMENT ON COLUMN serve.experiment_policy.min_n IS
  'Minimum sample per arm, in the metric''s unit (rated rows for feedback metrics, rows otherwise).';
COMMENT ON COLUMN serve.experiment_policy.window_size IS 'Traffic window the decision looks at.';
COMMENT ON COLUMN serve.experiment_policy.guard_regen IS
  'Never promote a canary whose regeneration rate is significantly higher than prod''s.';
COMMENT ON COLUMN serve.experiment_policy.max_ttft_p95_increase IS
  'Never promote a canary whose ttft p95 exceeds prod''s by more than this share (NULL = no guard).';
COMMENT ON COLUMN serve.experiment_policy.rollback_enabled IS
  'Retire a canary that is significantly worse on the metric (or on regeneration).';

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
COMMENT ON TABLE serve.experiment_decision IS
  'Every automatic decision of the experiment policy with its numbers. A hold or blocked decision '
  'is recorded when it differs (action, code) from the canary''s previous one.';
COMMENT ON COLUMN serve.experiment_decision.action IS
  'promote (became prod through the gate), rollback (canary retired), hold (not yet), blocked (the gate refused).';
COMMENT ON COLUMN serve.experiment_decision.code IS
  'Why, as a stable code: promoted, rolled_back, insufficient_sample, not_significant, guard_regen, '
  'guard_ttft_p95, gate_refused, no_control, control_not_prod.';
COMMENT ON COLUMN serve.experiment_decision.numbers IS
  'The obs.experiment_compare rows (metric and guards) the decision was taken on.';

ALTER TABLE serve.experiment_policy ENABLE ROW LEVEL SECURITY;
ALTER TABLE serve.experiment_decision ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON serve.experiment_policy TO cft_app
  USING (tenant_id = auth.current_tenant_id()) WITH CHECK (tenant_id = auth.current_tenant_id());
CREATE POLICY tenant_isolation ON serve.experiment_decision TO cft_app
  USING (tenant_id = auth.current_tenant_id()) WITH CHECK (tenant_id = auth.current_tenant_id());
CREATE POLICY read_all ON serve.experiment_policy FOR SELECT TO cft_dashboard, cft_release USING (true);
CREATE POLICY read_all ON serve.experiment_decision FOR SELECT TO cft_dashboard, cft_release USING (true);
CREATE POLICY release_write ON serve.experiment_decision FOR INSERT TO cft_release WITH CHECK (true);

GRANT SELECT, INSERT, UPDATE, DELETE ON serve.experiment_policy TO cft_app;
GRANT SELECT, INSERT ON serve.experiment_decision TO cft_app, cft_release;
GRANT SELECT ON serve.experiment_policy TO cft_release, cft_dashboard;
GRANT SELECT ON serve.experiment_decision TO cft_dashboard;
