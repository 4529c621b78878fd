-- The default calls a function of sql/, so it is code: cft migrate drops it with the
-- functions and sets it again here.
ALTER TABLE train.promotion_policy
  ALTER COLUMN trusted_authors SET DEFAULT train.default_trusted_authors();

COMMENT ON COLUMN train.promotion_policy.id IS 'The rule''s number.';
COMMENT ON COLUMN train.promotion_policy.route IS
  'The route the rule is for; NULL: every route (a route''s own rule overrides it '
  'for the same suite and metric).';
COMMENT ON COLUMN train.promotion_policy.suite_id IS
  'The suite compared (eval_result.suite_id); heldout:snapshot: the eval split of '
  'the candidate''s own snapshot.';
COMMENT ON COLUMN train.promotion_policy.metric IS 'The metric compared (eval_result.metric).';
COMMENT ON COLUMN train.promotion_policy.direction IS
  'Which way is better: higher or lower; ignore: not compared.';
COMMENT ON COLUMN train.promotion_policy.tolerance IS
  'Regression allowed, relative to |current score| (default 0.02: 2 %).';
COMMENT ON COLUMN train.promotion_policy.required IS
  'The candidate needs a finite result from a trusted author on it; false: compared when '
  'present, required for nothing.';
COMMENT ON COLUMN train.promotion_policy.created_at IS 'When the rule was written.';
COMMENT ON COLUMN train.promotion_policy.trusted_authors IS
  'The author_role values whose results satisfy the rule (default evaluator, owner).';
COMMENT ON COLUMN train.promotion_policy.min_judge_kappa IS
  'A judge-scored result counts only from a judge whose latest calibration on the suite has at '
  'least this Cohen''s kappa (default 0.6).';
COMMENT ON COLUMN train.promotion_policy.tenant_id IS
  'The tenant of the route; NULL for a rule of every route.';
