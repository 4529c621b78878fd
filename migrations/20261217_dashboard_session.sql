-- Dashboard sessions: the server-side session table (a login keeps only the token's sha256).
CREATE TABLE auth.dashboard_session (
  token_hash  bytea PRIMARY KEY,
  api_key_id  bigint NOT NULL REFERENCES auth.api_key(id) ON DELETE CASCADE,
  created_at  timestamptz NOT NULL DEFAULT now(),
  expires_at  timestamptz NOT NULL,
  CHECK (expires_at > created_at)
);
CREATE INDEX dashboard_session_api_key_idx ON auth.dashboard_session (api_key_id);
CREATE INDEX dashboard_session_expires_idx ON auth.dashboard_session (expires_at);
