-- The OpenAI fine-tuning API: uploaded training files, fine-tuning jobs and their events
-- (train.*), and the adapters routers asked for by name (serve.adapter_demand).

CREATE TABLE train.training_file (
  id         text PRIMARY KEY CHECK (id ~ '^file-[A-Za-z0-9]{24}$'),
  tenant_id  int NOT NULL REFERENCES tenant(id),
  filename   text NOT NULL CHECK (length(filename) BETWEEN 1 AND 255),
  purpose    text NOT NULL CHECK (purpose = 'fine-tune'),
  format     text NOT NULL CHECK (format IN ('chat', 'preference')),
  lines      int NOT NULL CHECK (lines > 0),
  bytes      int NOT NULL CHECK (bytes > 0),
  sha256     text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
  content    bytea NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX training_file_tenant_idx ON train.training_file (tenant_id, created_at, id);

CREATE TABLE train.fine_tuning_job (
  id               text PRIMARY KEY CHECK (id ~ '^ftjob-[A-Za-z0-9]{24}$'),
  tenant_id        int NOT NULL REFERENCES tenant(id),
  training_run_id  uuid NOT NULL UNIQUE REFERENCES train.training_run(id),
  model            text NOT NULL,
  route            text NOT NULL,
  method           text NOT NULL CHECK (method IN ('supervised', 'dpo')),
  training_file    text NOT NULL,
  validation_file  text,
  suffix           text,
  seed             int NOT NULL,
  hyperparameters  jsonb NOT NULL,
  fine_tuned_model text NOT NULL UNIQUE,
  metadata         jsonb,
  created_at       timestamptz NOT NULL DEFAULT now(),
  FOREIGN KEY (route, tenant_id) REFERENCES serve.route (name, tenant_id)
);
CREATE INDEX fine_tuning_job_tenant_idx ON train.fine_tuning_job (tenant_id, created_at, id);

CREATE TABLE train.fine_tuning_event (
  id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant_id  int NOT NULL,
  job_id     text NOT NULL REFERENCES train.fine_tuning_job(id) ON DELETE CASCADE,
  created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  level      text NOT NULL CHECK (level IN ('info', 'warn', 'error')),
  type       text NOT NULL CHECK (type IN ('message', 'metrics')),
  message    text NOT NULL,
  data       jsonb
);
CREATE INDEX fine_tuning_event_job_idx ON train.fine_tuning_event (job_id, id);

-- Adapters asked for by name (a fine-tuned model called on /v1/chat/completions): the
-- reconciler keeps each loaded until wanted_until, like the canaries and prods it always loads.
CREATE TABLE serve.adapter_demand (
  adapter_id   text PRIMARY KEY REFERENCES serve.adapter (id) ON DELETE CASCADE,
  wanted_until timestamptz NOT NULL,
  requested_at timestamptz NOT NULL DEFAULT now()
);
