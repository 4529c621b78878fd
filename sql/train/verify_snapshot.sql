-- Recompute a snapshot's set hash and split from its stored examples: anyone can verify
-- what trained an adapter. A snapshot frozen from uploaded files (params.source = 'files') has
-- the split its files gave, not the bucket rule: only its counts are checked.
CREATE OR REPLACE FUNCTION train.verify_snapshot(p_snapshot_id uuid)
RETURNS TABLE (set_hash_ok boolean, examples_ok boolean, split_ok boolean, n_examples bigint)
LANGUAGE sql STABLE AS $$
  WITH e AS (
    SELECT x.*, train.split_bucket(x.example_hash) AS bucket,
           row_number() OVER (ORDER BY train.split_bucket(x.example_hash), x.example_hash) AS rk,
           count(*) OVER () AS n_all,
           count(*) FILTER (WHERE train.split_bucket(x.example_hash)
                                  < (s.params->>'eval_pct')::int) OVER () AS n_bucket_eval,
           (s.params->>'eval_pct')::int AS pct,
           s.params->>'source' IS NOT DISTINCT FROM 'files' AS given
      FROM train.dataset_example x JOIN train.dataset_snapshot s ON s.id = x.snapshot_id
     WHERE x.snapshot_id = p_snapshot_id
  )
  SELECT s.set_hash = encode(sha256(coalesce(string_agg(e.example_hash, ''::bytea
                                                        ORDER BY e.example_hash), ''::bytea)), 'hex'),
         coalesce(bool_and(e.example_hash = train.example_hash(e.example)), true),
         coalesce(bool_and(e.split = CASE
                             WHEN e.given THEN e.split
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

GRANT EXECUTE ON FUNCTION train.verify_snapshot(uuid) TO cft_app, cft_release, cft_dashboard;
