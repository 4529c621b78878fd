CREATE TABLE serve.adapter (
  id                  text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
  tenant_id           int NOT NULL,
  route               text NOT NULL,
  base_model          text NOT NULL,
  base_revision       text,
  rank                int CHECK (rank > 0),
  alpha               int,
  target_modules      jsonb,
  method              text CHECK (method IN ('sft', 'dpo', 'kto', 'orpo', 'simpo')),
  training_run_id     uuid,
  dataset_snapshot_id uuid,
  weights_uri         text,
  sha256              text CHECK (sha256 ~ '^[0-9a-f]{64}$'),
  size_bytes          bigint CHECK (size_bytes >= 0),
  eval_summary        jsonb,
  status              text NOT NULL DEFAULT 'training'
                      CHECK (status IN ('training', 'candidate', 'canary', 'prod', 'retired', 'failed')),
  traffic_pct         numeric(5,2) NOT NULL DEFAULT 0 CHECK (traffic_pct BETWEEN 0 AND 100),
  promoted_at         timestamptz,
  tainted_at          timestamptz,    -- set when a user it was trained on is forgotten
  tainted_reason      text,
  created_at          timestamptz NOT NULL DEFAULT now(),
  updated_at          timestamptz NOT NULL DEFAULT now(),

  previous_prod_id    text,           -- the prod this one replaced when promoted (for rollback)
  source              text NOT NULL DEFAULT 'trained' CHECK (source IN ('trained', 'imported')),
  import_detail       jsonb,          -- an imported adapter's record (origin, who, metadata)

  FOREIGN KEY (route, tenant_id) REFERENCES serve.route (name, tenant_id),
  CHECK (status <> 'prod' OR traffic_pct = 100),
  CHECK (status IN ('canary', 'prod') OR traffic_pct = 0)
);
-- One prod per route (of a tenant).
CREATE UNIQUE INDEX adapter_one_prod_per_route ON serve.adapter (tenant_id, route)
  WHERE status = 'prod';
CREATE INDEX adapter_route_status_idx ON serve.adapter (route, status);

-- Every insert and status/traffic change of serve.adapter, written by a trigger.
CREATE TABLE serve.adapter_event (
  id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  adapter_id       text NOT NULL,
  route            text NOT NULL,
  tenant_id        int NOT NULL,
  op               text NOT NULL CHECK (op IN ('INSERT', 'UPDATE', 'DELETE')),
  old_status       text,
  new_status       text,
  old_traffic_pct  numeric(5,2),
  new_traffic_pct  numeric(5,2),
  actor            text NOT NULL,         -- current_user
  application_name text,
  reason           text,                  -- SET LOCAL cft.reason = '...'
  override         boolean NOT NULL DEFAULT false,
  detail           jsonb,
  at               timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX adapter_event_adapter_idx ON serve.adapter_event (adapter_id, at);
