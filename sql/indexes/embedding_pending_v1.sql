-- The embedder's queue: rows still waiting for a prompt embedding. Partial, so it holds only
-- the backlog and the embedder never scans the whole log to find work.
CREATE INDEX IF NOT EXISTS inference_log_embedding_pending_idx
  ON obs.inference_log (created_at) WHERE embedding IS NULL;
