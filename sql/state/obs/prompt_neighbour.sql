CREATE TABLE obs.prompt_neighbour_scan (
  log_id         bigint NOT NULL,
  created_at     timestamptz NOT NULL,
  tenant_id      int NOT NULL,
  route          text NOT NULL,
  radius         double precision,     -- NULL: pending (a candidate); else the search radius used
  max_neighbours int,                  -- k of that search
  prompt_hash    bytea,                -- train.prompt_hash(messages), set with radius
  scanned_at     timestamptz,
  candidate      boolean NOT NULL DEFAULT false, -- obs.is_dataset_prompt: searched and indexed
  PRIMARY KEY (log_id, created_at)
);
-- The queue (partial: only candidates pending) and the snapshot's range read of a route.
CREATE INDEX prompt_neighbour_scan_pending_idx
  ON obs.prompt_neighbour_scan (created_at) WHERE radius IS NULL AND candidate;
CREATE INDEX prompt_neighbour_scan_route_idx
  ON obs.prompt_neighbour_scan (tenant_id, route, created_at);

-- The search reads this instead of obs.inference_log: the log is partitioned by week with an
-- HNSW index per partition, so a kNN over the log is one HNSW search per partition (3 at
-- 110,000 rows, ~9 for a 60-day route) merged, with heap fetches of wide log rows; here it is
-- one search over narrow rows. A table of its own, not a column of prompt_neighbour_scan:
-- marking a row searched changes radius (the queue index's predicate), so that UPDATE is never
-- HOT and would insert the row into the HNSW index again. Written only for candidates, when an
-- embedding is set or changes or the row gets its signal; the cascade removes it with its scan
-- row (forget, prune, offboarding).
-- ~0.8 KB of heap and ~1 KB of HNSW index per row at 384 dimensions (BENCHMARKS.md).
CREATE TABLE obs.prompt_embedding (
  log_id     bigint NOT NULL,
  created_at timestamptz NOT NULL,
  tenant_id  int NOT NULL,                -- the log row's, as the search filters on them
  route      text NOT NULL,
  embedding  halfvec(__EMBEDDING_DIM__) NOT NULL,
  PRIMARY KEY (log_id, created_at),
  FOREIGN KEY (log_id, created_at)
    REFERENCES obs.prompt_neighbour_scan (log_id, created_at) ON DELETE CASCADE
);
CREATE INDEX prompt_embedding_embedding_idx
  ON obs.prompt_embedding USING hnsw (embedding halfvec_cosine_ops);

CREATE TABLE obs.prompt_neighbour (
  tenant_id    int NOT NULL,
  route        text NOT NULL,
  a_id         bigint NOT NULL,          -- the older end: (a_created_at, a_id) < (b_created_at, b_id)
  a_created_at timestamptz NOT NULL,
  b_id         bigint NOT NULL,
  b_created_at timestamptz NOT NULL,
  distance     double precision NOT NULL, -- cosine distance of the two prompt embeddings
  PRIMARY KEY (a_id, b_id)
);
CREATE INDEX prompt_neighbour_b_idx ON obs.prompt_neighbour (b_id);
CREATE INDEX prompt_neighbour_route_idx
  ON obs.prompt_neighbour (tenant_id, route, b_created_at);
