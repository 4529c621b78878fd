COMMENT ON TABLE auth.api_key IS 'API keys: only a sha256 of the 256-bit random key is kept.';
COMMENT ON COLUMN auth.api_key.id IS
  'The key''s number (cft key revoke takes it or the prefix; eval '
  'results name it in author_key_id).';
COMMENT ON COLUMN auth.api_key.tenant_id IS
  'The tenant the key acts for; NULL: an operator key (platform-wide).';
COMMENT ON COLUMN auth.api_key.role IS
  'What the key may do: ingest, client, trainer, release, reader, admin (a tenant''s key) or '
  'operator (administers tenants).';
COMMENT ON COLUMN auth.api_key.prefix IS
  'The key''s first 12 characters (cft_ and 8 more): names it in listings and audit lines.';
COMMENT ON COLUMN auth.api_key.key_hash IS
  'sha256 of the whole key: a request''s key is looked up by it; the key itself is never stored.';
COMMENT ON COLUMN auth.api_key.name IS
  'Free label given when the key was created (e.g. backend); NULL: none.';
COMMENT ON COLUMN auth.api_key.created_at IS 'When the key was created.';
COMMENT ON COLUMN auth.api_key.revoked_at IS
  'When it was revoked (cft key revoke, tenant offboarding): since then it '
  'authenticates nothing. NULL: live.';
COMMENT ON COLUMN auth.api_key.last_used_at IS
  'When the key last authenticated a request, to the minute (the key lookup sets it at most once '
  'a minute; the router re-verifies cached keys every CFT_ROUTER_KEY_CACHE_TTL s). NULL: never used.';
