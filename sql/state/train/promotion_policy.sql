-- Which metrics the gate compares, in which direction and with which tolerance, and which it
-- requires. route NULL = every route of every tenant (tenant_id NULL too); a route's own row
-- (route and tenant_id set) overrides the global one for the same metric. direction 'ignore': the gate does not compare that suite's metric (a result on a
-- suite/metric no row names is compared by the default rule: higher is better, 2 %).
-- A required rule is satisfied only by results whose author_role is in trusted_authors (default
-- train.default_trusted_authors(): evaluator, owner), and, for a judge-scored result
-- (judge_model set), only from a judge calibrated on the suite with that rubric whose Cohen's
-- kappa is at least min_judge_kappa (default 0.6: "substantial" agreement).
CREATE TABLE train.promotion_policy (
  id         int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  route      text,
  suite_id   text NOT NULL,
  metric     text NOT NULL,
  direction  text NOT NULL CHECK (direction IN ('higher', 'lower', 'ignore')),
  tolerance  numeric NOT NULL DEFAULT 0.02 CHECK (tolerance >= 0 AND tolerance < 1),
  required   boolean NOT NULL DEFAULT true,
  created_at timestamptz NOT NULL DEFAULT now(),
  trusted_authors text[] NOT NULL,  -- its DEFAULT calls code: train/promotion_policy.sql
  min_judge_kappa numeric NOT NULL DEFAULT 0.6 CHECK (min_judge_kappa BETWEEN -1 AND 1),
  tenant_id  int,
  CONSTRAINT promotion_policy_route_tenant CHECK ((route IS NULL) = (tenant_id IS NULL)),
  FOREIGN KEY (route, tenant_id) REFERENCES serve.route (name, tenant_id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX promotion_policy_key
  ON train.promotion_policy (coalesce(tenant_id, 0), coalesce(route, ''), suite_id, metric);
