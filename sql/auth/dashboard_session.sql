-- Dashboard sessions (the table: sql/state/auth/dashboard_session.sql): comments, and the
-- trigger that ends a revoked key's sessions.
COMMENT ON TABLE auth.dashboard_session IS
  'Logged-in dashboard sessions: a session reads as its key''s tenant and role until it expires, '
  'the key is revoked or the user logs out.';
COMMENT ON COLUMN auth.dashboard_session.token_hash IS
  'sha256 of the session token in the browser''s cookie; the token itself is never stored.';
COMMENT ON COLUMN auth.dashboard_session.api_key_id IS
  'The key that logged in (auth.api_key.id): the session acts as it, and ends with it.';
COMMENT ON COLUMN auth.dashboard_session.created_at IS 'When the key logged in.';
COMMENT ON COLUMN auth.dashboard_session.expires_at IS
  'When the session stops working (CFT_DASHBOARD_SESSION_HOURS after the login).';

-- Revoking a key ends its sessions (cft key revoke, the operator API, tenant offboarding).
CREATE OR REPLACE FUNCTION auth.end_dashboard_sessions() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  DELETE FROM auth.dashboard_session WHERE api_key_id = NEW.id;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION auth.end_dashboard_sessions() IS
  'Trigger of auth.api_key: deletes the dashboard sessions of a key when it is revoked.';
CREATE OR REPLACE TRIGGER api_key_revoked_ends_sessions
  AFTER UPDATE OF revoked_at ON auth.api_key
  FOR EACH ROW WHEN (NEW.revoked_at IS NOT NULL AND OLD.revoked_at IS NULL)
  EXECUTE FUNCTION auth.end_dashboard_sessions();
