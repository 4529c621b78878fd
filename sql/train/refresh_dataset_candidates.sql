COMMENT ON TABLE train.candidate_view_refresh IS
  'Each candidate view''s last refresh (train.refresh_dataset_candidates) and the snapshot it saw.';

COMMENT ON COLUMN train.candidate_view_refresh.view_name IS
  'The candidate view: train.sft_candidate, train.kto_candidate or train.pair_candidate.';
COMMENT ON COLUMN train.candidate_view_refresh.refreshed_at IS
  'When train.refresh_dataset_candidates last refreshed it (once that '
  'call''s refreshes were done); NULL: never since this table was made.';
COMMENT ON COLUMN train.candidate_view_refresh.seen IS
  'The snapshot of committed transactions taken before that refresh began: obs.deleted_log '
  'markers visible in it are accounted for by this view. NULL: never refreshed, so none are.';

-- Written by the SECURITY DEFINER refresh only; dashboards may read when each view was refreshed.
REVOKE ALL ON train.candidate_view_refresh FROM PUBLIC;
GRANT SELECT ON train.candidate_view_refresh TO cft_dashboard;

-- Refresh the candidate views that the given methods read (all three when p_methods is NULL),
-- CONCURRENTLY, in a fixed order (sft, kto, pair: two refreshes never wait on each other
-- crosswise); record each refreshed view's refresh in train.candidate_view_refresh; then drop
-- the markers of obs.deleted_log that every view has accounted for: the views refreshed now
-- by their shared snapshot (taken before the first refresh) or because this very transaction
-- made the change before refreshing (as train.refresh_dataset_candidates), the others by
-- the snapshot their last refresh saw. A marker of a change committed meanwhile, or not yet
-- seen by some view, stays. Returns the views refreshed.
CREATE OR REPLACE FUNCTION train.refresh_dataset_candidates(p_methods text[] DEFAULT NULL)
RETURNS text[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  -- Taken before the refreshes, whose own snapshots see at least what this one sees.
  v_seen  pg_snapshot := pg_current_snapshot();
  v_all   text[] := ARRAY['train.sft_candidate', 'train.kto_candidate',
                          'train.pair_candidate'];
  v_want  text[];
  v_views text[] := '{}';
  v_view  text;
  v_bad   text;
BEGIN
  IF p_methods IS NULL THEN
    v_want := v_all;
  ELSE
    SELECT m INTO v_bad FROM unnest(p_methods) m
     WHERE m IS NULL OR m NOT IN ('sft', 'kto', 'dpo', 'orpo', 'simpo') LIMIT 1;
    IF FOUND THEN
      RAISE EXCEPTION 'unknown method %: choose sft, kto, dpo, orpo or simpo',
        coalesce(v_bad, 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT coalesce(array_agg(CASE m WHEN 'sft' THEN 'train.sft_candidate'
                                     WHEN 'kto' THEN 'train.kto_candidate'
                                     ELSE 'train.pair_candidate' END), '{}')
      INTO v_want FROM unnest(p_methods) m;  -- no methods: no view
  END IF;
  FOREACH v_view IN ARRAY v_all LOOP
    CONTINUE WHEN NOT v_view = ANY (v_want);
    EXECUTE format('REFRESH MATERIALIZED VIEW CONCURRENTLY %s', v_view);
    v_views := v_views || v_view;
  END LOOP;

  UPDATE train.candidate_view_refresh
     SET refreshed_at = clock_timestamp(), seen = v_seen
   WHERE view_name = ANY (v_views);

  DELETE FROM obs.deleted_log d
   WHERE NOT EXISTS (
     SELECT 1 FROM train.candidate_view_refresh r
      WHERE NOT coalesce(CASE WHEN r.view_name = ANY (v_views)
                              THEN pg_visible_in_snapshot(d.xid, v_seen)
                                   OR d.xid = pg_current_xact_id_if_assigned()
                              ELSE pg_visible_in_snapshot(d.xid, r.seen) END, false));
  RETURN v_views;
END
$$;

REVOKE ALL ON FUNCTION train.refresh_dataset_candidates(text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION train.refresh_dataset_candidates(text[]) TO cft_app;
