-- Regenerate links: feedback may name a regeneration before its row arrives, and a row may
-- name its parent before the parent arrives. These small partial indexes find the dangling
-- side of either link when the other side is logged, without scanning the log.
CREATE INDEX IF NOT EXISTS inference_log_regenerated_by_idx
  ON obs.inference_log (tenant_id, regenerated_by) WHERE regenerated_by IS NOT NULL;
CREATE INDEX IF NOT EXISTS inference_log_dangling_parent_idx
  ON obs.inference_log (tenant_id, parent_request_id)
  WHERE parent_request_id IS NOT NULL AND parent_id IS NULL;
