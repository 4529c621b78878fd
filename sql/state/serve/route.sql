-- A route is the serving slot adapters compete for (e.g. 'support-es'); it belongs to a tenant,
-- and its name is unique within the tenant (two tenants may each have a 'support-es').
CREATE TABLE serve.route (
  name        text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
  tenant_id   int NOT NULL REFERENCES tenant(id) ON DELETE CASCADE,
  base_model  text NOT NULL,
  experiment  text,            -- salt of the current canary split; NULL = the route name
  created_at  timestamptz NOT NULL DEFAULT now(),
  max_canary_pct numeric(5,2) NOT NULL DEFAULT 50
              CHECK (max_canary_pct BETWEEN 0 AND 100),  -- ceiling of all canaries' share
  -- What answers when the assigned adapter cannot: none (a 503), prod, base (prod, then base).
  fallback    text NOT NULL DEFAULT 'none' CHECK (fallback IN ('none', 'prod', 'base')),
  PRIMARY KEY (tenant_id, name)
);
