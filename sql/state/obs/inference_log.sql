-- Traffic: obs.inference_log, partitioned by week on created_at, with a DEFAULT partition.
CREATE TABLE obs.inference_log (
  id                bigserial,
  request_id        uuid NOT NULL,
  tenant_id         int NOT NULL,
  user_hash         bytea,                      -- HMAC-SHA256 of the product's user id
  route             text NOT NULL,              -- serving slot, e.g. 'support-es'
  adapter_id        text NOT NULL,              -- adapter (or base model) that answered
  model             text,                       -- base model
  experiment        text,
  variant           char(1),                    -- 'A' = prod, 'B'.. = canaries, NULL = none
  messages          jsonb NOT NULL,             -- OpenAI chat messages (the prompt)
  completion        text,
  ttft_ms           int,
  tokens_in         int,
  tokens_out        int,
  fb_explicit       smallint CHECK (fb_explicit BETWEEN -1 AND 1),   -- thumbs, KTO-ready
  fb_regen          boolean NOT NULL DEFAULT false,                   -- regenerated: DPO-rejected
  fb_edited         boolean NOT NULL DEFAULT false,                   -- edited: SFT golden
  edited_completion text,                                             -- the text behind fb_edited
  parent_id         bigint,                     -- the row this one regenerated
  parent_request_id uuid,                       -- same link by request id (may arrive first)
  regenerated_by    uuid,                       -- request id of the regeneration, if known
  embedding         halfvec(__EMBEDDING_DIM__), -- prompt embedding, filled by the embedder
  pii_flags         smallint NOT NULL DEFAULT 0, -- bitmask, see docs/observe.md "PII flags"
  status            text NOT NULL DEFAULT 'ok' CHECK (status IN ('ok', 'error', 'partial')),
  feedback_at       timestamptz,
  created_at        timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

CREATE TABLE obs.inference_log_default PARTITION OF obs.inference_log DEFAULT;

-- Indexes on the parent are created on every partition, present and future.
CREATE INDEX inference_log_tenant_adapter_created_idx
  ON obs.inference_log (tenant_id, adapter_id, created_at);
CREATE INDEX inference_log_embedding_idx
  ON obs.inference_log USING hnsw (embedding halfvec_cosine_ops);
CREATE INDEX inference_log_parent_idx ON obs.inference_log (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX inference_log_route_created_idx ON obs.inference_log (tenant_id, route, created_at);
CREATE INDEX inference_log_experiment_idx
  ON obs.inference_log (experiment, created_at) WHERE experiment IS NOT NULL;

-- Regenerate links: feedback may name a regeneration before its row arrives, and a row may
-- name its parent before the parent arrives. These small partial indexes find the dangling
-- side of either link when the other side is logged, without scanning the log.
CREATE INDEX IF NOT EXISTS inference_log_regenerated_by_idx
  ON obs.inference_log (tenant_id, regenerated_by) WHERE regenerated_by IS NOT NULL;
CREATE INDEX IF NOT EXISTS inference_log_dangling_parent_idx
  ON obs.inference_log (tenant_id, parent_request_id)
  WHERE parent_request_id IS NOT NULL AND parent_id IS NULL;

-- The embedder's queue: rows still waiting for a prompt embedding. Partial, so it holds only
-- the backlog and the embedder never scans the whole log to find work.
CREATE INDEX IF NOT EXISTS inference_log_embedding_pending_idx
  ON obs.inference_log (created_at) WHERE embedding IS NULL;

-- Forgetting a user finds their rows by pseudonym in every partition, present and future.
CREATE INDEX inference_log_user_hash_idx
  ON obs.inference_log (tenant_id, user_hash) WHERE user_hash IS NOT NULL;
