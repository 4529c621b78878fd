-- Forget one user of the current tenant (cft.tenant_id, the setting row-level security uses):
--   * delete their obs.inference_log rows in every partition and their obs.request_key rows;
--   * taint every snapshot with an example built from those rows, and delete those examples
--     (their text is the user's: no export, trainer or evaluator reads it again), and taint
--     every adapter trained on such a snapshot (by serve.adapter.dataset_snapshot_id or its
--     training run); served adapters are marked, never retired or deleted here: the loop's
--     forget trigger replaces a tainted prod, or a release manager decides;
--   * refresh the candidate views so no copy of the rows outlives the request;
--   * record the pseudonym and the counts in auth.forget_request.
-- SECURITY DEFINER (the API role may not delete keys or taint sealed snapshots itself), with a
-- fixed search_path; the tenant comes only from the transaction's own setting.
CREATE OR REPLACE FUNCTION auth.forget_user(p_user_hash bytea)
RETURNS auth.forget_request
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_tenant    int := auth.current_tenant_id();
  v_ids       bigint[];
  v_rids      uuid[];
  v_keys      int;
  v_snapshots uuid[];
  v_adapters  int;
  v_reason    text;
  v_row       auth.forget_request;
BEGIN
  IF v_tenant IS NULL THEN
    RAISE EXCEPTION 'forget_user needs cft.tenant_id set for the transaction'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  IF p_user_hash IS NULL OR length(p_user_hash) <> 32 THEN
    RAISE EXCEPTION 'p_user_hash must be a 32-byte HMAC-SHA256 pseudonym'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;

  WITH d AS (
    DELETE FROM obs.inference_log
     WHERE tenant_id = v_tenant AND user_hash = p_user_hash
    RETURNING id, request_id
  )
  SELECT coalesce(array_agg(id), '{}'), coalesce(array_agg(request_id), '{}')
    INTO v_ids, v_rids FROM d;

  DELETE FROM obs.request_key WHERE tenant_id = v_tenant AND request_id = ANY (v_rids);
  GET DIAGNOSTICS v_keys = ROW_COUNT;

  INSERT INTO auth.forget_request
    (tenant_id, user_hash, logs_deleted, request_keys_deleted, snapshots_tainted, adapters_tainted)
  VALUES (v_tenant, p_user_hash, cardinality(v_ids), v_keys, 0, 0)
  RETURNING * INTO v_row;
  v_reason := format('built from rows of a forgotten user (forget request %s)', v_row.id);

  SELECT coalesce(array_agg(s.id), '{}') INTO v_snapshots
    FROM train.dataset_snapshot s
   WHERE s.tenant_id = v_tenant
     AND EXISTS (SELECT 1 FROM train.dataset_example e
                  WHERE e.snapshot_id = s.id AND e.log_ids && v_ids);

  -- Only the taint marks change (the immutability trigger admits exactly that); the first
  -- taint is kept.
  UPDATE train.dataset_snapshot
     SET tainted_at = coalesce(tainted_at, now()), tainted_reason = coalesce(tainted_reason, v_reason)
   WHERE id = ANY (v_snapshots);
  -- The sealed examples built from the user's rows go too (train.dataset_example_immutable
  -- admits exactly this delete, for this transaction).
  PERFORM pg_catalog.set_config('cft.forgetting', v_row.id::text, true);
  DELETE FROM train.dataset_example e
   WHERE e.snapshot_id = ANY (v_snapshots) AND e.log_ids && v_ids;
  PERFORM pg_catalog.set_config('cft.forgetting', '', true);

  UPDATE serve.adapter a
     SET tainted_at = coalesce(a.tainted_at, now()),
         tainted_reason = coalesce(a.tainted_reason, v_reason),
         updated_at = now()
   WHERE a.tenant_id = v_tenant
     AND (a.dataset_snapshot_id = ANY (v_snapshots)
          OR a.training_run_id IN (SELECT r.id FROM train.training_run r
                                    WHERE r.tenant_id = v_tenant AND r.snapshot_id = ANY (v_snapshots)));
  GET DIAGNOSTICS v_adapters = ROW_COUNT;

  IF cardinality(v_ids) > 0 THEN
    PERFORM train.refresh_dataset_candidates();
  END IF;

  UPDATE auth.forget_request
     SET snapshots_tainted = cardinality(v_snapshots), adapters_tainted = v_adapters
   WHERE id = v_row.id
  RETURNING * INTO v_row;
  RETURN v_row;
END
$$;

REVOKE ALL ON FUNCTION auth.forget_user(bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION auth.forget_user(bytea) TO cft_app;
