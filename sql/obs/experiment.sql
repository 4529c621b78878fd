-- Experiments seen in traffic, and the last 7 days of their arms and comparisons, for dashboards.
-- security_invoker: the API role (cft_app) sees only its tenant's rows through them.
CREATE OR REPLACE VIEW obs.experiment WITH (security_invoker = true) AS
  SELECT l.experiment,
         l.tenant_id,
         min(l.route) AS route,
         count(*) AS n,
         array_agg(DISTINCT l.variant::text ORDER BY l.variant::text) AS variants,
         array_agg(DISTINCT l.adapter_id ORDER BY l.adapter_id) AS adapters,
         min(l.created_at) AS first_at,
         max(l.created_at) AS last_at,
         EXISTS (SELECT 1 FROM serve.route r JOIN serve.adapter a ON a.route = r.name
                  WHERE coalesce(r.experiment, r.name) = l.experiment AND r.tenant_id = l.tenant_id
                    AND a.status = 'canary') AS running
    FROM obs.inference_log l
   WHERE l.experiment IS NOT NULL AND l.variant IS NOT NULL
   GROUP BY l.experiment, l.tenant_id;
COMMENT ON VIEW obs.experiment IS
  'One row per experiment (and tenant) in traffic: rows, variants, adapters, first/last row, and '
  'running = a canary is live on a route whose experiment (or name) it is.';
COMMENT ON COLUMN obs.experiment.experiment IS 'Experiment name as logged (serve.route.experiment, or the route name).';
COMMENT ON COLUMN obs.experiment.n IS 'Logged inferences that carry the experiment and a variant.';
COMMENT ON COLUMN obs.experiment.variants IS 'Variant letters seen: A = prod, B.. = canaries.';
COMMENT ON COLUMN obs.experiment.running IS 'A canary currently serves on the experiment''s route.';
COMMENT ON COLUMN obs.experiment.tenant_id IS 'The tenant whose traffic it is.';
COMMENT ON COLUMN obs.experiment.route IS
  'The route logged (the first by name if several carry the experiment).';
COMMENT ON COLUMN obs.experiment.adapters IS 'Adapters that served its arms.';
COMMENT ON COLUMN obs.experiment.first_at IS 'When its first row was logged.';
COMMENT ON COLUMN obs.experiment.last_at IS 'When its last row was logged.';

CREATE OR REPLACE VIEW obs.experiment_arm_7d WITH (security_invoker = true) AS
  SELECT a.*
    FROM obs.experiment e
    CROSS JOIN LATERAL obs.experiment_arms(e.experiment, now() - interval '7 days', now()) a
   WHERE e.last_at > now() - interval '7 days';
COMMENT ON VIEW obs.experiment_arm_7d IS
  'obs.experiment_arms over the last 7 days for every recently active experiment (see that function for columns).';

CREATE OR REPLACE VIEW obs.experiment_compare_7d WITH (security_invoker = true) AS
  SELECT c.*
    FROM obs.experiment e
    CROSS JOIN LATERAL obs.experiment_compare(e.experiment, now() - interval '7 days', now()) c
   WHERE e.last_at > now() - interval '7 days';
COMMENT ON VIEW obs.experiment_compare_7d IS
  'obs.experiment_compare over the last 7 days (α 0.05, power 0.8) for every recently active experiment.';

GRANT SELECT ON obs.experiment, obs.experiment_arm_7d, obs.experiment_compare_7d
  TO cft_app, cft_release, cft_dashboard;
