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
-- (train.refresh_dataset_candidates_v2 deletes the markers visible to it): by then the views
-- no longer hold the row. xid is the changing transaction, so that a change committed after
-- the refresh began keeps its marker.
CREATE TABLE obs.deleted_log (
  log_id     bigint NOT NULL,
  created_at timestamptz NOT NULL,
  xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
  PRIMARY KEY (log_id, created_at)
);
COMMENT ON TABLE obs.deleted_log IS
  'Log rows deleted or PII-flagged since the candidate views were refreshed (ids only).';

CREATE OR REPLACE FUNCTION obs.deleted_log_record_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
  IF TG_LEVEL = 'ROW' THEN  -- UPDATE OF pii_flags: the row just became PII (the WHEN clause)
    INSERT INTO obs.deleted_log (log_id, created_at) VALUES (NEW.id, NEW.created_at)
    ON CONFLICT (log_id, created_at) DO UPDATE SET xid = excluded.xid;
    RETURN NULL;
  END IF;
  INSERT INTO obs.deleted_log (log_id, created_at)
  SELECT id, created_at FROM old_rows
  ON CONFLICT (log_id, created_at) DO UPDATE SET xid = excluded.xid;
  RETURN NULL;
END
$$;

CREATE TRIGGER inference_log_deleted_marked
  AFTER DELETE ON obs.inference_log REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION obs.deleted_log_record_v1();
CREATE TRIGGER inference_log_pii_marked
  AFTER UPDATE OF pii_flags ON obs.inference_log
  FOR EACH ROW WHEN (NEW.pii_flags <> 0 AND OLD.pii_flags = 0)
  EXECUTE FUNCTION obs.deleted_log_record_v1();

-- Ids only, read by the SECURITY DEFINER snapshot functions; nobody else needs it.
REVOKE ALL ON obs.deleted_log FROM PUBLIC;
