-- Serving registry, training queue, datasets, evals and the audit trail.

-- A route is the serving slot adapters compete for (e.g. 'support-es'); it belongs to a tenant.
CREATE TABLE serve.route (
  name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
  tenant_id   int NOT NULL REFERENCES tenant(id) ON DELETE CASCADE,
  base_model  text NOT NULL,
  experiment  text,            -- salt of the current canary split; NULL = the route name
  created_at  timestamptz NOT NULL DEFAULT now(),
  UNIQUE (name, tenant_id)
);

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
  experiment          text,
  promoted_at         timestamptz,
  tainted_at          timestamptz,    -- set when a user it was trained on is forgotten
  tainted_reason      text,
  created_at          timestamptz NOT NULL DEFAULT now(),
  updated_at          timestamptz NOT NULL DEFAULT now(),
  FOREIGN KEY (route, tenant_id) REFERENCES serve.route (name, tenant_id),
  CHECK (status <> 'prod' OR traffic_pct = 100),
  CHECK (status IN ('canary', 'prod') OR traffic_pct = 0)
);
-- One prod per route.
CREATE UNIQUE INDEX adapter_one_prod_per_route ON serve.adapter (route) WHERE status = 'prod';
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

CREATE TABLE train.dataset_snapshot (
  id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id      int NOT NULL REFERENCES tenant(id),
  route          text NOT NULL,
  method         text NOT NULL CHECK (method IN ('sft', 'dpo', 'kto', 'orpo', 'simpo')),
  query_sql      text NOT NULL,          -- the exact query that produced the rows
  params         jsonb NOT NULL DEFAULT '{}',
  counts         jsonb NOT NULL DEFAULT '{}',  -- rows before/after each filter and dedup step
  n_train        int NOT NULL DEFAULT 0,
  n_eval         int NOT NULL DEFAULT 0,
  set_hash       text,                   -- sha256 over the sorted example hashes
  created_by     text,
  created_at     timestamptz NOT NULL DEFAULT now(),
  tainted_at     timestamptz,
  tainted_reason text
);

CREATE TABLE train.dataset_example (
  snapshot_id  uuid NOT NULL REFERENCES train.dataset_snapshot(id) ON DELETE CASCADE,
  example_hash bytea NOT NULL,           -- sha256 of the canonical example
  split        text NOT NULL CHECK (split IN ('train', 'eval')),
  log_ids      bigint[] NOT NULL,        -- provenance: obs.inference_log ids
  example      jsonb NOT NULL,           -- the frozen example in TRL's format
  PRIMARY KEY (snapshot_id, example_hash)
);
CREATE INDEX dataset_example_log_ids_idx ON train.dataset_example USING gin (log_ids);

CREATE TABLE train.training_run (
  id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  tenant_id     int NOT NULL REFERENCES tenant(id),
  route         text NOT NULL,
  method        text NOT NULL CHECK (method IN ('sft', 'dpo', 'kto', 'orpo', 'simpo')),
  base_model    text NOT NULL,
  params        jsonb NOT NULL DEFAULT '{}',
  snapshot_id   uuid REFERENCES train.dataset_snapshot(id),
  status        text NOT NULL DEFAULT 'queued'
                CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
  priority      int NOT NULL DEFAULT 0,
  worker_id     text,
  lease_until   timestamptz,
  attempts      int NOT NULL DEFAULT 0,
  max_attempts  int NOT NULL DEFAULT 3 CHECK (max_attempts > 0),
  cancel_requested boolean NOT NULL DEFAULT false,
  progress      jsonb NOT NULL DEFAULT '{}',
  error         text,
  adapter_id    text,
  created_by    text,
  created_at    timestamptz NOT NULL DEFAULT now(),
  started_at    timestamptz,
  finished_at   timestamptz,
  updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX training_run_queue_idx ON train.training_run (priority DESC, created_at)
  WHERE status IN ('queued', 'running');

-- As in the seed.
CREATE TABLE train.eval_result (
  adapter_id  text REFERENCES serve.adapter(id),
  suite_id    text,
  metric      text,
  score       numeric,
  judge_model text,
  judged_at   timestamptz DEFAULT now(),
  PRIMARY KEY (adapter_id, suite_id, metric)
);

-- Which metrics the gate requires, in which direction and with which tolerance.
-- route NULL = every route; a route's own row overrides the global one for the same metric.
CREATE TABLE train.promotion_policy (
  id         int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  route      text REFERENCES serve.route(name) ON DELETE CASCADE,
  suite_id   text NOT NULL,
  metric     text NOT NULL,
  direction  text NOT NULL CHECK (direction IN ('higher', 'lower')),
  tolerance  numeric NOT NULL DEFAULT 0.02 CHECK (tolerance >= 0 AND tolerance < 1),
  required   boolean NOT NULL DEFAULT true,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX promotion_policy_key ON train.promotion_policy (coalesce(route, ''), suite_id, metric);
