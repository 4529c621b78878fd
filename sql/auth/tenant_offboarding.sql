-- Offboarding a tenant: every row it left in the database goes, its adapters' artefacts are
-- listed for deletion from the store, and one audit row stays (app/tenants/offboard.py drives
-- it; REST DELETE /v1/tenants/{name}, CLI `cft tenant delete`).
--
-- Three steps, each idempotent, so a crash anywhere is finished by calling again:
--   1. auth.offboard_tenant_prepare: the tenant stops acting and serving (keys revoked, loop
--      policies disabled, queued or running training runs cancelled, canary and prod adapters
--      retired, which tells the reconciler by NOTIFY to unload them); committed on its own.
--   2. auth.offboard_tenant, once no engine has one of its adapters loaded
--      (auth.offboard_tenant_loaded): deletes the rows, records the counts and the artefact
--      URIs still to delete, and the tenant itself.
--   3. The caller deletes each artefact from the store and ticks it off with
--      auth.offboard_artefact_deleted; the row is done when none is pending.

COMMENT ON TABLE auth.tenant_offboarding IS
  'One row per tenant offboarding: who, when, rows removed per table, artefacts deleted and pending.';
COMMENT ON COLUMN auth.tenant_offboarding.id IS 'The offboarding''s number.';
COMMENT ON COLUMN auth.tenant_offboarding.tenant_id IS
  'The tenant''s id (no foreign key: the row outlives the tenant).';
COMMENT ON COLUMN auth.tenant_offboarding.tenant_name IS
  'The tenant''s name when it was offboarded.';
COMMENT ON COLUMN auth.tenant_offboarding.requested_by IS
  'Who asked: operator key <prefix> (REST), cli <user>, or the SQL session user.';
COMMENT ON COLUMN auth.tenant_offboarding.status IS
  'unloading (step 1 done, rows not deleted yet), artefacts (rows '
  'deleted, artefacts pending) or done.';
COMMENT ON COLUMN auth.tenant_offboarding.retired_adapters IS
  'The canary and prod adapters step 1 retired.';
COMMENT ON COLUMN auth.tenant_offboarding.forced IS
  'Step 2 was forced: it ran whether or not an engine still had an adapter of the tenant loaded.';
COMMENT ON COLUMN auth.tenant_offboarding.counts IS 'Rows deleted per table (schema.table: count).';
COMMENT ON COLUMN auth.tenant_offboarding.artefacts_pending IS
  'Artefact URIs (weights_uri) still to delete from the store.';
COMMENT ON COLUMN auth.tenant_offboarding.artefacts_deleted IS
  'Artefact URIs deleted and ticked off (auth.offboard_artefact_deleted).';
COMMENT ON COLUMN auth.tenant_offboarding.started_at IS 'When step 1 first ran.';
COMMENT ON COLUMN auth.tenant_offboarding.data_deleted_at IS
  'When step 2 deleted the tenant''s rows and the tenant.';
COMMENT ON COLUMN auth.tenant_offboarding.finished_at IS
  'When no artefact was left pending (status done).';
ALTER TABLE auth.tenant_offboarding ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON auth.tenant_offboarding FROM PUBLIC;

-- Step 1. Returns the open offboarding row of the tenant (made on the first call).
CREATE OR REPLACE FUNCTION auth.offboard_tenant_prepare(p_tenant int, p_by text)
RETURNS auth.tenant_offboarding
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_name    text;
  v_retired text[];
  v_row     auth.tenant_offboarding;
BEGIN
  SELECT name INTO v_name FROM tenant WHERE id = p_tenant FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no tenant with id %', p_tenant USING ERRCODE = 'no_data_found';
  END IF;
  UPDATE auth.api_key SET revoked_at = now() WHERE tenant_id = p_tenant AND revoked_at IS NULL;
  UPDATE loop.policy SET enabled = false WHERE tenant_id = p_tenant AND enabled;
  UPDATE train.training_run SET cancel_requested = true
   WHERE tenant_id = p_tenant AND status IN ('queued', 'running') AND NOT cancel_requested;
  -- previous_prod_id cleared in the same statement: a prod leaving prod would otherwise
  -- restore the prod it replaced (serve.adapter_gate_after).
  PERFORM set_config('cft.reason', 'tenant offboarding', true);
  WITH r AS (
    UPDATE serve.adapter SET status = 'retired', traffic_pct = 0, previous_prod_id = NULL
     WHERE tenant_id = p_tenant AND status IN ('canary', 'prod')
    RETURNING id
  )
  SELECT coalesce(array_agg(id ORDER BY id), '{}') INTO v_retired FROM r;
  PERFORM set_config('cft.reason', '', true);

  UPDATE auth.tenant_offboarding
     SET retired_adapters = retired_adapters || v_retired
   WHERE tenant_id = p_tenant AND status = 'unloading'
  RETURNING * INTO v_row;
  IF NOT FOUND THEN
    INSERT INTO auth.tenant_offboarding (tenant_id, tenant_name, requested_by, retired_adapters)
    VALUES (p_tenant, v_name, coalesce(nullif(p_by, ''), session_user), v_retired)
    RETURNING * INTO v_row;
  END IF;
  RETURN v_row;
END
$$;

-- What still serves one of the tenant's adapters, as the reconciler last recorded it.
CREATE OR REPLACE FUNCTION auth.offboard_tenant_loaded(p_tenant int)
RETURNS TABLE (adapter_id text, engine_url text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
  SELECT d.adapter_id, d.engine_url
    FROM serve.adapter_deployment d JOIN serve.adapter a ON a.id = d.adapter_id
   WHERE a.tenant_id = p_tenant AND d.state = 'loaded'
   ORDER BY 1, 2
$$;

-- Step 2. Refuses while an adapter of the tenant serves or is loaded on an engine (unless
-- p_force: the operator knows those engines are gone). Sealed snapshots refuse deletes
-- (train.dataset_snapshot_immutable) and results refuse every delete (train.eval_result_immutable);
-- cft.offboarding_tenant, set here for this transaction only, is the one way through, and only
-- roles that may DELETE snapshots and results (the owner) can use it.
CREATE OR REPLACE FUNCTION auth.offboard_tenant(p_tenant int, p_by text, p_force boolean DEFAULT false)
RETURNS auth.tenant_offboarding
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_row      auth.tenant_offboarding;
  v_counts   jsonb := '{}';
  v_n        bigint;
  v_adapters text[];
  v_uris     text[];
  v_loaded   text;
BEGIN
  SELECT * INTO v_row FROM auth.tenant_offboarding
   WHERE tenant_id = p_tenant AND status = 'unloading' FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tenant % has no offboarding in progress: call auth.offboard_tenant_prepare first',
      p_tenant USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  PERFORM 1 FROM tenant WHERE id = p_tenant FOR UPDATE;

  IF EXISTS (SELECT 1 FROM serve.adapter WHERE tenant_id = p_tenant AND status IN ('canary', 'prod')) THEN
    RAISE EXCEPTION 'tenant % still has a canary or prod adapter (promoted since it was prepared?)',
      v_row.tenant_name USING ERRCODE = 'object_not_in_prerequisite_state',
      HINT = 'call auth.offboard_tenant_prepare again';
  END IF;
  SELECT string_agg(l.adapter_id || ' on ' || l.engine_url, ', ') INTO v_loaded
    FROM auth.offboard_tenant_loaded(p_tenant) l;
  IF v_loaded IS NOT NULL AND NOT p_force THEN
    RAISE EXCEPTION 'adapters of tenant % are still loaded: %', v_row.tenant_name, v_loaded
      USING ERRCODE = 'object_not_in_prerequisite_state',
      HINT = 'the reconciler unloads retired adapters on its next pass; force if the engines are gone';
  END IF;

  SELECT coalesce(array_agg(id), '{}') INTO v_adapters FROM serve.adapter WHERE tenant_id = p_tenant;
  -- An artefact another tenant's adapter refers to is never deleted (routes are per tenant, so
  -- this does not happen unless someone registered such a row by hand).
  SELECT coalesce(array_agg(DISTINCT a.weights_uri), '{}') INTO v_uris
    FROM serve.adapter a
   WHERE a.tenant_id = p_tenant AND a.weights_uri IS NOT NULL
     AND NOT EXISTS (SELECT 1 FROM serve.adapter o
                      WHERE o.weights_uri = a.weights_uri AND o.tenant_id <> p_tenant);

  -- Near-duplicate edges first (obs.inference_log's delete trigger would find none left).
  DELETE FROM obs.prompt_neighbour WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('obs.prompt_neighbour', v_n);
  DELETE FROM obs.prompt_neighbour_scan WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('obs.prompt_neighbour_scan', v_n);
  -- Every partition, DEFAULT included.
  DELETE FROM obs.inference_log WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('obs.inference_log', v_n);
  DELETE FROM obs.request_key WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('obs.request_key', v_n);

  -- Results are facts (train.eval_result_immutable): offboarding is the one way out.
  PERFORM set_config('cft.offboarding_tenant', p_tenant::text, true);
  DELETE FROM train.eval_result WHERE adapter_id = ANY (v_adapters);
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('train.eval_result', v_n);
  PERFORM set_config('cft.offboarding_tenant', '', true);
  DELETE FROM train.eval_request WHERE tenant_id = p_tenant OR adapter_id = ANY (v_adapters);
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('train.eval_request', v_n);
  DELETE FROM train.judge_verdict v USING train.judge_calibration c
   WHERE v.calibration_id = c.id AND c.tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('train.judge_verdict', v_n);
  DELETE FROM train.judge_calibration WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('train.judge_calibration', v_n);
  DELETE FROM train.eval_calibration_case WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('train.eval_calibration_case', v_n);
  DELETE FROM train.eval_case WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('train.eval_case', v_n);
  DELETE FROM train.eval_suite WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('train.eval_suite', v_n);

  DELETE FROM serve.adapter_deployment WHERE adapter_id = ANY (v_adapters);
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('serve.adapter_deployment', v_n);
  DELETE FROM serve.experiment_decision WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('serve.experiment_decision', v_n);
  DELETE FROM serve.experiment_policy WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('serve.experiment_policy', v_n);
  DELETE FROM train.promotion_policy WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('train.promotion_policy', v_n);

  DELETE FROM loop.cycle_event WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('loop.cycle_event', v_n);
  DELETE FROM loop.cycle WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('loop.cycle', v_n);
  DELETE FROM loop.policy WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('loop.policy', v_n);

  -- Fine-tuning jobs (their events go with them) before their runs; then the uploaded files.
  DELETE FROM train.fine_tuning_job WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('train.fine_tuning_job', v_n);
  DELETE FROM train.training_file WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('train.training_file', v_n);
  DELETE FROM train.training_run WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('train.training_run', v_n);
  DELETE FROM serve.adapter WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('serve.adapter', v_n);
  -- After the adapters: their deletion is audited there too.
  DELETE FROM serve.adapter_event WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('serve.adapter_event', v_n);

  SELECT count(*) INTO v_n FROM train.dataset_example e
   WHERE e.snapshot_id IN (SELECT s.id FROM train.dataset_snapshot s WHERE s.tenant_id = p_tenant);
  v_counts := v_counts || jsonb_build_object('train.dataset_example', v_n);
  PERFORM set_config('cft.offboarding_tenant', p_tenant::text, true);
  -- The examples go with their snapshots (train.dataset_snapshot_cascade_examples).
  DELETE FROM train.dataset_snapshot WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('train.dataset_snapshot', v_n);
  PERFORM set_config('cft.offboarding_tenant', '', true);

  DELETE FROM serve.route WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('serve.route', v_n);
  DELETE FROM auth.forget_request WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('auth.forget_request', v_n);
  DELETE FROM auth.api_key WHERE tenant_id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('auth.api_key', v_n);
  DELETE FROM tenant WHERE id = p_tenant;
  GET DIAGNOSTICS v_n = ROW_COUNT; v_counts := v_counts || jsonb_build_object('tenant', v_n);

  -- No copy of the tenant's rows outlives the request in the candidate views.
  PERFORM train.refresh_dataset_candidates();

  UPDATE auth.tenant_offboarding
     SET status = CASE WHEN cardinality(v_uris) = 0 THEN 'done' ELSE 'artefacts' END,
         counts = v_counts, artefacts_pending = v_uris, forced = p_force,
         data_deleted_at = now(),
         finished_at = CASE WHEN cardinality(v_uris) = 0 THEN now() END
   WHERE id = v_row.id
  RETURNING * INTO v_row;
  RETURN v_row;
END
$$;

-- Step 3: one artefact is gone from the store (deleting a missing one is not an error).
CREATE OR REPLACE FUNCTION auth.offboard_artefact_deleted(p_offboarding bigint, p_uri text)
RETURNS auth.tenant_offboarding
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_row auth.tenant_offboarding;
BEGIN
  UPDATE auth.tenant_offboarding
     SET artefacts_pending = array_remove(artefacts_pending, p_uri),
         artefacts_deleted = artefacts_deleted || p_uri,
         status = CASE WHEN artefacts_pending = ARRAY[p_uri] THEN 'done' ELSE status END,
         finished_at = CASE WHEN artefacts_pending = ARRAY[p_uri] THEN now() END
   WHERE id = p_offboarding AND p_uri = ANY (artefacts_pending)
  RETURNING * INTO v_row;
  IF NOT FOUND THEN
    SELECT * INTO v_row FROM auth.tenant_offboarding WHERE id = p_offboarding;
  END IF;
  RETURN v_row;
END
$$;

REVOKE ALL ON FUNCTION auth.offboard_tenant_prepare(int, text), auth.offboard_tenant_loaded(int),
  auth.offboard_tenant(int, text, boolean), auth.offboard_artefact_deleted(bigint, text)
  FROM PUBLIC;

COMMENT ON FUNCTION auth.offboard_tenant_prepare(int, text) IS
  'Offboarding step 1: revoke the tenant''s keys, disable its loop, cancel its runs, retire its canary and prod adapters.';
COMMENT ON FUNCTION auth.offboard_tenant_loaded(int) IS
  'The tenant''s adapters an engine still has loaded (serve.adapter_deployment, state loaded).';
COMMENT ON FUNCTION auth.offboard_tenant(int, text, boolean) IS
  'Offboarding step 2: delete every row of the tenant (and the tenant); counts and pending artefacts in auth.tenant_offboarding.';
COMMENT ON FUNCTION auth.offboard_artefact_deleted(bigint, text) IS
  'Offboarding step 3: one artefact is deleted from the store; done when none is pending.';
