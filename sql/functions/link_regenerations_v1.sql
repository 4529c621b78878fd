-- Link regenerations among rows just logged (p_request_ids), whatever order they came in:
--  * a parent's feedback said regenerated_by = X before X was logged: X gets parent_id;
--  * X was logged naming parent_request_id = P: X gets parent_id once P exists, and P is
--    marked fb_regen with regenerated_by = X (if it named no other regeneration).
-- SECURITY INVOKER: run as cft_app, row-level security keeps it inside the caller's tenant.
CREATE OR REPLACE FUNCTION obs.link_regenerations_v1(p_tenant_id int, p_request_ids uuid[])
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
  n int := 0;
  k int;
BEGIN
  -- Children named by a parent's feedback before they were logged.
  UPDATE obs.inference_log c
     SET parent_id = p.id, parent_request_id = p.request_id
    FROM obs.inference_log p, obs.request_key ck
   WHERE p.tenant_id = p_tenant_id AND p.regenerated_by = ANY (p_request_ids)
     AND ck.tenant_id = p_tenant_id AND ck.request_id = p.regenerated_by
     AND c.id = ck.log_id AND c.created_at = ck.created_at AND c.tenant_id = p_tenant_id
     AND c.parent_id IS NULL;
  GET DIAGNOSTICS k = ROW_COUNT;
  n := n + k;

  -- Children that named a parent which exists now (the child or the parent is new).
  WITH link AS (
    SELECT c.id AS child_id, c.created_at AS child_created_at, c.request_id AS child_request_id,
           pk.log_id AS parent_id, pk.created_at AS parent_created_at
      FROM obs.inference_log c
      JOIN obs.request_key pk
        ON pk.tenant_id = p_tenant_id AND pk.request_id = c.parent_request_id
     WHERE c.tenant_id = p_tenant_id AND c.parent_request_id IS NOT NULL AND c.parent_id IS NULL
       AND (c.parent_request_id = ANY (p_request_ids) OR c.request_id = ANY (p_request_ids))
  ), child AS (
    UPDATE obs.inference_log c SET parent_id = l.parent_id
      FROM link l
     WHERE c.id = l.child_id AND c.created_at = l.child_created_at
  )
  UPDATE obs.inference_log p
     SET fb_regen = true,
         regenerated_by = coalesce(p.regenerated_by, l.child_request_id),
         feedback_at = coalesce(p.feedback_at, now())
    FROM link l
   WHERE p.id = l.parent_id AND p.created_at = l.parent_created_at;
  GET DIAGNOSTICS k = ROW_COUNT;
  RETURN n + k;
END
$$;
