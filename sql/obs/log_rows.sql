-- Log a batch of validated rows for one tenant, in one statement: every way into the log (POST
-- /v1/logs, the router's log writer, OTLP traces) ends here.
--
-- p_rows is one JSON array of the rows app/logs/validation.py makes (objects keyed by the
-- columns read below), sent as a query parameter: no value is ever part of the SQL text. The
-- function runs as cft_app with cft.tenant_id = p_tenant_id, so row-level security checks every
-- row whoever calls (the SET clause puts the caller's role back on return, and the tenant
-- setting is put back below); a caller scoped to another tenant is refused.
--
-- Idempotent by request_id: the ids already logged are read with one `= ANY` probe of
-- obs.request_key's primary key (both ARRAYs are init plans, computed once; an anti-join of the
-- rows against obs.request_key was planned as a hash join over all of the tenant's keys), and
-- only the other rows are inserted, in the batch's order (ord). A concurrent request that logs
-- one of the same ids meanwhile makes obs.request_key's trigger raise unique_violation: the
-- caller retries, and the probe then sees that row. Returns the request_ids inserted now, whose
-- regenerations are linked (obs.link_regenerations).
CREATE OR REPLACE FUNCTION obs.log_rows(p_tenant_id int, p_rows json)
RETURNS SETOF text LANGUAGE plpgsql SET role = cft_app AS $$
DECLARE
  v_scope text := nullif(current_setting('cft.tenant_id', true), '');
  v_ids uuid[];
BEGIN
  IF v_scope IS NOT NULL AND v_scope <> p_tenant_id::text THEN
    RAISE EXCEPTION 'cannot log rows for tenant % in a transaction scoped to tenant %',
      p_tenant_id, v_scope USING ERRCODE = 'insufficient_privilege';
  END IF;
  PERFORM set_config('cft.tenant_id', p_tenant_id::text, true);
  WITH staged AS MATERIALIZED (
    SELECT * FROM json_to_recordset(p_rows) AS r(
      ord int, request_id uuid, user_hash bytea, route text, adapter_id text, model text,
      experiment text, variant text, messages jsonb, completion text, ttft_ms int,
      tokens_in int, tokens_out int, embedding halfvec, parent_request_id uuid,
      pii_flags smallint, status text, created_at timestamptz)
  ), inserted AS (
    INSERT INTO obs.inference_log (request_id, tenant_id, user_hash, route, adapter_id, model,
      experiment, variant, messages, completion, ttft_ms, tokens_in, tokens_out, embedding,
      parent_request_id, pii_flags, status, created_at)
    SELECT s.request_id, p_tenant_id, s.user_hash, s.route, s.adapter_id, s.model,
           s.experiment, s.variant, s.messages, s.completion, s.ttft_ms, s.tokens_in,
           s.tokens_out, s.embedding, s.parent_request_id, s.pii_flags, s.status,
           coalesce(s.created_at, now())
      FROM staged s
     WHERE s.request_id <> ALL (ARRAY(
       SELECT k.request_id FROM obs.request_key k
        WHERE k.tenant_id = p_tenant_id
          AND k.request_id = ANY (ARRAY(SELECT request_id FROM staged))))
     ORDER BY s.ord
    RETURNING request_id
  )
  SELECT coalesce(array_agg(request_id), '{}') INTO v_ids FROM inserted;
  IF cardinality(v_ids) > 0 THEN
    PERFORM obs.link_regenerations(p_tenant_id, v_ids);
  END IF;
  PERFORM set_config('cft.tenant_id', coalesce(v_scope, ''), true);
  RETURN QUERY SELECT unnest(v_ids)::text;
END
$$;
-- The API's requests call it as cft_app, the router's log writer as the owner; no other role.
REVOKE ALL ON FUNCTION obs.log_rows(int, json) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION obs.log_rows(int, json) TO cft_app;
COMMENT ON FUNCTION obs.log_rows(int, json) IS
  'Log validated rows (one JSON array) for a tenant under row-level security, idempotent by '
  'request_id; the request_ids inserted now.';
