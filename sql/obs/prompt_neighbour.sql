-- Near-duplicate prompts, found once when a row is embedded instead of at every snapshot.
--
-- obs.prompt_neighbour_scan: one row per embedded log row. radius IS NULL means "embedded, its
-- neighbours not searched yet" (the embedder's queue); otherwise the row's k nearest prompts of
-- the same tenant and route within `radius` cosine distance are in obs.prompt_neighbour, and
-- prompt_hash holds train.prompt_hash(messages), so a snapshot need not recompute it.
-- obs.prompt_neighbour: one row per undirected edge, the older end (created_at, id) first.
-- Both carry (id, created_at), the log's partitioned primary key. Rows hold ids, a distance
-- and a hash, no text; deleting log rows through obs.inference_log deletes them too.

CREATE TABLE obs.prompt_neighbour_scan (
  log_id         bigint NOT NULL,
  created_at     timestamptz NOT NULL,
  tenant_id      int NOT NULL,
  route          text NOT NULL,
  radius         double precision,     -- NULL: pending; else the search radius used
  max_neighbours int,                  -- k of that search
  prompt_hash    bytea,                -- train.prompt_hash(messages), set with radius
  scanned_at     timestamptz,
  PRIMARY KEY (log_id, created_at)
);
-- The queue (partial: only what is pending) and the snapshot's range read of a route.
CREATE INDEX prompt_neighbour_scan_pending_idx
  ON obs.prompt_neighbour_scan (created_at) WHERE radius IS NULL;
CREATE INDEX prompt_neighbour_scan_route_idx
  ON obs.prompt_neighbour_scan (tenant_id, route, created_at);
COMMENT ON TABLE obs.prompt_neighbour_scan IS
  'Per embedded log row: neighbours searched (radius, k) or pending (radius NULL), prompt hash.';

CREATE TABLE obs.prompt_neighbour (
  tenant_id    int NOT NULL,
  route        text NOT NULL,
  a_id         bigint NOT NULL,          -- the older end: (a_created_at, a_id) < (b_created_at, b_id)
  a_created_at timestamptz NOT NULL,
  b_id         bigint NOT NULL,
  b_created_at timestamptz NOT NULL,
  distance     double precision NOT NULL, -- cosine distance of the two prompt embeddings
  PRIMARY KEY (a_id, b_id)
);
CREATE INDEX prompt_neighbour_b_idx ON obs.prompt_neighbour (b_id);
CREATE INDEX prompt_neighbour_route_idx
  ON obs.prompt_neighbour (tenant_id, route, b_created_at);
COMMENT ON TABLE obs.prompt_neighbour IS
  'Near-duplicate prompts (same tenant and route, within the search radius), each pair once.';

-- A row that gets an embedding (the embedder's UPDATE, or a client that logs one) is queued.
CREATE OR REPLACE FUNCTION obs.prompt_neighbour_enqueue() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
  INSERT INTO obs.prompt_neighbour_scan (log_id, created_at, tenant_id, route)
  VALUES (NEW.id, NEW.created_at, NEW.tenant_id, NEW.route)
  ON CONFLICT (log_id, created_at) DO UPDATE
    SET radius = NULL, max_neighbours = NULL, prompt_hash = NULL, scanned_at = NULL
    WHERE TG_OP = 'UPDATE';  -- a new embedding of an existing row: search again
  RETURN NULL;
END
$$;

CREATE TRIGGER inference_log_embedded
  AFTER INSERT ON obs.inference_log
  FOR EACH ROW WHEN (NEW.embedding IS NOT NULL)
  EXECUTE FUNCTION obs.prompt_neighbour_enqueue();
CREATE TRIGGER inference_log_reembedded
  AFTER UPDATE OF embedding ON obs.inference_log
  FOR EACH ROW WHEN (NEW.embedding IS NOT NULL AND NEW.embedding IS DISTINCT FROM OLD.embedding)
  EXECUTE FUNCTION obs.prompt_neighbour_enqueue();

-- Deleted log rows (forgetting a user) take their markers and edges with them. Dropped
-- partitions (retention) do not fire triggers: obs.prune_prompt_neighbours covers those.
CREATE OR REPLACE FUNCTION obs.prompt_neighbour_forget() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
  DELETE FROM obs.prompt_neighbour_scan s USING old_rows o
   WHERE s.log_id = o.id AND s.created_at = o.created_at;
  DELETE FROM obs.prompt_neighbour e USING old_rows o WHERE e.a_id = o.id;
  DELETE FROM obs.prompt_neighbour e USING old_rows o WHERE e.b_id = o.id;
  RETURN NULL;
END
$$;

CREATE TRIGGER inference_log_forget_neighbours
  AFTER DELETE ON obs.inference_log REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION obs.prompt_neighbour_forget();

-- Markers and edges of rows older than p_before (call after dropping old partitions).
CREATE OR REPLACE FUNCTION obs.prune_prompt_neighbours(p_before timestamptz)
RETURNS bigint LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
  WITH s AS (DELETE FROM obs.prompt_neighbour_scan WHERE created_at < p_before RETURNING 1),
       e AS (DELETE FROM obs.prompt_neighbour WHERE a_created_at < p_before RETURNING 1)
  SELECT (SELECT count(*) FROM s) + (SELECT count(*) FROM e)
$$;

-- No text, but tenant data all the same: the usual isolation for anyone who is not the owner.
ALTER TABLE obs.prompt_neighbour_scan ENABLE ROW LEVEL SECURITY;
ALTER TABLE obs.prompt_neighbour ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON obs.prompt_neighbour_scan TO cft_app
  USING (tenant_id = auth.current_tenant_id());
CREATE POLICY read_all ON obs.prompt_neighbour_scan FOR SELECT TO cft_dashboard USING (true);
CREATE POLICY tenant_isolation ON obs.prompt_neighbour TO cft_app
  USING (tenant_id = auth.current_tenant_id());
CREATE POLICY read_all ON obs.prompt_neighbour FOR SELECT TO cft_dashboard USING (true);
GRANT SELECT ON obs.prompt_neighbour_scan, obs.prompt_neighbour TO cft_app, cft_dashboard;
REVOKE ALL ON FUNCTION obs.prune_prompt_neighbours(timestamptz) FROM PUBLIC;
