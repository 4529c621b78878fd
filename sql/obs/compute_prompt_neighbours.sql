-- Search the neighbours of up to p_limit queued rows (obs.prompt_neighbour_scan: candidates with
-- radius NULL): for each, its p_neighbours nearest candidate prompts of the same tenant and
-- route through the HNSW
-- index of obs.prompt_embedding (one search per row over narrow rows, not one per weekly
-- partition of the log; pgvector 0.8 iterative scan, so the tenant/route filter still yields
-- k rows), keep those within p_radius as edges, mark the row searched and store its prompt
-- hash. One statement per batch; returns how many rows were marked.
--
-- Run it after the embeddings are committed: of two rows embedded concurrently, the one whose
-- search starts later sees the other, so every pair is found by at least one end. A crash
-- leaves the rows queued (SKIP LOCKED lets several workers share the queue); edges are
-- inserted ON CONFLICT DO NOTHING, so a repeated search changes nothing.
CREATE OR REPLACE FUNCTION obs.compute_prompt_neighbours(
  p_radius     double precision DEFAULT 0.2,
  p_neighbours int DEFAULT 10,
  p_limit      int DEFAULT 256
) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
SET hnsw.iterative_scan = 'relaxed_order'
SET hnsw.ef_search = 40
-- A small route would rather be read through its btree and sorted: O(route) per row. With
-- sorts and sequential scans disabled the HNSW path wins (as in train.create_snapshot).
SET enable_sort = off
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $fn$
DECLARE
  v_n int;
BEGIN
  IF p_radius IS NULL OR p_radius <= 0 OR p_radius > 2 THEN
    RAISE EXCEPTION 'radius must be a cosine distance in (0, 2], got %', p_radius
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_neighbours IS NULL OR p_neighbours < 1 OR p_neighbours > 1000 THEN
    RAISE EXCEPTION 'neighbours must be in [1, 1000], got %', p_neighbours
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM set_config('hnsw.ef_search', greatest(2 * p_neighbours, 40)::text, true);

  WITH claimed AS (
    SELECT s.log_id, s.created_at FROM obs.prompt_neighbour_scan s
     WHERE s.radius IS NULL AND s.candidate
     ORDER BY s.created_at DESC  -- newest first, like the embedder: the next snapshot needs them
     LIMIT p_limit
       FOR UPDATE SKIP LOCKED
  ), q AS MATERIALIZED (  -- the log row for its messages (the hash) and to see it still exists
    SELECT c.log_id, c.created_at, l.tenant_id, l.route, e.embedding, l.messages
      FROM claimed c
      LEFT JOIN obs.inference_log l ON l.id = c.log_id AND l.created_at = c.created_at
      LEFT JOIN obs.prompt_embedding e ON e.log_id = c.log_id AND e.created_at = c.created_at
  ), near AS (
    SELECT q.tenant_id, q.route, q.log_id, q.created_at, nb.id AS n_id,
           nb.created_at AS n_created_at, nb.dist
      FROM q CROSS JOIN LATERAL (
        SELECT n.log_id AS id, n.created_at, n.embedding <=> q.embedding AS dist
          FROM obs.prompt_embedding n
         WHERE n.tenant_id = q.tenant_id AND n.route = q.route
         ORDER BY n.embedding <=> q.embedding
         LIMIT p_neighbours + 1) nb   -- + 1: the row itself comes back too
     WHERE q.embedding IS NOT NULL AND nb.dist < p_radius AND nb.id <> q.log_id
  ), edges AS (
    INSERT INTO obs.prompt_neighbour
           (tenant_id, route, a_id, a_created_at, b_id, b_created_at, distance)
    SELECT DISTINCT ON (a_id, b_id) tenant_id, route, a_id, a_created_at, b_id, b_created_at, dist
      FROM (SELECT tenant_id, route, dist,
                   CASE WHEN older THEN log_id ELSE n_id END AS a_id,
                   CASE WHEN older THEN created_at ELSE n_created_at END AS a_created_at,
                   CASE WHEN older THEN n_id ELSE log_id END AS b_id,
                   CASE WHEN older THEN n_created_at ELSE created_at END AS b_created_at
              FROM (SELECT near.*, (created_at, log_id) < (n_created_at, n_id) AS older
                      FROM near) o) e
     ORDER BY a_id, b_id  -- one global order: two workers sharing an edge cannot deadlock
    ON CONFLICT DO NOTHING
    RETURNING 1
  ), gone AS (  -- the log row was deleted meanwhile: nothing to search
    DELETE FROM obs.prompt_neighbour_scan s USING q
     WHERE s.log_id = q.log_id AND s.created_at = q.created_at AND q.tenant_id IS NULL
    RETURNING 1
  ), marked AS (
    UPDATE obs.prompt_neighbour_scan s
       SET radius = p_radius, max_neighbours = p_neighbours, scanned_at = now(),
           prompt_hash = train.prompt_hash(q.messages)
      FROM q
     WHERE s.log_id = q.log_id AND s.created_at = q.created_at AND q.tenant_id IS NOT NULL
    RETURNING 1
  )
  -- Every data-modifying CTE runs to completion whether read or not.
  SELECT count(*) INTO v_n FROM marked;
  RETURN v_n;
END
$fn$;

REVOKE ALL ON FUNCTION obs.compute_prompt_neighbours(double precision, int, int) FROM PUBLIC;
