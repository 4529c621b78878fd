"""Dashboard sessions: a login stores a random session token's sha256, never the API key.

* auth.dashboard_session(token_hash, api_key_id, created_at, expires_at): one row per logged-in
  browser; the cookie holds the token, the table only its sha256.
* auth.end_dashboard_sessions() and the trigger api_key_revoked_ends_sessions on auth.api_key:
  revoking a key deletes its sessions.

The downgrade drops them (every dashboard session ends: log in again).

Revision ID: 20261218
Revises: 20261217
"""

from alembic import op

revision = "20261218"
down_revision = "20261217"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
-- Dashboard sessions: a login keeps a random token in an HttpOnly cookie and only its sha256 here
-- (never the API key). Read by the API's owner connection before a tenant is known, as
-- auth.api_key is: no grants to the tenant-scoped roles.
CREATE TABLE auth.dashboard_session (
  token_hash  bytea PRIMARY KEY,
  api_key_id  bigint NOT NULL REFERENCES auth.api_key(id) ON DELETE CASCADE,
  created_at  timestamptz NOT NULL DEFAULT now(),
  expires_at  timestamptz NOT NULL,
  CHECK (expires_at > created_at)
);
CREATE INDEX dashboard_session_api_key_idx ON auth.dashboard_session (api_key_id);
CREATE INDEX dashboard_session_expires_idx ON auth.dashboard_session (expires_at);
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
LANGUAGE plpgsql SET search_path = pg_catalog, public AS $$
BEGIN
  DELETE FROM auth.dashboard_session WHERE api_key_id = NEW.id;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION auth.end_dashboard_sessions() IS
  'Trigger of auth.api_key: deletes the dashboard sessions of a key when it is revoked.';
CREATE TRIGGER api_key_revoked_ends_sessions
  AFTER UPDATE OF revoked_at ON auth.api_key
  FOR EACH ROW WHEN (NEW.revoked_at IS NOT NULL AND OLD.revoked_at IS NULL)
  EXECUTE FUNCTION auth.end_dashboard_sessions();
"""

DOWNGRADE_SQL = r"""
DROP TRIGGER api_key_revoked_ends_sessions ON auth.api_key;
DROP FUNCTION auth.end_dashboard_sessions();
DROP TABLE auth.dashboard_session;
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
