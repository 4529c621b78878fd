COMMENT ON TABLE obs.deleted_log IS
  'Log rows deleted or PII-flagged since the candidate views were refreshed (ids only).';

COMMENT ON COLUMN obs.deleted_log.log_id IS
  'id of the obs.inference_log row deleted or newly PII-flagged.';
COMMENT ON COLUMN obs.deleted_log.created_at IS
  'created_at of that log row (the rest of its primary key), not when it was marked.';
COMMENT ON COLUMN obs.deleted_log.xid IS
  'The transaction that deleted or flagged it (the latest, if marked again): the marker '
  'goes once every candidate view has been refreshed from a snapshot that sees it.';

-- Row-level, so that it is cloned to every partition: a DELETE aimed at one partition (the
-- maintenance's cleanup of DEFAULT, an operator's) is marked too. A marker may outlive its
-- reason (a row moved out of DEFAULT into a new partition is deleted there first, a deleted
-- row may be logged again): a snapshot skips a marked candidate only if its log row is
-- really gone or PII, which it checks for the marked rows alone.
CREATE OR REPLACE FUNCTION obs.deleted_log_record() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_row obs.inference_log := CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
BEGIN
  -- UPDATE: OF pii_flags, when the row just became PII (the WHEN clause)
  INSERT INTO obs.deleted_log (log_id, created_at) VALUES (v_row.id, v_row.created_at)
  ON CONFLICT (log_id, created_at) DO UPDATE SET xid = excluded.xid;
  RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER inference_log_deleted_marked
  AFTER DELETE ON obs.inference_log
  FOR EACH ROW EXECUTE FUNCTION obs.deleted_log_record();
CREATE OR REPLACE TRIGGER inference_log_pii_marked
  AFTER UPDATE OF pii_flags ON obs.inference_log
  FOR EACH ROW WHEN (NEW.pii_flags <> 0 AND OLD.pii_flags = 0)
  EXECUTE FUNCTION obs.deleted_log_record();

-- Ids only, read by the SECURITY DEFINER snapshot functions; nobody else needs it.
REVOKE ALL ON obs.deleted_log FROM PUBLIC;
