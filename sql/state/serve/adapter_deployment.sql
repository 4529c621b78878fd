-- What the reconciler did with each serving adapter on each engine, for operators.
-- One row per (adapter, engine); `state` is the last outcome, `error` says why it failed
-- (e.g. a tampered artefact whose sha256 differs from serve.adapter.sha256: never loaded).
CREATE TABLE serve.adapter_deployment (
  adapter_id        text NOT NULL REFERENCES serve.adapter (id) ON DELETE CASCADE,
  engine_url        text NOT NULL,
  state             text NOT NULL CHECK (state IN ('loaded', 'failed', 'unloaded')),
  error             text,
  sha256_checked_at timestamptz,
  updated_at        timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (adapter_id, engine_url)
);
CREATE INDEX adapter_deployment_engine_idx ON serve.adapter_deployment (engine_url, state);
