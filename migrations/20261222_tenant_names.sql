-- Names are unique per tenant: two tenants may each have a route 'support' and an eval suite
-- 'smoke'. A route is keyed by (tenant_id, name) and a suite by (tenant_id, id); what named a
-- route by its name alone (promotion rules) or a suite by its id alone (cases, calibration)
-- carries the tenant too, and the one-per-route rules count per tenant and route.

-- Routes: the foreign keys on (name, tenant_id) are made again on the new key.
ALTER TABLE train.promotion_policy DROP CONSTRAINT promotion_policy_route_fkey;
ALTER TABLE serve.adapter DROP CONSTRAINT adapter_route_tenant_id_fkey;
ALTER TABLE serve.experiment_policy DROP CONSTRAINT experiment_policy_route_tenant_id_fkey;
ALTER TABLE train.eval_suite DROP CONSTRAINT eval_suite_route_tenant_id_fkey;
ALTER TABLE loop.policy DROP CONSTRAINT policy_route_tenant_id_fkey;
ALTER TABLE loop.cycle DROP CONSTRAINT cycle_route_tenant_id_fkey;
ALTER TABLE serve.route DROP CONSTRAINT route_pkey, DROP CONSTRAINT route_name_tenant_id_key;
ALTER TABLE serve.route ADD PRIMARY KEY (tenant_id, name);
ALTER TABLE serve.adapter ADD FOREIGN KEY (route, tenant_id) REFERENCES serve.route (name, tenant_id);
ALTER TABLE serve.experiment_policy ADD FOREIGN KEY (route, tenant_id)
  REFERENCES serve.route (name, tenant_id) ON DELETE CASCADE;
ALTER TABLE train.eval_suite ADD FOREIGN KEY (route, tenant_id)
  REFERENCES serve.route (name, tenant_id) ON DELETE CASCADE;
ALTER TABLE loop.policy ADD FOREIGN KEY (route, tenant_id)
  REFERENCES serve.route (name, tenant_id) ON DELETE CASCADE;
ALTER TABLE loop.cycle ADD FOREIGN KEY (route, tenant_id)
  REFERENCES serve.route (name, tenant_id) ON DELETE CASCADE;

-- A route's promotion rule names its tenant (a global rule, route NULL, none).
ALTER TABLE train.promotion_policy ADD COLUMN tenant_id int;
UPDATE train.promotion_policy p SET tenant_id = r.tenant_id FROM serve.route r WHERE r.name = p.route;
ALTER TABLE train.promotion_policy
  ADD CONSTRAINT promotion_policy_route_tenant CHECK ((route IS NULL) = (tenant_id IS NULL)),
  ADD FOREIGN KEY (route, tenant_id) REFERENCES serve.route (name, tenant_id) ON DELETE CASCADE;
DROP INDEX train.promotion_policy_key;
CREATE UNIQUE INDEX promotion_policy_key
  ON train.promotion_policy (coalesce(tenant_id, 0), coalesce(route, ''), suite_id, metric);

-- One prod, one loop policy, one experiment policy and one cycle in flight per tenant and route.
DROP INDEX serve.adapter_one_prod_per_route;
CREATE UNIQUE INDEX adapter_one_prod_per_route ON serve.adapter (tenant_id, route)
  WHERE status = 'prod';
ALTER TABLE serve.experiment_policy DROP CONSTRAINT experiment_policy_pkey,
  ADD PRIMARY KEY (tenant_id, route);
ALTER TABLE loop.policy DROP CONSTRAINT policy_pkey, ADD PRIMARY KEY (tenant_id, route);
DROP INDEX loop.cycle_one_active_per_route;
CREATE UNIQUE INDEX cycle_one_active_per_route ON loop.cycle (tenant_id, route)
  WHERE state NOT IN ('promoted', 'rejected', 'rolled_back', 'failed');

-- Eval suites: keyed by (tenant_id, id); cases, calibration cases and calibrations carry the
-- tenant of their suite.
ALTER TABLE train.eval_case DROP CONSTRAINT eval_case_suite_id_fkey;
ALTER TABLE train.eval_calibration_case DROP CONSTRAINT eval_calibration_case_suite_id_fkey;
ALTER TABLE train.judge_calibration DROP CONSTRAINT judge_calibration_suite_id_fkey;
ALTER TABLE train.eval_suite DROP CONSTRAINT eval_suite_pkey, ADD PRIMARY KEY (tenant_id, id);
ALTER TABLE train.eval_case ADD COLUMN tenant_id int;
ALTER TABLE train.eval_calibration_case ADD COLUMN tenant_id int;
ALTER TABLE train.judge_calibration ADD COLUMN tenant_id int;
UPDATE train.eval_case c SET tenant_id = s.tenant_id FROM train.eval_suite s WHERE s.id = c.suite_id;
UPDATE train.eval_calibration_case c SET tenant_id = s.tenant_id
  FROM train.eval_suite s WHERE s.id = c.suite_id;
UPDATE train.judge_calibration c SET tenant_id = s.tenant_id
  FROM train.eval_suite s WHERE s.id = c.suite_id;
ALTER TABLE train.eval_case ALTER COLUMN tenant_id SET NOT NULL,
  ADD FOREIGN KEY (tenant_id, suite_id) REFERENCES train.eval_suite (tenant_id, id) ON DELETE CASCADE;
ALTER TABLE train.eval_calibration_case ALTER COLUMN tenant_id SET NOT NULL,
  ADD FOREIGN KEY (tenant_id, suite_id) REFERENCES train.eval_suite (tenant_id, id) ON DELETE CASCADE;
ALTER TABLE train.judge_calibration ALTER COLUMN tenant_id SET NOT NULL,
  ADD FOREIGN KEY (tenant_id, suite_id) REFERENCES train.eval_suite (tenant_id, id) ON DELETE CASCADE;
