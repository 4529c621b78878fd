-- Row-level security: the API runs each request as cft_app with cft.tenant_id set for the
-- transaction only (SET LOCAL). A query that forgets `WHERE tenant_id = ...` still sees only
-- that tenant's rows; with no tenant set it sees nothing. Table owners (migrations, workers)
-- are not subject to these policies. Dashboards and release managers read across tenants.

CREATE OR REPLACE FUNCTION auth.current_tenant_id() RETURNS int
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT nullif(current_setting('cft.tenant_id', true), '')::int
$$;

ALTER TABLE tenant ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_self ON tenant;
CREATE POLICY tenant_self ON tenant TO cft_app USING (id = auth.current_tenant_id());
DROP POLICY IF EXISTS tenant_read ON tenant;
CREATE POLICY tenant_read ON tenant FOR SELECT TO cft_dashboard, cft_release USING (true);

DO $$
DECLARE
  t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['obs.inference_log', 'obs.request_key', 'serve.route', 'serve.adapter',
                           'serve.adapter_event', 'train.dataset_snapshot', 'train.training_run',
                           'train.training_file', 'train.fine_tuning_job', 'train.fine_tuning_event']
  LOOP
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format('DROP POLICY IF EXISTS tenant_isolation ON %s', t);
    EXECUTE format('DROP POLICY IF EXISTS read_all ON %s', t);
    EXECUTE format('CREATE POLICY tenant_isolation ON %s TO cft_app
                      USING (tenant_id = auth.current_tenant_id())
                      WITH CHECK (tenant_id = auth.current_tenant_id())', t);
    EXECUTE format('CREATE POLICY read_all ON %s FOR SELECT TO cft_dashboard, cft_release USING (true)', t);
  END LOOP;
END
$$;

-- Release managers change status and traffic of any adapter (the gate trigger still applies).
DROP POLICY IF EXISTS release_update ON serve.adapter;
CREATE POLICY release_update ON serve.adapter FOR UPDATE TO cft_release USING (true) WITH CHECK (true);

ALTER TABLE train.dataset_example ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON train.dataset_example;
CREATE POLICY tenant_isolation ON train.dataset_example TO cft_app
  USING (EXISTS (SELECT 1 FROM train.dataset_snapshot s WHERE s.id = snapshot_id));
DROP POLICY IF EXISTS read_all ON train.dataset_example;
CREATE POLICY read_all ON train.dataset_example FOR SELECT TO cft_dashboard, cft_release USING (true);

ALTER TABLE train.eval_result ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON train.eval_result;
CREATE POLICY tenant_isolation ON train.eval_result TO cft_app
  USING (EXISTS (SELECT 1 FROM serve.adapter a WHERE a.id = adapter_id))
  WITH CHECK (EXISTS (SELECT 1 FROM serve.adapter a WHERE a.id = adapter_id));
DROP POLICY IF EXISTS read_all ON train.eval_result;
CREATE POLICY read_all ON train.eval_result FOR SELECT TO cft_dashboard, cft_release USING (true);

ALTER TABLE train.promotion_policy ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON train.promotion_policy;
-- A key reads the global rules (route NULL) and its routes' rules, and writes only its
-- routes' rules: a global rule is never updated or deleted through a key (an UPDATE that set a
-- route on it would take the rule away from every tenant).
CREATE POLICY tenant_isolation ON train.promotion_policy FOR SELECT TO cft_app
  USING (route IS NULL OR tenant_id = auth.current_tenant_id());
DROP POLICY IF EXISTS tenant_write ON train.promotion_policy;
CREATE POLICY tenant_write ON train.promotion_policy FOR ALL TO cft_app
  USING (route IS NOT NULL AND tenant_id = auth.current_tenant_id())
  WITH CHECK (route IS NOT NULL AND tenant_id = auth.current_tenant_id());
DROP POLICY IF EXISTS read_all ON train.promotion_policy;
CREATE POLICY read_all ON train.promotion_policy FOR SELECT TO cft_dashboard, cft_release USING (true);

-- A key may delete only its own routes' rules, never the global ones.

DROP POLICY IF EXISTS own_rules_only ON train.promotion_policy;
CREATE POLICY own_rules_only ON train.promotion_policy AS RESTRICTIVE FOR DELETE TO cft_app
  USING (route IS NOT NULL);
