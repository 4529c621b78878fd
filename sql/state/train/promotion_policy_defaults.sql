-- The default global rule: on the held-out split of the candidate's own snapshot (evaluated for
-- the candidate and for the current prod alike; see serve/can_promote.sql), the assistant-token
-- loss may not be more than 2 % worse. Routes add task-suite rules of their own.
-- State runs before code, so these rows name their trusted authors themselves (the column's
-- default, train.default_trusted_authors(), is set with the functions).
INSERT INTO train.promotion_policy
  (route, suite_id, metric, direction, tolerance, required, trusted_authors)
VALUES (NULL, 'heldout:snapshot', 'loss', 'lower', 0.02, true, '{evaluator,owner}');
-- The held-out split's other metrics, in their own direction (the default rule, higher is
-- better, would read a lower perplexity as a regression); compared, not required.
INSERT INTO train.promotion_policy
  (route, suite_id, metric, direction, tolerance, required, trusted_authors)
VALUES (NULL, 'heldout:snapshot', 'perplexity', 'lower', 0.02, false, '{evaluator,owner}'),
       (NULL, 'heldout:snapshot', 'preference_accuracy', 'higher', 0.02, false,
        '{evaluator,owner}'),
       (NULL, 'heldout:snapshot', 'reward_margin', 'higher', 0.02, false,
        '{evaluator,owner}');
-- The held-out answers the candidate generates, against what users accepted or wrote: the
-- loop's offline gain reads it (app/loop/offline.py); a few held-out examples make it too noisy
-- for the gate's tolerance, so the gate leaves it out.
INSERT INTO train.promotion_policy
  (route, suite_id, metric, direction, tolerance, required, trusted_authors)
VALUES (NULL, 'heldout:snapshot', 'answer_similarity', 'ignore', 0.02, false,
        '{evaluator,owner}');
