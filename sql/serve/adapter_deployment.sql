COMMENT ON COLUMN serve.adapter_deployment.adapter_id IS 'The adapter (serve.adapter.id).';
COMMENT ON COLUMN serve.adapter_deployment.engine_url IS 'The engine''s base URL.';
COMMENT ON COLUMN serve.adapter_deployment.state IS
  'The reconciler''s last outcome on that engine: loaded (verified and loaded, or staged '
  'for LoRAX), failed or unloaded.';
COMMENT ON COLUMN serve.adapter_deployment.error IS
  'Why it failed (a sha256 mismatch, a fetch or load error); NULL otherwise.';
COMMENT ON COLUMN serve.adapter_deployment.sha256_checked_at IS
  'When the artefact''s sha256 was last checked against serve.adapter.sha256 before a load.';
COMMENT ON COLUMN serve.adapter_deployment.updated_at IS
  'When the reconciler last recorded an outcome.';

GRANT SELECT ON serve.adapter_deployment TO cft_release, cft_dashboard;
