-- A route is the serving slot adapters compete for (e.g. 'support-es'); it belongs to a tenant.
CREATE TABLE serve.route (
  name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
  tenant_id   int NOT NULL REFERENCES tenant(id) ON DELETE CASCADE,
  base_model  text NOT NULL,
  experiment  text,            -- salt of the current canary split; NULL = the route name
  created_at  timestamptz NOT NULL DEFAULT now(),
  UNIQUE (name, tenant_id)
);
