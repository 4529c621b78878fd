-- Link regenerations among rows just logged (p_request_ids), whatever order they came in:
--  * a parent's feedback said regenerated_by = X before X was logged: X gets parent_id;
--  * X was logged naming parent_request_id = P: X gets parent_id once P exists, and P is
--    marked fb_regen with regenerated_by = X (if it named no other regeneration).
-- Both lookups go through the small partial indexes of obs/inference_log.sql
-- and obs.request_key, so a batch with nothing to link costs two index probes.
-- SECURITY INVOKER: run as cft_app, row-level security keeps it inside the caller's tenant.
CREATE OR REPLACE FUNCTION obs.link_regenerations(p_tenant_id int, p_request_ids uuid[])
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
  n int := 0;
  r record;
  k record;
BEGIN
  -- Children named by a parent's feedback before they were logged.
  FOR r IN SELECT p.id, p.request_id, p.regenerated_by
             FROM obs.inference_log p
            WHERE p.tenant_id = p_tenant_id AND p.regenerated_by IS NOT NULL
              AND p.regenerated_by = ANY (p_request_ids)
  LOOP
    SELECT log_id, created_at INTO k FROM obs.request_key
     WHERE tenant_id = p_tenant_id AND request_id = r.regenerated_by;
    IF FOUND THEN
      UPDATE obs.inference_log SET parent_id = r.id, parent_request_id = r.request_id
       WHERE id = k.log_id AND created_at = k.created_at AND parent_id IS NULL;
      n := n + 1;
    END IF;
  END LOOP;

  -- Children that named a parent which exists now (the child or the parent is new).
  FOR r IN SELECT c.id, c.created_at, c.request_id, c.parent_request_id
             FROM obs.inference_log c
            WHERE c.tenant_id = p_tenant_id
              AND c.parent_request_id IS NOT NULL AND c.parent_id IS NULL
  LOOP
    CONTINUE WHEN NOT (r.parent_request_id = ANY (p_request_ids)
                       OR r.request_id = ANY (p_request_ids));
    SELECT log_id, created_at INTO k FROM obs.request_key
     WHERE tenant_id = p_tenant_id AND request_id = r.parent_request_id;
    CONTINUE WHEN NOT FOUND;
    UPDATE obs.inference_log SET parent_id = k.log_id
     WHERE id = r.id AND created_at = r.created_at;
    UPDATE obs.inference_log
       SET fb_regen = true, regenerated_by = coalesce(regenerated_by, r.request_id),
           feedback_at = coalesce(feedback_at, now())
     WHERE id = k.log_id AND created_at = k.created_at;
    n := n + 1;
  END LOOP;
  RETURN n;
END
$$;
