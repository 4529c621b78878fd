CREATE TABLE auth.api_key (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant_id    int REFERENCES tenant(id) ON DELETE CASCADE,  -- NULL: an operator key
  role         text NOT NULL
               CHECK (role IN ('ingest', 'client', 'trainer', 'release', 'reader', 'admin',
                               'operator')),
  prefix       text NOT NULL UNIQUE,          -- shown in listings, e.g. cft_ab12cd34
  key_hash     bytea NOT NULL UNIQUE,         -- sha256 of the full key; the key is never stored
  name         text,
  created_at   timestamptz NOT NULL DEFAULT now(),
  revoked_at   timestamptz,
  last_used_at timestamptz,
  -- Operator keys administer tenants (/v1/tenants) and belong to none; every other key to one.
  CONSTRAINT api_key_operator_has_no_tenant CHECK ((role = 'operator') = (tenant_id IS NULL))
);
