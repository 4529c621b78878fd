COMMENT ON COLUMN serve.route.name IS
  'The route''s name, unique within its tenant (another tenant may have a route of the same '
  'name): what a call names (model or X-Cft-Route), e.g. support-es.';
COMMENT ON COLUMN serve.route.tenant_id IS 'The tenant that owns the route.';
COMMENT ON COLUMN serve.route.base_model IS
  'The base model the route serves: it answers when no adapter is prod or one '
  'cannot serve; the loop trains on it.';
COMMENT ON COLUMN serve.route.experiment IS
  'Salt of the sticky canary split (a user''s bucket: md5(experiment:user)) and the experiment '
  'name logged; NULL: the route name. A new value reshuffles users.';
COMMENT ON COLUMN serve.route.created_at IS 'When the route was created.';
COMMENT ON COLUMN serve.route.fallback IS
  'What answers a call whose assigned adapter cannot (not loaded on any engine after the '
  'router''s wait, or failed on each): none (a 503 adapter_not_loaded), prod (the route''s '
  'prod), base (prod, then the base model). A fallback answer belongs to no arm.';
COMMENT ON COLUMN serve.route.max_canary_pct IS
  'Most users all canaries of the route may get together (default 50 %); above it needs the override.';
