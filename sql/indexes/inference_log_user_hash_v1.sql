-- Forgetting a user finds their rows by pseudonym in every partition, present and future.
CREATE INDEX inference_log_user_hash_idx
  ON obs.inference_log (tenant_id, user_hash) WHERE user_hash IS NOT NULL;
