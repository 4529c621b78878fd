-- Row-level security and privileges of the loop schema, as for the other tables
-- (core/tenant_isolation.sql, core/grants.sql): the API's cft_app sees its tenant's rows,
-- cft_release and cft_dashboard read everything; the kill switch changes only through
-- loop.set_control.
ALTER TABLE loop.policy ENABLE ROW LEVEL SECURITY;
ALTER TABLE loop.cycle ENABLE ROW LEVEL SECURITY;
ALTER TABLE loop.cycle_event ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON loop.policy;
CREATE POLICY tenant_isolation ON loop.policy TO cft_app
  USING (tenant_id = auth.current_tenant_id()) WITH CHECK (tenant_id = auth.current_tenant_id());
DROP POLICY IF EXISTS tenant_isolation ON loop.cycle;
CREATE POLICY tenant_isolation ON loop.cycle TO cft_app
  USING (tenant_id = auth.current_tenant_id()) WITH CHECK (tenant_id = auth.current_tenant_id());
DROP POLICY IF EXISTS tenant_isolation ON loop.cycle_event;
CREATE POLICY tenant_isolation ON loop.cycle_event TO cft_app
  USING (tenant_id = auth.current_tenant_id()) WITH CHECK (tenant_id = auth.current_tenant_id());
DROP POLICY IF EXISTS read_all ON loop.policy;
CREATE POLICY read_all ON loop.policy FOR SELECT TO cft_dashboard, cft_release USING (true);
DROP POLICY IF EXISTS read_all ON loop.cycle;
CREATE POLICY read_all ON loop.cycle FOR SELECT TO cft_dashboard, cft_release USING (true);
DROP POLICY IF EXISTS read_all ON loop.cycle_event;
CREATE POLICY read_all ON loop.cycle_event FOR SELECT TO cft_dashboard, cft_release USING (true);
-- One row, the same for every tenant: readable by all, written only through loop.set_control.
ALTER TABLE loop.control ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS read_all ON loop.control;
CREATE POLICY read_all ON loop.control FOR SELECT TO cft_app, cft_dashboard, cft_release USING (true);

-- The kill switch: who and why are kept with it.
CREATE OR REPLACE FUNCTION loop.set_control(p_paused boolean, p_reason text, p_by text)
RETURNS loop.control LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  k loop.control;
BEGIN
  IF p_paused AND nullif(btrim(coalesce(p_reason, '')), '') IS NULL THEN
    RAISE invalid_parameter_value USING MESSAGE = 'stopping the loop needs a reason';
  END IF;
  UPDATE loop.control SET paused = p_paused, reason = p_reason,
         changed_by = coalesce(p_by, session_user), changed_at = now()
  RETURNING * INTO k;
  RETURN k;
END
$$;

GRANT USAGE ON SCHEMA loop TO cft_app, cft_release, cft_dashboard;
GRANT SELECT, INSERT, UPDATE ON loop.policy TO cft_app;
GRANT SELECT ON loop.cycle, loop.cycle_event, loop.control TO cft_app;
GRANT SELECT ON loop.policy, loop.cycle, loop.cycle_event, loop.control TO cft_release, cft_dashboard;
-- Owner-rights functions: for the API role (and release managers), not PUBLIC; the read-only
-- dashboard role runs no owner-rights function (it reads the loop's tables directly).
REVOKE EXECUTE ON FUNCTION loop.check_route(int, text), loop.effective_policy(int, text),
  loop.signal_counts(int, text, timestamptz), loop.last_cycle_at(int, text),
  loop.trigger_volume(int, text), loop.trigger_schedule(int, text), loop.trigger_decline(int, text),
  loop.trigger_drift(int, text), loop.trigger_forget(int, text), loop.limits(int, text),
  loop.start_due_cycles(), loop.canary_verdict(bigint), loop.watch_verdict(bigint),
  loop.decision_policy(int, text), loop.set_control(boolean, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION loop.check_route(int, text), loop.effective_policy(int, text),
  loop.signal_counts(int, text, timestamptz), loop.last_cycle_at(int, text),
  loop.trigger_volume(int, text), loop.trigger_schedule(int, text), loop.trigger_decline(int, text),
  loop.trigger_drift(int, text), loop.trigger_forget(int, text), loop.limits(int, text),
  loop.decision_policy(int, text)
  TO cft_app, cft_release;
GRANT EXECUTE ON FUNCTION loop.set_control(boolean, text, text) TO cft_app;
