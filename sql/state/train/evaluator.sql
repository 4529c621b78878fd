-- A task suite: prompts with checks, scored as a pass rate (eval_result suite_id = id).
-- Ids are unique per tenant and carry no ':' so they never collide with the held-out suites
-- 'heldout:<snapshot id>'.
CREATE TABLE train.eval_suite (
  id          text NOT NULL CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$' AND id <> 'heldout'),
  tenant_id   int NOT NULL REFERENCES tenant(id) ON DELETE CASCADE,
  route       text,            -- NULL = every route of the tenant
  name        text NOT NULL,
  kind        text NOT NULL DEFAULT 'task' CHECK (kind IN ('task', 'judge')),
  rubric      text,            -- kind judge: what the judge model scores (0-10)
  created_at  timestamptz NOT NULL DEFAULT now(),
  FOREIGN KEY (route, tenant_id) REFERENCES serve.route (name, tenant_id) ON DELETE CASCADE,
  PRIMARY KEY (tenant_id, id)
);
CREATE INDEX eval_suite_route_idx ON train.eval_suite (tenant_id, route);

CREATE TABLE train.eval_case (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  suite_id    text NOT NULL,
  messages    jsonb NOT NULL CHECK (jsonb_typeof(messages) = 'array'),
  check_kind  text NOT NULL CHECK (check_kind IN ('exact', 'contains', 'regex', 'json_schema', 'max_length')),
  expected    jsonb NOT NULL,
  max_tokens  int NOT NULL DEFAULT 32 CHECK (max_tokens BETWEEN 1 AND 4096),
  tenant_id   int NOT NULL,
  FOREIGN KEY (tenant_id, suite_id) REFERENCES train.eval_suite (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX eval_case_suite_idx ON train.eval_case (suite_id, id);

-- One evaluation of one adapter: asked for over REST, or queued by the worker for a new candidate.
CREATE TABLE train.eval_request (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant_id    int NOT NULL REFERENCES tenant(id) ON DELETE CASCADE,
  adapter_id   text NOT NULL REFERENCES serve.adapter(id) ON DELETE CASCADE,
  status       text NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'running', 'done', 'failed')),
  requested_by text,
  worker_id    text,
  lease_until  timestamptz,
  attempts     int NOT NULL DEFAULT 0,
  error        text,
  created_at   timestamptz NOT NULL DEFAULT now(),
  started_at   timestamptz,
  finished_at  timestamptz
);
-- At most one open request per adapter: a second ask while one is open is the same request.
CREATE UNIQUE INDEX eval_request_open_idx ON train.eval_request (adapter_id)
  WHERE status IN ('queued', 'running');
