-- (tenant_id, request_id) must be unique across all partitions. A unique index on the
-- partitioned table would have to include created_at, which would not stop a retry stamped
-- with another time. This unpartitioned key table is the arbiter; a trigger keeps it in step.
CREATE TABLE obs.request_key (
  tenant_id  int  NOT NULL,
  request_id uuid NOT NULL,
  log_id     bigint NOT NULL,
  created_at timestamptz NOT NULL,
  PRIMARY KEY (tenant_id, request_id)
);
CREATE INDEX request_key_created_idx ON obs.request_key (created_at);
