-- Log rows that left the candidate views' world since those views were last refreshed.
--
-- The candidate views are materialised: a row deleted from obs.inference_log (by hand, or a
-- user forgotten) or flagged as PII after the last refresh is still in them. A snapshot must
-- never take such a row. Instead of re-reading every candidate's log row (a join over the
-- whole window of wide log rows: a third of a snapshot's time), each such change leaves a
-- marker here, and a snapshot skips the candidates that have one (an anti-join with what is
-- normally an empty table). Rows of dropped partitions (retention) fire no trigger: a
-- snapshot also skips candidates older than the route's oldest log row.
--
-- A marker is kept until a refresh whose snapshot saw the change has run
-- (train.refresh_dataset_candidates deletes the markers visible to it): by then the views
-- no longer hold the row. xid is the changing transaction, so that a change committed after
-- the refresh began keeps its marker.
CREATE TABLE obs.deleted_log (
  log_id     bigint NOT NULL,
  created_at timestamptz NOT NULL,
  xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
  PRIMARY KEY (log_id, created_at)
);
