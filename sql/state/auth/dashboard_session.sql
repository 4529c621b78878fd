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
