-- Near-duplicate prompts, found once when a row is embedded instead of at every snapshot.
--
-- Only prompts a dataset can use are searched and indexed: a log row whose signal a candidate
-- view reads (obs.is_dataset_prompt: thumbs, an edit or a regeneration, and no PII flag). Every
-- candidate view's prompt row carries one, and a snapshot's dedup only compares candidates, so
-- the rows without one (most traffic) would cost a search and an index entry for edges nobody
-- reads. A row is queued when it has both an embedding and a signal, whichever comes last.
--
-- obs.prompt_neighbour_scan: one row per embedded log row. candidate says the row has a
-- signal; radius IS NULL on a candidate means "its neighbours not searched yet" (the embedder's
-- queue); otherwise the row's k nearest candidate prompts of the same tenant and route within
-- `radius` cosine distance are in obs.prompt_neighbour, and prompt_hash holds
-- train.prompt_hash(messages), so a snapshot need not recompute it.
-- obs.prompt_embedding: the candidates' embeddings, copied from the log, with one HNSW index:
-- the search's own index (obs.compute_prompt_neighbours).
-- obs.prompt_neighbour: one row per undirected edge, the older end (created_at, id) first.
-- All carry (id, created_at), the log's partitioned primary key. Rows hold ids, a distance,
-- a hash and the embedding, no text; deleting log rows through obs.inference_log deletes them
-- too.

-- The signal a candidate view reads from a log row (train.sft_candidate: an edit;
-- train.kto_candidate: thumbs up or down; train.pair_candidate: a regeneration or an edit),
-- and no PII flag. A superset of each view's own rules (consent, status, age are theirs).
CREATE OR REPLACE FUNCTION obs.is_dataset_prompt(
  p_fb_explicit smallint, p_fb_regen boolean, p_fb_edited boolean, p_pii_flags smallint
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT coalesce(p_pii_flags, 0) = 0
     AND (coalesce(p_fb_regen, false) OR coalesce(p_fb_edited, false)
          OR coalesce(p_fb_explicit, 0) <> 0)
$$;
COMMENT ON FUNCTION obs.is_dataset_prompt(smallint, boolean, boolean, smallint) IS
  'A log row carries a signal some candidate view reads (thumbs, edit, regeneration) and no PII.';
COMMENT ON TABLE obs.prompt_neighbour_scan IS
  'Per embedded log row: a dataset candidate or not; neighbours searched (radius, k) or pending.';
COMMENT ON COLUMN obs.prompt_neighbour_scan.log_id IS 'id of the embedded obs.inference_log row.';
COMMENT ON COLUMN obs.prompt_neighbour_scan.created_at IS
  'created_at of that row (with log_id, its primary key).';
COMMENT ON COLUMN obs.prompt_neighbour_scan.tenant_id IS 'The log row''s tenant.';
COMMENT ON COLUMN obs.prompt_neighbour_scan.route IS
  'The log row''s route: neighbours are searched within it.';
COMMENT ON COLUMN obs.prompt_neighbour_scan.radius IS
  'The cosine distance the search used; NULL: not searched (a candidate then waits in the queue).';
COMMENT ON COLUMN obs.prompt_neighbour_scan.max_neighbours IS
  'k of that search: at most this many neighbours were kept.';
COMMENT ON COLUMN obs.prompt_neighbour_scan.prompt_hash IS
  'train.prompt_hash(messages), set with radius, so a snapshot need not compute it.';
COMMENT ON COLUMN obs.prompt_neighbour_scan.scanned_at IS 'When it was searched.';
COMMENT ON COLUMN obs.prompt_neighbour_scan.candidate IS
  'The row has a signal a dataset uses (obs.is_dataset_prompt): only '
  'candidates are searched and indexed.';
COMMENT ON TABLE obs.prompt_embedding IS
  'Per embedded candidate log row: its prompt embedding, for the near-duplicate search (HNSW).';
COMMENT ON COLUMN obs.prompt_embedding.log_id IS 'id of the candidate obs.inference_log row.';
COMMENT ON COLUMN obs.prompt_embedding.created_at IS
  'created_at of that row (with log_id, its primary key).';
COMMENT ON COLUMN obs.prompt_embedding.tenant_id IS
  'The log row''s tenant: the search stays within it.';
COMMENT ON COLUMN obs.prompt_embedding.route IS 'The log row''s route: the search stays within it.';
COMMENT ON COLUMN obs.prompt_embedding.embedding IS
  'The prompt''s embedding, copied from obs.inference_log.embedding.';
COMMENT ON TABLE obs.prompt_neighbour IS
  'Near-duplicate prompts (same tenant and route, within the search radius), each pair once.';
COMMENT ON COLUMN obs.prompt_neighbour.tenant_id IS 'The tenant of both rows.';
COMMENT ON COLUMN obs.prompt_neighbour.route IS 'The route of both rows.';
COMMENT ON COLUMN obs.prompt_neighbour.a_id IS
  'id of the older log row: (a_created_at, a_id) < (b_created_at, b_id).';
COMMENT ON COLUMN obs.prompt_neighbour.a_created_at IS 'created_at of the older row.';
COMMENT ON COLUMN obs.prompt_neighbour.b_id IS 'id of the newer log row.';
COMMENT ON COLUMN obs.prompt_neighbour.b_created_at IS 'created_at of the newer row.';
COMMENT ON COLUMN obs.prompt_neighbour.distance IS 'Cosine distance of the two prompt embeddings.';

-- A row that gets an embedding (the embedder's UPDATE, or a client that logs one) gets its scan
-- row; when it is a candidate it is queued and its embedding copied for the search. A changed
-- embedding is searched again, a removed one leaves the search index (the row is then marked
-- searched with no edges). A row that gets its signal after its embedding (feedback, a
-- regeneration) is queued then. Both are UPDATEs of the same log row, so whichever commits
-- second sees the other's columns in NEW.
CREATE OR REPLACE FUNCTION obs.prompt_neighbour_enqueue() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_candidate boolean :=
    obs.is_dataset_prompt(NEW.fb_explicit, NEW.fb_regen, NEW.fb_edited, NEW.pii_flags);
BEGIN
  IF NEW.embedding IS NULL THEN
    DELETE FROM obs.prompt_embedding WHERE log_id = NEW.id AND created_at = NEW.created_at;
    RETURN NULL;
  END IF;
  INSERT INTO obs.prompt_neighbour_scan (log_id, created_at, tenant_id, route, candidate)
  VALUES (NEW.id, NEW.created_at, NEW.tenant_id, NEW.route, v_candidate)
  ON CONFLICT (log_id, created_at) DO UPDATE
    SET radius = NULL, max_neighbours = NULL, prompt_hash = NULL, scanned_at = NULL,
        candidate = EXCLUDED.candidate
    WHERE TG_OP = 'UPDATE';  -- a new embedding or a new signal: search again
  IF v_candidate THEN
    INSERT INTO obs.prompt_embedding (log_id, created_at, tenant_id, route, embedding)
    VALUES (NEW.id, NEW.created_at, NEW.tenant_id, NEW.route, NEW.embedding)
    ON CONFLICT (log_id, created_at) DO UPDATE SET embedding = EXCLUDED.embedding;
  ELSIF TG_OP = 'UPDATE' THEN  -- re-embedded without a signal (e.g. flagged PII meanwhile)
    DELETE FROM obs.prompt_embedding WHERE log_id = NEW.id AND created_at = NEW.created_at;
  END IF;
  RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER inference_log_embedded
  AFTER INSERT ON obs.inference_log
  FOR EACH ROW WHEN (NEW.embedding IS NOT NULL)
  EXECUTE FUNCTION obs.prompt_neighbour_enqueue();
CREATE OR REPLACE TRIGGER inference_log_reembedded
  AFTER UPDATE OF embedding ON obs.inference_log
  FOR EACH ROW WHEN (NEW.embedding IS DISTINCT FROM OLD.embedding)
  EXECUTE FUNCTION obs.prompt_neighbour_enqueue();
CREATE OR REPLACE TRIGGER inference_log_dataset_signal
  AFTER UPDATE OF fb_explicit, fb_regen, fb_edited, pii_flags ON obs.inference_log
  FOR EACH ROW WHEN (NEW.embedding IS NOT NULL
                     AND obs.is_dataset_prompt(NEW.fb_explicit, NEW.fb_regen, NEW.fb_edited,
                                               NEW.pii_flags)
                     AND NOT obs.is_dataset_prompt(OLD.fb_explicit, OLD.fb_regen, OLD.fb_edited,
                                                   OLD.pii_flags))
  EXECUTE FUNCTION obs.prompt_neighbour_enqueue();

-- Deleted log rows (forgetting a user) take their markers, embeddings (by the cascade) and
-- edges with them. Dropped
-- partitions (retention) do not fire triggers: obs.prune_prompt_neighbours covers those.
CREATE OR REPLACE FUNCTION obs.prompt_neighbour_forget() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  DELETE FROM obs.prompt_neighbour_scan s USING old_rows o
   WHERE s.log_id = o.id AND s.created_at = o.created_at;
  DELETE FROM obs.prompt_neighbour e USING old_rows o WHERE e.a_id = o.id;
  DELETE FROM obs.prompt_neighbour e USING old_rows o WHERE e.b_id = o.id;
  RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER inference_log_forget_neighbours
  AFTER DELETE ON obs.inference_log REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION obs.prompt_neighbour_forget();

-- Markers, embeddings (by the cascade) and edges of rows older than p_before (call after
-- dropping old partitions).
CREATE OR REPLACE FUNCTION obs.prune_prompt_neighbours(p_before timestamptz)
RETURNS bigint LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
  WITH s AS (DELETE FROM obs.prompt_neighbour_scan WHERE created_at < p_before RETURNING 1),
       e AS (DELETE FROM obs.prompt_neighbour WHERE a_created_at < p_before RETURNING 1)
  SELECT (SELECT count(*) FROM s) + (SELECT count(*) FROM e)
$$;

-- No text, but tenant data all the same: the usual isolation for anyone who is not the owner.
ALTER TABLE obs.prompt_neighbour_scan ENABLE ROW LEVEL SECURITY;
ALTER TABLE obs.prompt_neighbour ENABLE ROW LEVEL SECURITY;
ALTER TABLE obs.prompt_embedding ENABLE ROW LEVEL SECURITY;  -- no policy, no grant: owner only
DROP POLICY IF EXISTS tenant_isolation ON obs.prompt_neighbour_scan;
CREATE POLICY tenant_isolation ON obs.prompt_neighbour_scan TO cft_app
  USING (tenant_id = auth.current_tenant_id());
DROP POLICY IF EXISTS read_all ON obs.prompt_neighbour_scan;
CREATE POLICY read_all ON obs.prompt_neighbour_scan FOR SELECT TO cft_dashboard USING (true);
DROP POLICY IF EXISTS tenant_isolation ON obs.prompt_neighbour;
CREATE POLICY tenant_isolation ON obs.prompt_neighbour TO cft_app
  USING (tenant_id = auth.current_tenant_id());
DROP POLICY IF EXISTS read_all ON obs.prompt_neighbour;
CREATE POLICY read_all ON obs.prompt_neighbour FOR SELECT TO cft_dashboard USING (true);
GRANT SELECT ON obs.prompt_neighbour_scan, obs.prompt_neighbour TO cft_app, cft_dashboard;
REVOKE ALL ON FUNCTION obs.prune_prompt_neighbours(timestamptz) FROM PUBLIC;
