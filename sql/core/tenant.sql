COMMENT ON TABLE tenant IS 'A customer of the platform; consent_training gates its traffic into datasets.';
COMMENT ON COLUMN tenant.id IS 'The tenant''s number: tenant_id in every other table.';
COMMENT ON COLUMN tenant.name IS
  'Unique name (a-z, 0-9, _ . -), as the CLI and the operator API name the tenant.';
COMMENT ON COLUMN tenant.consent_training IS
  'The tenant lets its traffic train adapters; false (the default) keeps its rows out of '
  'every candidate view and snapshot.';
COMMENT ON COLUMN tenant.created_at IS 'When the tenant was created.';
COMMENT ON COLUMN tenant.updated_at IS 'Last change of the row (a consent change sets it).';
