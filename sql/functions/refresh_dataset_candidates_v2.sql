-- The candidate views refreshed (as train.refresh_dataset_candidates_v1), then the markers of
-- obs.deleted_log that this refresh accounted for are dropped: those whose transaction had
-- committed when the refresh began (the views no longer hold those rows). A marker of a change
-- committed meanwhile stays until the next refresh.
CREATE OR REPLACE FUNCTION train.refresh_dataset_candidates_v2() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  -- Taken before the refreshes, whose own snapshots see at least what this one sees.
  v_seen pg_snapshot := pg_current_snapshot();
BEGIN
  PERFORM train.refresh_dataset_candidates_v1();
  DELETE FROM obs.deleted_log d
   WHERE pg_visible_in_snapshot(d.xid, v_seen) OR d.xid = pg_current_xact_id_if_assigned();
END
$$;

REVOKE ALL ON FUNCTION train.refresh_dataset_candidates_v2() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION train.refresh_dataset_candidates_v2() TO cft_app;
