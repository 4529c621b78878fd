-- Frozen dataset snapshots: candidates of one tenant, route and window, deduplicated exactly
-- and semantically, split deterministically, hashed, stored with the query that produced them.

-- Hash of a prompt for exact dedup: roles and contents, content lower-cased with whitespace
-- collapsed. sha256 (256-bit), not hashtext (32-bit, collides at this scale).
CREATE OR REPLACE FUNCTION train.prompt_hash_v1(p_messages jsonb) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT sha256(convert_to(coalesce(string_agg(
           coalesce(m->>'role', '') || ':'
           || lower(regexp_replace(btrim(coalesce(m->>'content', '')), '\s+', ' ', 'g')),
           E'\n' ORDER BY o), ''), 'UTF8'))
    FROM jsonb_array_elements(CASE jsonb_typeof(p_messages) WHEN 'array' THEN p_messages
                                   ELSE jsonb_build_array(p_messages) END)
         WITH ORDINALITY AS e(m, o)
$$;

-- Hash of an example: sha256 of its canonical jsonb text (jsonb orders keys deterministically).
CREATE OR REPLACE FUNCTION train.example_hash_v1(p_example jsonb) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT sha256(convert_to(p_example::text, 'UTF8'))
$$;

-- Bucket 0..99 of an example hash (first 32 bits, unsigned): the train/eval split rule.
CREATE OR REPLACE FUNCTION train.split_bucket_v1(p_hash bytea) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT (((get_byte(p_hash, 0)::bigint << 24) | (get_byte(p_hash, 1) << 16)
          | (get_byte(p_hash, 2) << 8) | get_byte(p_hash, 3)) % 100)::int
$$;

-- Build and freeze one snapshot in the caller's transaction; returns the snapshot row.
--
-- Steps, each counted in counts: view_rows (the method's candidate view, this tenant and route)
-- -> in_window (created_at in [since, until)) -> live_ok (the log rows still exist, still have
-- pii_flags = 0, the tenant still consents: the view may be stale) -> exact_dedup (one row per
-- normalised prompt hash, keeping the best-rated, then newest) -> semantic_dedup (a row is
-- dropped when a better-ranked candidate's prompt lies within p_dedup_threshold cosine distance;
-- neighbours come from the HNSW index of obs.inference_log with an iterative scan and LIMIT
-- p_neighbours per row, never a pairwise scan; rows without an embedding are kept and counted).
CREATE OR REPLACE FUNCTION train.create_snapshot_v1(
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
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $fn$
DECLARE
  v_until   timestamptz := coalesce(p_until, now());
  v_since   timestamptz := coalesce(p_since, coalesce(p_until, now()) - interval '60 days');
  v_id      uuid := gen_random_uuid();
  v_view    text;
  v_example text;
  v_live    text := '';
  v_signal  text;
  v_sql     text;
  v_dedup   text;
  v_n       bigint;
  v_counts  jsonb := '{}';
  v_params  jsonb;
  v_train   int;
  v_eval    int;
  v_hash    text;
  v_snap    train.dataset_snapshot;
BEGIN
  -- The API calls this as cft_app on behalf of one tenant: it may freeze only that tenant.
  IF (current_setting('role') <> 'none' OR auth.current_tenant_id() IS NOT NULL)
     AND p_tenant_id IS DISTINCT FROM auth.current_tenant_id() THEN
    RAISE EXCEPTION 'a snapshot of tenant % can only be taken on its own behalf', p_tenant_id
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM serve.route WHERE name = p_route AND tenant_id = p_tenant_id) THEN
    RAISE EXCEPTION 'route % not found', p_route USING ERRCODE = 'no_data_found';
  END IF;
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
    v_view := 'train.sft_candidate_v1';
    v_example := $e$jsonb_build_object('messages', c.prompt || jsonb_build_array(
                    jsonb_build_object('role', 'assistant', 'content', c.completion)))$e$;
    v_signal := 'n.fb_edited';
  WHEN 'kto' THEN
    v_view := 'train.kto_candidate_v1';
    v_example := $e$jsonb_build_object('prompt', c.prompt,
                    'completion', jsonb_build_array(
                      jsonb_build_object('role', 'assistant', 'content', c.completion)),
                    'label', c.label)$e$;
    v_signal := 'n.fb_explicit <> 0';
  WHEN 'dpo', 'orpo', 'simpo' THEN
    v_view := 'train.pair_candidate_v1';
    v_example := $e$jsonb_build_object('prompt', c.prompt,
                    'chosen', jsonb_build_array(
                      jsonb_build_object('role', 'assistant', 'content', c.chosen)),
                    'rejected', jsonb_build_array(
                      jsonb_build_object('role', 'assistant', 'content', c.rejected)))$e$;
    v_live := $e$
         AND (c.chosen_log_id = c.prompt_log_id OR EXISTS (
               SELECT 1 FROM obs.inference_log x
                WHERE x.id = c.chosen_log_id AND x.created_at = c.chosen_created_at
                  AND x.pii_flags = 0))$e$;
    v_signal := '(n.fb_regen OR n.fb_edited)';
  ELSE
    RAISE EXCEPTION 'unknown method %: choose sft, kto, dpo, orpo or simpo', p_method
      USING ERRCODE = 'invalid_parameter_value';
  END CASE;

  -- The candidate query: $1 tenant, $2 route, $3 since, $4 until.
  v_sql := format($q$SELECT c.prompt_log_id, c.prompt_created_at, c.log_ids, c.rating, c.created_at,
       ex.example,
       train.prompt_hash_v1(c.prompt) AS prompt_hash,
       train.example_hash_v1(ex.example) AS example_hash,
       (c.created_at >= $3 AND c.created_at < $4) AS in_window,
       (l.id IS NOT NULL AND t.consent_training%s) AS live_ok,
       l.embedding
  FROM %s c
  CROSS JOIN LATERAL (SELECT %s AS example) ex
  LEFT JOIN obs.inference_log l
    ON l.id = c.prompt_log_id AND l.created_at = c.prompt_created_at
   AND l.tenant_id = $1 AND l.route = $2 AND l.pii_flags = 0
  LEFT JOIN tenant t ON t.id = c.tenant_id
 WHERE c.tenant_id = $1 AND c.route = $2$q$, v_live, v_view, v_example);

  DROP TABLE IF EXISTS pg_temp.snapshot_candidate;
  CREATE TEMP TABLE snapshot_candidate (
    prompt_log_id     bigint NOT NULL,
    prompt_created_at timestamptz NOT NULL,
    log_ids           bigint[] NOT NULL,
    rating            int NOT NULL,
    created_at        timestamptz NOT NULL,
    example           jsonb NOT NULL,
    prompt_hash       bytea NOT NULL,
    example_hash      bytea NOT NULL,
    in_window         boolean NOT NULL,
    live_ok           boolean NOT NULL,
    embedding         halfvec
  ) ON COMMIT DROP;

  EXECUTE 'INSERT INTO snapshot_candidate ' || v_sql
    USING p_tenant_id, p_route, v_since, v_until;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  v_counts := v_counts || jsonb_build_object('view_rows', v_n);

  DELETE FROM snapshot_candidate WHERE NOT in_window;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  v_counts := v_counts || jsonb_build_object('in_window', (v_counts->>'view_rows')::bigint - v_n);

  DELETE FROM snapshot_candidate WHERE NOT live_ok;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  v_counts := v_counts || jsonb_build_object('live_ok', (v_counts->>'in_window')::bigint - v_n);

  -- Exact dedup: one row per normalised prompt, the best-rated, then newest, then highest id.
  DROP TABLE IF EXISTS pg_temp.snapshot_example;
  CREATE TEMP TABLE snapshot_example ON COMMIT DROP AS
    SELECT DISTINCT ON (prompt_hash) *
      FROM snapshot_candidate
     ORDER BY prompt_hash, rating DESC, created_at DESC, prompt_log_id DESC;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  v_counts := v_counts || jsonb_build_object('exact_dedup', v_n);
  DROP TABLE snapshot_candidate;
  CREATE INDEX ON snapshot_example (prompt_log_id, prompt_created_at);
  ANALYZE snapshot_example;
  SELECT count(*) INTO v_n FROM snapshot_example WHERE embedding IS NULL;
  v_counts := v_counts || jsonb_build_object('without_embedding', v_n);

  -- Semantic dedup through the HNSW index. relaxed_order lets the filtered scan keep going until
  -- it has p_neighbours rows that pass the filter (pgvector 0.8); distance is checked outside.
  PERFORM set_config('hnsw.iterative_scan', 'relaxed_order', true);
  PERFORM set_config('hnsw.ef_search', greatest(p_neighbours * 2, 20)::text, true);
  -- On a small route the planner would rather read the route's rows through the btree and sort
  -- them: fine once, O(n) per probe and O(n^2) overall. With sorts disabled the HNSW path wins.
  PERFORM set_config('enable_sort', 'off', true);
  PERFORM set_config('enable_seqscan', 'off', true);
  PERFORM set_config('enable_bitmapscan', 'off', true);
  v_dedup := format($q$DELETE FROM snapshot_example c
 WHERE c.embedding IS NOT NULL AND EXISTS (
   SELECT 1
     FROM (SELECT n.id, n.created_at, n.embedding <=> c.embedding AS dist
             FROM obs.inference_log n
            WHERE n.tenant_id = $1 AND n.route = $2 AND n.created_at >= $3 AND n.created_at < $4
              AND n.pii_flags = 0 AND %s
            ORDER BY n.embedding <=> c.embedding
            LIMIT $5) nb
     JOIN snapshot_example b ON b.prompt_log_id = nb.id AND b.prompt_created_at = nb.created_at
    WHERE nb.dist < $6 AND nb.id <> c.prompt_log_id
      AND (b.rating, b.created_at, b.prompt_log_id) > (c.rating, c.created_at, c.prompt_log_id))$q$,
    v_signal);
  IF p_dedup_threshold > 0 THEN
    EXECUTE v_dedup USING p_tenant_id, p_route, v_since, v_until, p_neighbours, p_dedup_threshold;
    GET DIAGNOSTICS v_n = ROW_COUNT;
  ELSE
    v_n := 0;
  END IF;
  PERFORM set_config('enable_sort', 'on', true);
  PERFORM set_config('enable_seqscan', 'on', true);
  PERFORM set_config('enable_bitmapscan', 'on', true);
  v_counts := v_counts || jsonb_build_object('semantic_dedup',
                                             (v_counts->>'exact_dedup')::bigint - v_n);

  -- Split by hash bucket; a small snapshot whose buckets all miss the eval share still gets
  -- one eval example (the lowest bucket, then hash), so held-out metrics always exist.
  ALTER TABLE snapshot_example ADD COLUMN split text;
  UPDATE snapshot_example
     SET split = CASE WHEN train.split_bucket_v1(example_hash) < p_eval_pct THEN 'eval' ELSE 'train' END;
  IF p_eval_pct > 0 AND NOT EXISTS (SELECT 1 FROM snapshot_example WHERE split = 'eval')
     AND (SELECT count(*) FROM snapshot_example) >= 2 THEN
    UPDATE snapshot_example SET split = 'eval'
     WHERE example_hash = (SELECT example_hash FROM snapshot_example
                            ORDER BY train.split_bucket_v1(example_hash), example_hash LIMIT 1);
  END IF;
  SELECT count(*) FILTER (WHERE split = 'train'),
         count(*) FILTER (WHERE split = 'eval'),
         encode(sha256(coalesce(string_agg(example_hash, ''::bytea ORDER BY example_hash),
                                ''::bytea)), 'hex')
    INTO v_train, v_eval, v_hash
    FROM snapshot_example;

  v_params := jsonb_build_object(
    'tenant_id', p_tenant_id, 'route', p_route, 'method', p_method,
    'since', v_since, 'until', v_until, 'view', v_view,
    'dedup_threshold', p_dedup_threshold, 'neighbours', p_neighbours, 'eval_pct', p_eval_pct,
    'exact_dedup', 'train.prompt_hash_v1(prompt); keep max (rating, created_at, prompt_log_id)',
    'semantic_dedup', v_dedup,
    'split', 'eval when train.split_bucket_v1(example_hash) < eval_pct; if none is and there'
             || ' are >= 2 examples, the one with the lowest (bucket, example_hash)',
    'set_hash', 'sha256 over the concatenated sorted example hashes');

  INSERT INTO train.dataset_snapshot
         (id, tenant_id, route, method, query_sql, params, counts, n_train, n_eval, set_hash,
          created_by)
  VALUES (v_id, p_tenant_id, p_route, p_method, v_sql, v_params, v_counts, v_train, v_eval, v_hash,
          coalesce(p_created_by, session_user))
  RETURNING * INTO v_snap;

  INSERT INTO train.dataset_example (snapshot_id, example_hash, split, log_ids, example)
  SELECT v_id, example_hash, split, log_ids, example
    FROM snapshot_example;

  DROP TABLE snapshot_example;
  RETURN v_snap;
END
$fn$;

-- Recompute a snapshot's set hash and split from its stored examples: anyone can verify
-- what trained an adapter.
CREATE OR REPLACE FUNCTION train.verify_snapshot_v1(p_snapshot_id uuid)
RETURNS TABLE (set_hash_ok boolean, examples_ok boolean, split_ok boolean, n_examples bigint)
LANGUAGE sql STABLE AS $$
  WITH e AS (
    SELECT x.*, train.split_bucket_v1(x.example_hash) AS bucket,
           row_number() OVER (ORDER BY train.split_bucket_v1(x.example_hash), x.example_hash) AS rk,
           count(*) OVER () AS n_all,
           count(*) FILTER (WHERE train.split_bucket_v1(x.example_hash)
                                  < (s.params->>'eval_pct')::int) OVER () AS n_bucket_eval,
           (s.params->>'eval_pct')::int AS pct
      FROM train.dataset_example x JOIN train.dataset_snapshot s ON s.id = x.snapshot_id
     WHERE x.snapshot_id = p_snapshot_id
  )
  SELECT s.set_hash = encode(sha256(coalesce(string_agg(e.example_hash, ''::bytea
                                                        ORDER BY e.example_hash), ''::bytea)), 'hex'),
         coalesce(bool_and(e.example_hash = train.example_hash_v1(e.example)), true),
         coalesce(bool_and(e.split = CASE
                             WHEN e.bucket < e.pct THEN 'eval'
                             WHEN e.n_bucket_eval = 0 AND e.pct > 0 AND e.n_all >= 2 AND e.rk = 1
                               THEN 'eval'
                             ELSE 'train' END), true)
           AND count(e.example_hash) FILTER (WHERE e.split = 'train') = s.n_train
           AND count(e.example_hash) FILTER (WHERE e.split = 'eval') = s.n_eval,
         count(e.example_hash)
    FROM train.dataset_snapshot s
    LEFT JOIN e ON true
   WHERE s.id = p_snapshot_id
   GROUP BY s.id, s.set_hash, s.params, s.n_train, s.n_eval
$$;

REVOKE ALL ON FUNCTION train.create_snapshot_v1(int, text, text, timestamptz, timestamptz,
  double precision, int, int, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION train.create_snapshot_v1(int, text, text, timestamptz, timestamptz,
  double precision, int, int, text) TO cft_app;
GRANT EXECUTE ON FUNCTION train.prompt_hash_v1(jsonb), train.example_hash_v1(jsonb),
  train.split_bucket_v1(bytea), train.verify_snapshot_v1(uuid)
  TO cft_app, cft_release, cft_dashboard;
