"""Only prompts a dataset can use are searched for near duplicates (issue 26, item 6).

A candidate view's prompt row always carries a signal (an edit, thumbs up or down, a
regeneration) and no PII flag, and a snapshot's semantic dedup only compares candidates: the
neighbour search of every other embedded row (most traffic) found edges nobody reads.

* obs.is_dataset_prompt(fb_explicit, fb_regen, fb_edited, pii_flags): that signal.
* obs.prompt_neighbour_scan.candidate: the row has it. The queue (pending index) holds
  candidates only; backfilled from the log. obs.prompt_embedding (the search's HNSW index)
  holds candidates only: the others' copies are deleted (their stored edges stay).
* obs.prompt_neighbour_enqueue sets candidate, copies the embedding of candidates only, and
  also runs on a new signal (trigger inference_log_dataset_signal: an UPDATE of fb_explicit,
  fb_regen, fb_edited or pii_flags that makes an embedded row a candidate), so a row is queued
  when it has both an embedding and a signal, whichever comes last.
* obs.compute_prompt_neighbours claims candidates only.

The downgrade restores the search of every embedded row (copies and queue entries back).

Revision ID: 20261213
Revises: 20261212
"""

from alembic import op

revision = "20261213"
down_revision = "20261212"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
-- The signal a candidate view reads from a log row.
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

ALTER TABLE obs.prompt_neighbour_scan
  ADD COLUMN candidate boolean NOT NULL DEFAULT false; -- obs.is_dataset_prompt: searched and indexed
COMMENT ON TABLE obs.prompt_neighbour_scan IS
  'Per embedded log row: a dataset candidate or not; neighbours searched (radius, k) or pending.';
COMMENT ON TABLE obs.prompt_embedding IS
  'Per embedded candidate log row: its prompt embedding, for the near-duplicate search (HNSW).';
-- Every embedded row with a signal is a candidate; the others leave the search index (edges
-- already found stay: a snapshot joins only candidates), and those not searched yet leave the
-- queue.
UPDATE obs.prompt_neighbour_scan s SET candidate = true
  FROM obs.inference_log l
 WHERE l.id = s.log_id AND l.created_at = s.created_at
   AND obs.is_dataset_prompt(l.fb_explicit, l.fb_regen, l.fb_edited, l.pii_flags);
DELETE FROM obs.prompt_embedding e USING obs.prompt_neighbour_scan s
 WHERE s.log_id = e.log_id AND s.created_at = e.created_at AND NOT s.candidate;
DROP INDEX obs.prompt_neighbour_scan_pending_idx;
CREATE INDEX prompt_neighbour_scan_pending_idx
  ON obs.prompt_neighbour_scan (created_at) WHERE radius IS NULL AND candidate;

CREATE OR REPLACE FUNCTION obs.prompt_neighbour_enqueue() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
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

CREATE TRIGGER inference_log_dataset_signal
  AFTER UPDATE OF fb_explicit, fb_regen, fb_edited, pii_flags ON obs.inference_log
  FOR EACH ROW WHEN (NEW.embedding IS NOT NULL
                     AND obs.is_dataset_prompt(NEW.fb_explicit, NEW.fb_regen, NEW.fb_edited,
                                               NEW.pii_flags)
                     AND NOT obs.is_dataset_prompt(OLD.fb_explicit, OLD.fb_regen, OLD.fb_edited,
                                                   OLD.pii_flags))
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
"""

DOWNGRADE_SQL = r"""
DROP TRIGGER inference_log_dataset_signal ON obs.inference_log;
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

-- Every embedded row back in the search index; those never searched are queued again.
INSERT INTO obs.prompt_embedding (log_id, created_at, tenant_id, route, embedding)
SELECT l.id, l.created_at, l.tenant_id, l.route, l.embedding
  FROM obs.prompt_neighbour_scan s
  JOIN obs.inference_log l ON l.id = s.log_id AND l.created_at = s.created_at
 WHERE NOT s.candidate AND l.embedding IS NOT NULL
ON CONFLICT (log_id, created_at) DO NOTHING;
DROP INDEX obs.prompt_neighbour_scan_pending_idx;
CREATE INDEX prompt_neighbour_scan_pending_idx
  ON obs.prompt_neighbour_scan (created_at) WHERE radius IS NULL;
ALTER TABLE obs.prompt_neighbour_scan DROP COLUMN candidate;
COMMENT ON TABLE obs.prompt_neighbour_scan IS
  'Per embedded log row: neighbours searched (radius, k) or pending (radius NULL), prompt hash.';
COMMENT ON TABLE obs.prompt_embedding IS
  'Per embedded log row: its prompt embedding, for the near-duplicate search (one HNSW index).';
DROP FUNCTION obs.is_dataset_prompt(smallint, boolean, boolean, smallint);
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
