-- Adapters trained elsewhere: where an adapter came from (cft's trainer or an import) and an
-- import's record.
ALTER TABLE serve.adapter
  ADD COLUMN source text NOT NULL DEFAULT 'trained' CHECK (source IN ('trained', 'imported')),
  ADD COLUMN import_detail jsonb;
