-- The audit of forgotten users: the pseudonym, what was done and when; never the raw user id.
CREATE TABLE auth.forget_request (
  id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant_id            int NOT NULL REFERENCES tenant(id) ON DELETE CASCADE,
  user_hash            bytea NOT NULL,         -- HMAC-SHA256 of the user id (as in obs.inference_log)
  logs_deleted         int NOT NULL,
  request_keys_deleted int NOT NULL,
  snapshots_tainted    int NOT NULL,
  adapters_tainted     int NOT NULL,
  created_at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX forget_request_tenant_idx ON auth.forget_request (tenant_id, created_at);
