-- When each candidate view was last refreshed by train.refresh_dataset_candidates, and the
-- snapshot of committed transactions that refresh saw (taken before it began).
--
-- A snapshot refreshes only the view its method reads (the KTO view alone took 7 s of the
-- 10 s it took to refresh all three at 1M log rows). A marker in obs.deleted_log may then go
-- only when every view has been refreshed since its change committed, which is what `seen`
-- tells, view by view. NULL: not known (never refreshed since this table was made), so no
-- marker counts as accounted for by that view yet.
CREATE TABLE train.candidate_view_refresh (
  view_name    text PRIMARY KEY,
  refreshed_at timestamptz,
  seen         pg_snapshot
);
INSERT INTO train.candidate_view_refresh (view_name)
VALUES ('train.sft_candidate'), ('train.kto_candidate'), ('train.pair_candidate');
