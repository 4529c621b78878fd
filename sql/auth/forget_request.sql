COMMENT ON TABLE auth.forget_request IS
  'One row per forget request: pseudonym, counts and time only (no personal data in clear).';
COMMENT ON COLUMN auth.forget_request.id IS
  'The request''s number; the taint reasons of snapshots and adapters name it.';
COMMENT ON COLUMN auth.forget_request.tenant_id IS 'The tenant the user belonged to.';
COMMENT ON COLUMN auth.forget_request.user_hash IS
  'The forgotten user''s pseudonym: HMAC-SHA256 of the user id, as in obs.inference_log.';
COMMENT ON COLUMN auth.forget_request.logs_deleted IS 'obs.inference_log rows deleted.';
COMMENT ON COLUMN auth.forget_request.request_keys_deleted IS 'obs.request_key rows deleted.';
COMMENT ON COLUMN auth.forget_request.snapshots_tainted IS
  'Snapshots holding an example built from those rows, marked tainted.';
COMMENT ON COLUMN auth.forget_request.adapters_tainted IS
  'Adapters trained on such a snapshot, marked tainted (not retired: a release manager decides).';
COMMENT ON COLUMN auth.forget_request.created_at IS 'When the user was forgotten.';

ALTER TABLE auth.forget_request ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS tenant_isolation ON auth.forget_request;
CREATE POLICY tenant_isolation ON auth.forget_request TO cft_app
  USING (tenant_id = auth.current_tenant_id());
GRANT SELECT ON auth.forget_request TO cft_app;
