-- Build and freeze one snapshot in the caller's transaction; returns the snapshot row.
--
-- Steps, each counted in counts: view_rows (the method's candidate view, this tenant and route)
-- -> in_window (created_at in [since, until)) -> live_ok (not marked deleted or PII in
-- obs.deleted_log since the view's refresh, not older than the route's oldest log row) ->
-- exact_dedup (one row per normalised prompt hash, keeping the best-rated, then newest) ->
-- semantic_dedup (a row is dropped when a better-ranked candidate's prompt lies within
-- p_dedup_threshold cosine distance: the edges found at embedding time, obs.prompt_neighbour,
-- plus an HNSW probe for survivors not searched within the threshold; rows without an
-- embedding are kept and counted). The split is deterministic (train.split_bucket of each
-- example's hash), set_hash is sha256 over the sorted example hashes.
-- How: the candidate table holds keys, ranks, hashes and each candidate's TID in the view;
-- exact and semantic dedup run on those keys; the split, set_hash and a check that no hash
-- repeats come from the survivors' keys; the survivors are read back from the view by TID, in
-- heap order, and their examples inserted as they are.
-- The view is read twice. Its rows cannot move in between (this transaction holds the view's
-- ACCESS SHARE lock, so a plain REFRESH waits), but a REFRESH ... CONCURRENTLY may commit and
-- delete the rows it replaces: their TIDs then find nothing, the count of written examples
-- falls short, and the snapshot is refused (serialization_failure; the service takes it again).
-- query_sql is the candidate query; params.write is the statement that writes the examples.
CREATE OR REPLACE FUNCTION train.create_snapshot(
  p_tenant_id       int,
  p_route           text,
  p_method          text,
  p_since           timestamptz DEFAULT NULL,
  p_until           timestamptz DEFAULT NULL,
  p_dedup_threshold double precision DEFAULT 0.1,
  p_eval_pct        int DEFAULT 10,
  p_neighbours      int DEFAULT 10,
  p_created_by      text DEFAULT NULL
) RETURNS train.dataset_snapshot
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, public, pg_temp
SET work_mem = '128MB'
SET hnsw.iterative_scan = 'relaxed_order'
SET hnsw.ef_search = 40
SET enable_sort = on
SET enable_seqscan = on
SET enable_bitmapscan = on
SET enable_nestloop = on
SET enable_mergejoin = on
SET enable_hashjoin = on
AS $fn$
DECLARE
  v_until   timestamptz := coalesce(p_until, now());
  v_since   timestamptz := coalesce(p_since, coalesce(p_until, now()) - interval '60 days');
  v_id      uuid := uuidv7();  -- time-ordered: the examples' snapshot_id index grows at its right edge
  v_view    text;
  v_prompt  text;  -- the prompt, from the view row v's example
  v_live    text := '';
  v_losers  bigint;
  v_signal  text;
  v_sql     text;
  v_edges   text;
  v_probe   text;
  v_write   text;
  v_dead    text;
  -- train.split_bucket(x.example_hash), written out
  v_bucket  text := '((get_byte(x.example_hash, 0)::bigint << 24) | (get_byte(x.example_hash, 1) << 16)'
                    ' | (get_byte(x.example_hash, 2) << 8) | get_byte(x.example_hash, 3)) % 100';
  v_n       bigint;
  v_live_n  bigint;
  v_probed  bigint := 0;
  v_searched bigint := 0;
  v_lo      timestamptz;
  v_hi      timestamptz;
  v_oldest  timestamptz;
  v_survivors bigint;
  v_counts  jsonb := '{}';
  v_steps   jsonb := '{}';
  v_t       timestamptz := clock_timestamp();
  v_params  jsonb;
  v_train   int;
  v_eval    int;
  v_hash    text;
  v_repeated bigint;
  v_snap    train.dataset_snapshot;
BEGIN
  -- The API calls this as cft_app on behalf of one tenant: it may freeze only that tenant.
  PERFORM train.check_snapshot_scope(p_tenant_id, p_route);
  IF v_since >= v_until THEN
    RAISE EXCEPTION 'empty window: since % is not before until %', v_since, v_until
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_dedup_threshold IS NULL OR p_dedup_threshold < 0 OR p_dedup_threshold > 2 THEN
    RAISE EXCEPTION 'dedup threshold must be a cosine distance in [0, 2], got %', p_dedup_threshold
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_eval_pct IS NULL OR p_eval_pct < 0 OR p_eval_pct > 100 THEN
    RAISE EXCEPTION 'eval_pct must be in [0, 100], got %', p_eval_pct
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF p_neighbours IS NULL OR p_neighbours < 1 OR p_neighbours > 1000 THEN
    RAISE EXCEPTION 'neighbours must be in [1, 1000], got %', p_neighbours
      USING ERRCODE = 'invalid_parameter_value';
  END IF;

  CASE p_method
  WHEN 'sft' THEN
    v_view := 'train.sft_candidate';
    v_prompt := $e$(v.example->'messages') - (-1)$e$;  -- the messages before the completion
    v_signal := 'n.fb_edited';
  WHEN 'kto' THEN
    v_view := 'train.kto_candidate';
    v_prompt := $e$v.example->'prompt'$e$;
    v_signal := 'n.fb_explicit <> 0';
  WHEN 'dpo', 'orpo', 'simpo' THEN
    v_view := 'train.pair_candidate';
    v_prompt := $e$v.example->'prompt'$e$;
    v_live := $e$
         AND c.chosen_created_at >= $5
         AND (c.chosen_log_id, c.chosen_created_at) NOT IN (TABLE pg_temp.snapshot_dead)$e$;
    v_signal := '(n.fb_regen OR n.fb_edited)';
  ELSE
    RAISE EXCEPTION 'unknown method %: choose sft, kto, dpo, orpo or simpo', p_method
      USING ERRCODE = 'invalid_parameter_value';
  END CASE;

  EXECUTE format('SELECT count(*) FROM %s c WHERE c.tenant_id = $1 AND c.route = $2', v_view)
    INTO v_n USING p_tenant_id, p_route;
  v_counts := v_counts || jsonb_build_object('view_rows', v_n);

  -- The candidate query: $1 tenant, $2 route, $3 since, $4 until, $5 the route's oldest log
  -- row (params.oldest_log_row: older candidates went with their partition); snapshot_dead is
  -- params.dead_rows, below. The prompt hash
  -- is the one stored when the row was embedded, computed here only for rows not searched
  -- yet (or not embedded); the example's hash comes from the view, and cand is the view row's
  -- TID (its example is copied at the write).
  v_sql := format($q$SELECT c.prompt_log_id, c.prompt_created_at, c.rating, c.created_at,
       (coalesce((SELECT t.consent_training FROM tenant t WHERE t.id = $1), false)
        AND c.prompt_created_at >= $5
        AND (c.prompt_log_id, c.prompt_created_at) NOT IN (TABLE pg_temp.snapshot_dead)%s
       ) AS live_ok,
       s.log_id IS NOT NULL AS has_embedding,
       s.radius AS neighbour_radius,
       coalesce(s.prompt_hash,
                (SELECT train.prompt_hash(%s) FROM %s v WHERE v.ctid = c.ctid))
         AS prompt_hash,
       c.example_hash, c.ctid AS cand
  FROM %s c
  LEFT JOIN obs.prompt_neighbour_scan s
    ON s.log_id = c.prompt_log_id AND s.created_at = c.prompt_created_at
   AND s.tenant_id = $1 AND s.route = $2  -- (the row's own: only the route's marks are read)
 WHERE c.tenant_id = $1 AND c.route = $2 AND c.created_at >= $3 AND c.created_at < $4$q$,
    v_live, v_prompt, v_view, v_view);

  -- The dead rows: marked (deleted or flagged since the last refresh) and really gone or PII.
  -- Markers may be conservative (a row moved out of DEFAULT is marked yet still there), so the
  -- log is probed for the marked rows alone. Usually empty (a refresh clears the markers).
  v_dead := $q$SELECT d.log_id, d.created_at FROM obs.deleted_log d
 WHERE NOT EXISTS (SELECT 1 FROM obs.inference_log x
                    WHERE x.id = d.log_id AND x.created_at = d.created_at AND x.pii_flags = 0)$q$;
  DROP TABLE IF EXISTS pg_temp.snapshot_dead;
  EXECUTE 'CREATE TEMP TABLE snapshot_dead ON COMMIT DROP AS ' || v_dead;
  DROP TABLE IF EXISTS pg_temp.snapshot_candidate;
  SELECT min(l.created_at) INTO v_oldest FROM obs.inference_log l
   WHERE l.tenant_id = p_tenant_id AND l.route = p_route;
  -- Hash joins whatever the view's statistics say (a view a migration just recreated has none
  -- until autovacuum reaches it: the planner chose 400k index probes, +1 s at 1M rows); both
  -- sides are read by tenant and route, so a small route reads little.
  PERFORM set_config('enable_nestloop', 'off', true);
  PERFORM set_config('enable_mergejoin', 'off', true);
  EXECUTE 'CREATE TEMP TABLE snapshot_candidate ON COMMIT DROP AS ' || v_sql
    USING p_tenant_id, p_route, v_since, v_until, coalesce(v_oldest, 'infinity');
  ANALYZE snapshot_candidate;
  SELECT count(*), count(*) FILTER (WHERE live_ok), min(prompt_created_at), max(prompt_created_at)
    INTO v_n, v_live_n, v_lo, v_hi FROM snapshot_candidate;
  v_counts := v_counts || jsonb_build_object('in_window', v_n, 'live_ok', v_live_n);
  v_steps := v_steps || jsonb_build_object('candidates',
               round(extract(epoch FROM clock_timestamp() - v_t) * 1000)); v_t := clock_timestamp();

  -- Every join below is an equi-join of thousands of rows: hash joins (set above).

  -- Near pairs between live candidates, each side named by its prompt hash (its exact-dedup
  -- group): an edge to any exact duplicate of a survivor counts for the survivor.
  -- (lc: the live candidates' keys, below.)
  v_edges := $q$SELECT a.prompt_hash AS ha, b.prompt_hash AS hb
  FROM obs.prompt_neighbour e
  JOIN lc a ON a.prompt_log_id = e.a_id AND a.prompt_created_at = e.a_created_at
  JOIN lc b ON b.prompt_log_id = e.b_id AND b.prompt_created_at = e.b_created_at
 WHERE e.tenant_id = $1 AND e.route = $2 AND e.b_created_at BETWEEN $3 AND $4
   AND e.a_created_at >= $3
   AND e.distance < $5 AND a.prompt_hash <> b.prompt_hash$q$;

  -- Exact dedup (one row per normalised prompt: the best-rated, then newest, then highest id,
  -- then the lowest example hash, as two preference pairs may share a prompt row;
  -- keys only, cand is its row in the view) and, in the same statement, the semantic
  -- losers among the stored edges: of each near pair the worse-ranked one goes.
  -- Survivors whose neighbours were not searched within the threshold are probed below, and
  -- the losers of those pairs are added.
  DROP TABLE IF EXISTS pg_temp.snapshot_keep;
  EXECUTE format($q$CREATE TEMP TABLE snapshot_keep ON COMMIT DROP AS
WITH lc AS MATERIALIZED (
  SELECT prompt_hash, prompt_log_id, prompt_created_at, rating, created_at, has_embedding,
         coalesce(neighbour_radius >= $5, false) AS searched, cand, example_hash
    FROM snapshot_candidate
   WHERE live_ok
), k AS MATERIALIZED (
  SELECT DISTINCT ON (prompt_hash) *
    FROM lc
   ORDER BY prompt_hash, rating DESC, created_at DESC, prompt_log_id DESC, example_hash
), p AS (%s
), loser AS (
  SELECT DISTINCT CASE WHEN (a.rating, a.created_at, a.prompt_log_id)
                            > (b.rating, b.created_at, b.prompt_log_id)
                       THEN b.prompt_hash ELSE a.prompt_hash END AS h
    FROM p JOIN k a ON a.prompt_hash = p.ha JOIN k b ON b.prompt_hash = p.hb
   WHERE $6
)
SELECT k.*, x.h IS NOT NULL AS loser FROM k LEFT JOIN loser x ON x.h = k.prompt_hash$q$,
    v_edges)
    USING p_tenant_id, p_route, v_lo, v_hi, p_dedup_threshold, p_dedup_threshold > 0;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  v_counts := v_counts || jsonb_build_object('exact_dedup', v_n);
  SELECT count(*) FILTER (WHERE NOT has_embedding),
         count(*) FILTER (WHERE has_embedding AND NOT searched),
         count(*) FILTER (WHERE has_embedding AND searched),
         count(*) FILTER (WHERE loser)
    INTO v_n, v_probed, v_searched, v_losers FROM snapshot_keep;
  v_counts := v_counts || jsonb_build_object('without_embedding', v_n);
  -- The edge join is part of exact_dedup here, so step_ms.edges is 0 (the key stays for readers).
  v_steps := v_steps || jsonb_build_object('exact_dedup',
               round(extract(epoch FROM clock_timestamp() - v_t) * 1000), 'edges', 0);
  v_t := clock_timestamp();

  v_probe := format($q$SELECT k.prompt_hash AS ha, b.prompt_hash AS hb
  FROM snapshot_keep k
  JOIN obs.inference_log c ON c.id = k.prompt_log_id AND c.created_at = k.prompt_created_at
  CROSS JOIN LATERAL (
    SELECT n.id, n.created_at, n.embedding <=> c.embedding AS dist
      FROM obs.inference_log n
     WHERE n.tenant_id = $1 AND n.route = $2 AND n.created_at >= $3 AND n.created_at < $4
       AND n.pii_flags = 0 AND %s
     ORDER BY n.embedding <=> c.embedding
     LIMIT $5) nb
  JOIN snapshot_candidate b ON b.prompt_log_id = nb.id AND b.prompt_created_at = nb.created_at
 WHERE NOT k.searched AND c.embedding IS NOT NULL AND nb.dist < $6
   AND b.live_ok AND b.prompt_hash <> k.prompt_hash$q$, v_signal);

  IF p_dedup_threshold > 0 AND v_probed > 0 THEN
    -- Live HNSW probes for survivors not searched yet. A pair's loser does not depend on the
    -- other pairs, so the losers of these pairs join those of the edges.
    DROP TABLE IF EXISTS pg_temp.snapshot_pair;
    CREATE TEMP TABLE snapshot_pair (ha bytea NOT NULL, hb bytea NOT NULL) ON COMMIT DROP;
    PERFORM set_config('enable_nestloop', 'on', true);
    PERFORM set_config('enable_mergejoin', 'on', true);
    PERFORM set_config('hnsw.ef_search', greatest(p_neighbours * 2, 20)::text, true);
    -- On a small route the planner would rather read the route's rows through the btree
    -- and sort them: O(n) per probe. With sorts disabled the HNSW path wins.
    PERFORM set_config('enable_sort', 'off', true);
    PERFORM set_config('enable_seqscan', 'off', true);
    PERFORM set_config('enable_bitmapscan', 'off', true);
    EXECUTE 'INSERT INTO snapshot_pair ' || v_probe
      USING p_tenant_id, p_route, v_since, v_until, p_neighbours, p_dedup_threshold;
    PERFORM set_config('enable_sort', 'on', true);
    PERFORM set_config('enable_seqscan', 'on', true);
    PERFORM set_config('enable_bitmapscan', 'on', true);
    PERFORM set_config('enable_nestloop', 'off', true);
    PERFORM set_config('enable_mergejoin', 'off', true);
    v_steps := v_steps || jsonb_build_object('live_probes',
                 round(extract(epoch FROM clock_timestamp() - v_t) * 1000));
    v_t := clock_timestamp();
    UPDATE snapshot_keep k SET loser = true
      FROM (SELECT DISTINCT CASE WHEN (a.rating, a.created_at, a.prompt_log_id)
                                      > (b.rating, b.created_at, b.prompt_log_id)
                                 THEN b.prompt_hash ELSE a.prompt_hash END AS h
              FROM snapshot_pair p
              JOIN snapshot_keep a ON a.prompt_hash = p.ha
              JOIN snapshot_keep b ON b.prompt_hash = p.hb) x
     WHERE k.prompt_hash = x.h AND NOT k.loser;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_losers := v_losers + v_n;
  ELSE
    v_steps := v_steps || jsonb_build_object('live_probes', 0);
  END IF;
  IF p_dedup_threshold = 0 THEN
    v_probed := 0;
    v_searched := 0;
  END IF;
  v_survivors := (v_counts->>'exact_dedup')::bigint - v_losers;
  v_counts := v_counts || jsonb_build_object(
    'semantic_dedup', v_survivors,
    'searched_rows', v_searched, 'probed_live', v_probed);
  v_steps := v_steps || jsonb_build_object('semantic_dedup',
               round(extract(epoch FROM clock_timestamp() - v_t) * 1000)); v_t := clock_timestamp();

  -- The write: $1 the snapshot's id, $2 eval_pct; snapshot_keep holds the survivors' TIDs in
  -- the view. They are read in heap order (no sort of wide rows: the table has no key to
  -- insert in order, see train/dataset_example_guard.sql) and each view row's example
  -- is inserted as it is. The bucket is train.split_bucket(example_hash) written out (as a
  -- call it costs more).
  v_write := format($q$INSERT INTO train.dataset_example (snapshot_id, example_hash, split, log_ids, example)
SELECT $1, c.example_hash, CASE WHEN %s < $2 THEN 'eval' ELSE 'train' END, c.log_ids, c.example
  FROM %s c
 WHERE c.ctid = ANY (ARRAY(SELECT k.cand FROM snapshot_keep k WHERE NOT k.loser))$q$,
    replace(v_bucket, 'x.', 'c.'), v_view);

  v_params := jsonb_build_object(
    'tenant_id', p_tenant_id, 'route', p_route, 'method', p_method,
    'since', v_since, 'until', v_until, 'view', v_view,
    'dedup_threshold', p_dedup_threshold, 'neighbours', p_neighbours, 'eval_pct', p_eval_pct,
    'oldest_log_row', v_oldest,
    'exact_dedup', 'train.prompt_hash(prompt); keep max (rating, created_at, prompt_log_id),'
                   || ' then min example_hash',
    'semantic_dedup', E'-- lc: the live candidates (prompt_log_id, prompt_created_at, prompt_hash)\n'
                      || v_edges || E';\n-- rows not searched within the threshold:\n' || v_probe
                      || E';\n-- then the worse-ranked (rating, created_at, prompt_log_id) of'
                      || ' each pair is dropped',
    'split', 'eval when train.split_bucket(example_hash) < eval_pct; if none is and there'
             || ' are >= 2 examples, the one with the lowest (bucket, example_hash)',
    'set_hash', 'sha256 over the concatenated sorted example hashes',
    'dead_rows', v_dead,
    'write', v_write);

  -- A draft (set_hash NULL) takes its examples, then is sealed below.
  INSERT INTO train.dataset_snapshot
         (id, tenant_id, route, method, query_sql, params, counts, created_by)
  VALUES (v_id, p_tenant_id, p_route, p_method, v_sql, v_params, v_counts,
          coalesce(p_created_by, session_user));

  -- The split, the set_hash and the distinctness of the hashes, from the survivors' keys: the
  -- examples written below are the view rows these keys were read from.
  -- (Sorted once: both aggregates take the presorted input.)
  -- (The eval count is one aggregate: written twice, it is computed once.)
  EXECUTE format($q$SELECT count(*) - count(*) FILTER (WHERE %1$s < $1),
       count(*) FILTER (WHERE %1$s < $1),
       count(*) - count(DISTINCT x.example_hash),
       encode(sha256(coalesce(string_agg(x.example_hash, ''::bytea ORDER BY x.example_hash),
                              ''::bytea)), 'hex')
  FROM (SELECT example_hash FROM snapshot_keep WHERE NOT loser ORDER BY example_hash) x$q$,
    v_bucket)
    INTO v_train, v_eval, v_repeated, v_hash USING p_eval_pct;
  IF v_repeated > 0 THEN  -- the table has no key to refuse them
    RAISE EXCEPTION 'snapshot would hold % examples twice', v_repeated
      USING ERRCODE = 'unique_violation';
  END IF;

  -- The view's rows have not moved since the candidates were read: this transaction holds
  -- its ACCESS SHARE lock (a plain REFRESH waits), and a REFRESH ... CONCURRENTLY that
  -- committed meanwhile deleted the rows it replaced, whose TIDs then find nothing (their
  -- slots cannot be reused while this statement's snapshot needs them): counted below.
  -- This draft's rows skip the per-row insert check (train/dataset_example_guard.sql).
  -- verify_snapshot recomputes each example's hash and bucket.
  PERFORM set_config('cft.writing_snapshot', v_id::text, true);
  EXECUTE v_write USING v_id, p_eval_pct;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  PERFORM set_config('cft.writing_snapshot', '', true);
  IF v_n <> v_survivors THEN
    -- A REFRESH ... CONCURRENTLY committed since the candidates were read and replaced some
    -- of them: nothing is kept.
    RAISE EXCEPTION 'the candidate view % was refreshed while this snapshot was taken: % of % '
                    'examples are gone; take the snapshot again', v_view, v_survivors - v_n,
                    v_survivors
      USING ERRCODE = 'serialization_failure';
  END IF;

  -- A small snapshot whose buckets all miss the eval share still gets one eval example (the
  -- lowest bucket, then hash), so held-out metrics always exist.
  IF p_eval_pct > 0 AND v_eval = 0 AND v_train >= 2 THEN
    UPDATE train.dataset_example SET split = 'eval'
     WHERE snapshot_id = v_id
       AND example_hash = (SELECT example_hash FROM train.dataset_example WHERE snapshot_id = v_id
                            ORDER BY train.split_bucket(example_hash), example_hash LIMIT 1);
    v_train := v_train - 1;
    v_eval := 1;
  END IF;
  v_steps := v_steps || jsonb_build_object('write',
               round(extract(epoch FROM clock_timestamp() - v_t) * 1000));

  UPDATE train.dataset_snapshot
     SET n_train = v_train, n_eval = v_eval, set_hash = v_hash,
         params = params || jsonb_build_object('step_ms', v_steps)
   WHERE id = v_id
  RETURNING * INTO v_snap;

  DROP TABLE snapshot_dead;
  DROP TABLE snapshot_candidate;
  DROP TABLE snapshot_keep;
  DROP TABLE IF EXISTS pg_temp.snapshot_pair;
  RETURN v_snap;
END
$fn$;

REVOKE ALL ON FUNCTION train.create_snapshot(int, text, text, timestamptz, timestamptz,
  double precision, int, int, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION train.create_snapshot(int, text, text, timestamptz, timestamptz,
  double precision, int, int, text) TO cft_app;
