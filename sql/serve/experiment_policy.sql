COMMENT ON TABLE serve.experiment_policy IS
  'Automatic promotion/rollback of a route''s canaries from live traffic (serve.experiment_autopolicy).';
COMMENT ON COLUMN serve.experiment_policy.route IS 'The route whose canaries the policy decides.';
COMMENT ON COLUMN serve.experiment_policy.tenant_id IS 'The route''s tenant.';
COMMENT ON COLUMN serve.experiment_policy.created_at IS 'When the policy was written.';
COMMENT ON COLUMN serve.experiment_policy.updated_at IS
  'Last change, as the writer sets it (now() at insert; no trigger keeps it).';
COMMENT ON COLUMN serve.experiment_policy.enabled IS 'Off by default: nothing happens until it is true.';
COMMENT ON COLUMN serve.experiment_policy.metric IS
  'The primary metric: its always-valid test (obs.sequential_compare) decides promote or retire.';
COMMENT ON COLUMN serve.experiment_policy.alpha IS
  'Error bound of every automatic decision: the always-valid (mSPRT) test acts when its p-value '
  '<= alpha, which keeps the false-positive rate <= alpha however often the policy checks.';
COMMENT ON COLUMN serve.experiment_policy.min_n IS
  'Floor: no decision before both arms have this sample, in the metric''s unit (rated rows for '
  'feedback metrics, rows otherwise); it keeps the plug-in variances of the test honest.';
COMMENT ON COLUMN serve.experiment_policy.window_size IS
  'Window of the fixed-horizon numbers shown with a decision (obs.experiment_compare), for '
  'reading only: the decision itself uses all the canary''s traffic since its first row.';
COMMENT ON COLUMN serve.experiment_policy.max_ttft_p95_increase IS
  'Guard: the canary''s ttft p95 may exceed prod''s by at most this share (default 10 %); tripped '
  'when its share of rows above prod p95 x (1 + this) is significantly above 5 % (NULL = guard off).';
COMMENT ON COLUMN serve.experiment_policy.rollback_enabled IS
  'Retire a canary that loses, breaks a guard or runs out of budget, and roll back a new prod '
  'that breaks a guard during watch_window (serve.rollback); off = record the decision only.';
COMMENT ON COLUMN serve.experiment_policy.mixture_sd IS
  'tau of the primary metric''s mSPRT: the effect size the test is tuned for (NULL = 0.05 for '
  'rates, 0.1 for feedback_mean). Fixed before the data; any value keeps the error bound.';
COMMENT ON COLUMN serve.experiment_policy.max_n_per_arm IS
  'Sample budget: a canary undecided once both arms have this many (metric unit) is retired '
  '(NULL = no sample budget).';
COMMENT ON COLUMN serve.experiment_policy.max_duration IS
  'Time budget: a canary undecided this long after its first row is retired (default 14 days; '
  'NULL = none).';
COMMENT ON COLUMN serve.experiment_policy.guard_regen_margin IS
  'Guard: regeneration rate may rise by at most this (absolute, default 2 points; NULL = off).';
COMMENT ON COLUMN serve.experiment_policy.guard_thumbs_down_margin IS
  'Guard: thumbs-down rate of rated rows may rise by at most this (default 2 points; NULL = off).';
COMMENT ON COLUMN serve.experiment_policy.guard_error_margin IS
  'Guard: share of rows with status error or partial may rise by at most this (default 1 point; '
  'NULL = off).';
COMMENT ON COLUMN serve.experiment_policy.guard_tokens_out_margin IS
  'Guard: mean answer length (tokens_out) may grow by at most this share of prod''s (default '
  '25 %; NULL = off); shorter answers trip nothing (a length limit may be what users want).';
COMMENT ON COLUMN serve.experiment_policy.watch_window IS
  'After a promotion, serve.watch_decision compares the new prod with the prod it replaced on '
  'the guards for this long (the previous prod''s baseline: the same length before promotion).';
COMMENT ON TABLE serve.experiment_decision IS
  'Every automatic decision of the experiment policy with its numbers. A hold or blocked decision '
  'is recorded when it differs (action, code) from the canary''s previous one.';
COMMENT ON COLUMN serve.experiment_decision.id IS 'Decision number, in order.';
COMMENT ON COLUMN serve.experiment_decision.route IS 'The route decided on.';
COMMENT ON COLUMN serve.experiment_decision.tenant_id IS 'The route''s tenant.';
COMMENT ON COLUMN serve.experiment_decision.experiment IS
  'Experiment name of the traffic read (serve.route.experiment, or the route name).';
COMMENT ON COLUMN serve.experiment_decision.canary_id IS
  'The canary decided on; for a watch decision (code watch_* or rollback_refused), the new prod.';
COMMENT ON COLUMN serve.experiment_decision.control_id IS
  'What it was compared with: the control arm (the prod, or the base model of a route without '
  'one), or for a watch the prod it replaced; NULL: none.';
COMMENT ON COLUMN serve.experiment_decision.metric IS
  'The policy''s primary metric when it decided.';
COMMENT ON COLUMN serve.experiment_decision.reason IS
  'The decision in words, with the numbers behind it.';
COMMENT ON COLUMN serve.experiment_decision.decided_by IS
  'The SQL role that recorded it (the one running serve.experiment_autopolicy).';
COMMENT ON COLUMN serve.experiment_decision.decided_at IS 'When (the clock time).';
COMMENT ON COLUMN serve.experiment_decision.action IS
  'promote (became prod through the gate), rollback (canary retired), hold (not yet), blocked (the gate refused).';
COMMENT ON COLUMN serve.experiment_decision.code IS
  'Why, as a stable code: promoted, significantly_worse, budget_exhausted, guard_<guard> (regen, '
  'thumbs_down, error, tokens_out, ttft_p95), insufficient_sample, not_significant, gate_refused, '
  'no_control, control_not_prod; after a promotion watch_<code> of serve.watch_decision '
  '(watch_guard_<guard> = rolled back), rollback_refused.';
COMMENT ON COLUMN serve.experiment_decision.numbers IS
  'The numbers of serve.canary_decision / serve.watch_decision: the primary metric''s always-valid '
  'test, every guard with its margin, the sequential comparisons, the fixed-horizon row (reading '
  'only) and the policy.';

ALTER TABLE serve.experiment_policy ENABLE ROW LEVEL SECURITY;
ALTER TABLE serve.experiment_decision ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON serve.experiment_policy;
CREATE POLICY tenant_isolation ON serve.experiment_policy TO cft_app
  USING (tenant_id = auth.current_tenant_id()) WITH CHECK (tenant_id = auth.current_tenant_id());
DROP POLICY IF EXISTS tenant_isolation ON serve.experiment_decision;
CREATE POLICY tenant_isolation ON serve.experiment_decision TO cft_app
  USING (tenant_id = auth.current_tenant_id()) WITH CHECK (tenant_id = auth.current_tenant_id());
DROP POLICY IF EXISTS read_all ON serve.experiment_policy;
CREATE POLICY read_all ON serve.experiment_policy FOR SELECT TO cft_dashboard, cft_release USING (true);
DROP POLICY IF EXISTS read_all ON serve.experiment_decision;
CREATE POLICY read_all ON serve.experiment_decision FOR SELECT TO cft_dashboard, cft_release USING (true);
DROP POLICY IF EXISTS release_write ON serve.experiment_decision;
CREATE POLICY release_write ON serve.experiment_decision FOR INSERT TO cft_release WITH CHECK (true);

GRANT SELECT, INSERT, UPDATE, DELETE ON serve.experiment_policy TO cft_app;
GRANT SELECT, INSERT ON serve.experiment_decision TO cft_app, cft_release;
GRANT SELECT ON serve.experiment_policy TO cft_release, cft_dashboard;
GRANT SELECT ON serve.experiment_decision TO cft_dashboard;
