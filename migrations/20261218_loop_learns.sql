-- The loop learns on products it has never seen: the acceptance rate as a decision metric (and
-- the default one), the offline gain a candidate needs before its canary, the settings a cycle
-- tried, the arm statistics behind the acceptance rate, and the held-out answer similarity
-- left to the loop (the gate ignores it).
ALTER TABLE loop.policy DROP CONSTRAINT policy_decision_metric_check;
ALTER TABLE loop.policy ADD CONSTRAINT policy_decision_metric_check
  CHECK (decision_metric IN ('feedback_mean', 'thumbs_up_rate', 'regen_rate', 'edit_rate', 'acceptance_rate'));
ALTER TABLE loop.policy ALTER COLUMN decision_metric SET DEFAULT 'acceptance_rate';
ALTER TABLE loop.policy ADD COLUMN min_offline_gain float8 NOT NULL DEFAULT 0.05
  CHECK (min_offline_gain >= 0 AND min_offline_gain <= 1);
ALTER TABLE serve.experiment_policy DROP CONSTRAINT experiment_policy_metric_check;
ALTER TABLE serve.experiment_policy ADD CONSTRAINT experiment_policy_metric_check
  CHECK (metric IN ('feedback_mean', 'thumbs_up_rate', 'regen_rate', 'edit_rate',
                    'acceptance_rate'));
ALTER TYPE obs.arm_sample ADD ATTRIBUTE n_responded bigint, ADD ATTRIBUTE n_accepted bigint;
ALTER TABLE loop.cycle ADD COLUMN settings_tried jsonb;
INSERT INTO train.promotion_policy
  (route, suite_id, metric, direction, tolerance, required, trusted_authors)
VALUES (NULL, 'heldout:snapshot', 'answer_similarity', 'ignore', 0.02, false,
        '{evaluator,owner}');
-- Eval results are facts the release role may not certify for itself: by default only the
-- evaluator's (and the owner's) results satisfy a required rule; a policy names release to
-- trust it.
UPDATE train.promotion_policy SET trusted_authors = '{evaluator,owner}'
 WHERE trusted_authors = '{evaluator,release,owner}';
