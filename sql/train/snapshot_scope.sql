-- Who may freeze a route's examples into a snapshot (train.create_snapshot, and
-- train.create_file_snapshot for the fine-tuning API): the API, as cft_app on behalf of one
-- tenant, only that tenant's; the owner's own sessions (workers, the CLI) any tenant's. The
-- route must exist.
CREATE OR REPLACE FUNCTION train.check_snapshot_scope(p_tenant_id int, p_route text)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  IF (current_setting('role') <> 'none' OR auth.current_tenant_id() IS NOT NULL)
     AND p_tenant_id IS DISTINCT FROM auth.current_tenant_id() THEN
    RAISE EXCEPTION 'a snapshot of tenant % can only be taken on its own behalf', p_tenant_id
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM serve.route WHERE name = p_route AND tenant_id = p_tenant_id) THEN
    RAISE EXCEPTION 'route % not found', p_route USING ERRCODE = 'no_data_found';
  END IF;
END
$$;

REVOKE ALL ON FUNCTION train.check_snapshot_scope(int, text) FROM PUBLIC;
COMMENT ON FUNCTION train.check_snapshot_scope(int, text) IS
  'Raise unless this session may freeze the tenant''s route into a snapshot (its own tenant '
  'through the API, any as the owner) and the route exists.';
