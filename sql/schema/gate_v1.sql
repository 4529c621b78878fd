-- The promotion gate remembers which prod each promotion replaced, so a rollback restores it.
ALTER TABLE serve.adapter ADD COLUMN IF NOT EXISTS previous_prod_id text;
COMMENT ON COLUMN serve.adapter.previous_prod_id IS
  'The prod adapter this one replaced when it was promoted; a rollback restores it.';
