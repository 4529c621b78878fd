"""The neighbour search reads a narrow, unpartitioned copy of the embeddings (issue 26, item 6).

* obs.prompt_embedding (log_id, created_at, tenant_id, route, embedding halfvec(dim)) with one
  HNSW index (halfvec_cosine_ops): one row per embedded log row, a child of
  obs.prompt_neighbour_scan (ON DELETE CASCADE, so forgetting, retention pruning and tenant
  offboarding remove the copy with the scan row). Backfilled from the log, then indexed.
* obs.prompt_neighbour_enqueue copies the embedding (also on re-embedding) and removes the copy
  when a row's embedding is set to NULL; the re-embedded trigger fires for that too.
* obs.compute_prompt_neighbours searches obs.prompt_embedding: one HNSW search per queued row
  instead of one per weekly partition of obs.inference_log. Same radius, k, ef_search, filter,
  claim and edge rules.

The downgrade restores the search over the log and drops the copy.

Revision ID: 20261211
Revises: 20261210
"""

from alembic import op

revision = "20261211"
down_revision = "20261210"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
-- The table, its embedding column of the log's own type (halfvec(dim), dim a deployment setting).
DO $do$
BEGIN
  EXECUTE format('CREATE TABLE obs.prompt_embedding (
  log_id     bigint NOT NULL,
  created_at timestamptz NOT NULL,
  tenant_id  int NOT NULL,                -- the log row''s, as the search filters on them
  route      text NOT NULL,
  embedding  %s NOT NULL,
  PRIMARY KEY (log_id, created_at),
  FOREIGN KEY (log_id, created_at)
    REFERENCES obs.prompt_neighbour_scan (log_id, created_at) ON DELETE CASCADE
)',
    (SELECT format_type(atttypid, atttypmod) FROM pg_attribute
      WHERE attrelid = 'obs.inference_log'::regclass AND attname = 'embedding'));
END
$do$;
COMMENT ON TABLE obs.prompt_embedding IS
  'Per embedded log row: its prompt embedding, for the near-duplicate search (one HNSW index).';
ALTER TABLE obs.prompt_embedding ENABLE ROW LEVEL SECURITY;

-- Backfill: every queued or searched row whose log row has an embedding (one pass over the
-- scan table, a primary-key probe into the log per row), then the index in one build.
INSERT INTO obs.prompt_embedding (log_id, created_at, tenant_id, route, embedding)
SELECT s.log_id, s.created_at, s.tenant_id, s.route, l.embedding
  FROM obs.prompt_neighbour_scan s
  JOIN obs.inference_log l ON l.id = s.log_id AND l.created_at = s.created_at
 WHERE l.embedding IS NOT NULL;
CREATE INDEX prompt_embedding_embedding_idx
  ON obs.prompt_embedding USING hnsw (embedding halfvec_cosine_ops);

CREATE OR REPLACE FUNCTION obs.prompt_neighbour_enqueue() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
  IF NEW.embedding IS NULL THEN
    DELETE FROM obs.prompt_embedding WHERE log_id = NEW.id AND created_at = NEW.created_at;
    RETURN NULL;
  END IF;
  INSERT INTO obs.prompt_neighbour_scan (log_id, created_at, tenant_id, route)
  VALUES (NEW.id, NEW.created_at, NEW.tenant_id, NEW.route)
  ON CONFLICT (log_id, created_at) DO UPDATE
    SET radius = NULL, max_neighbours = NULL, prompt_hash = NULL, scanned_at = NULL
    WHERE TG_OP = 'UPDATE';  -- a new embedding of an existing row: search again
  INSERT INTO obs.prompt_embedding (log_id, created_at, tenant_id, route, embedding)
  VALUES (NEW.id, NEW.created_at, NEW.tenant_id, NEW.route, NEW.embedding)
  ON CONFLICT (log_id, created_at) DO UPDATE SET embedding = EXCLUDED.embedding;
  RETURN NULL;
END
$$;

DROP TRIGGER inference_log_reembedded ON obs.inference_log;
CREATE TRIGGER inference_log_reembedded
  AFTER UPDATE OF embedding ON obs.inference_log
  FOR EACH ROW WHEN (NEW.embedding IS DISTINCT FROM OLD.embedding)
  EXECUTE FUNCTION obs.prompt_neighbour_enqueue();

CREATE OR REPLACE FUNCTION obs.compute_prompt_neighbours(
  p_radius     double precision DEFAULT 0.2,
  p_neighbours int DEFAULT 10,
  p_limit      int DEFAULT 256
) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public
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
     WHERE s.radius IS NULL
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
"""

DOWNGRADE_SQL = r"""
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

DROP TRIGGER inference_log_reembedded ON obs.inference_log;
CREATE TRIGGER inference_log_reembedded
  AFTER UPDATE OF embedding ON obs.inference_log
  FOR EACH ROW WHEN (NEW.embedding IS NOT NULL AND NEW.embedding IS DISTINCT FROM OLD.embedding)
  EXECUTE FUNCTION obs.prompt_neighbour_enqueue();

CREATE OR REPLACE FUNCTION obs.compute_prompt_neighbours(
  p_radius     double precision DEFAULT 0.2,
  p_neighbours int DEFAULT 10,
  p_limit      int DEFAULT 256
) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public
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
     WHERE s.radius IS NULL
     ORDER BY s.created_at DESC  -- newest first, like the embedder: the next snapshot needs them
     LIMIT p_limit
       FOR UPDATE SKIP LOCKED
  ), q AS MATERIALIZED (
    SELECT c.log_id, c.created_at, l.tenant_id, l.route, l.embedding, l.messages
      FROM claimed c
      LEFT JOIN obs.inference_log l ON l.id = c.log_id AND l.created_at = c.created_at
  ), near AS (
    SELECT q.tenant_id, q.route, q.log_id, q.created_at, nb.id AS n_id,
           nb.created_at AS n_created_at, nb.dist
      FROM q CROSS JOIN LATERAL (
        SELECT n.id, n.created_at, n.embedding <=> q.embedding AS dist
          FROM obs.inference_log n
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

DROP TABLE obs.prompt_embedding;
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
