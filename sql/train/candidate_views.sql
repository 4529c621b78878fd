-- Training candidates over real traffic, one materialised view per signal.
--
-- A materialised view cannot take parameters, so these hold the candidates of every consenting
-- tenant over a generous maximum window (180 days at refresh time). A snapshot
-- (train.create_snapshot) then filters one tenant, one route and its own window, and skips the
-- rows deleted or flagged since the last refresh (obs.deleted_log), so a stale view never lets
-- a forgotten user or a newly flagged row into a dataset. Every row carries the ids (and
-- created_at, the second half of the partitioned primary key) of the log rows it came from.
--
-- Each row holds its candidate's example: `example` (the TRL-format jsonb a snapshot freezes,
-- train/example_hashes.sql) and `example_hash`. Keeping the example costs the rows ~37 % more
-- width (jsonb's own headers) and a REFRESH ... CONCURRENTLY 6.5 % more time at 1M log rows;
-- a snapshot then copies each survivor's example instead of building it again (the write of a
-- 384k-example KTO snapshot: 2.0-2.2 s -> 1.15 s). In an example, the prompt is
-- example->'prompt' (kto, pairs) or the messages without the last one,
-- (example->'messages') - (-1) (sft); the completion is example->'completion'->0->>'content',
-- chosen and rejected likewise; label stays a column.
-- Each example is built once, in the inner query (OFFSET 0 keeps the planner from pulling it
-- up, which would copy the build into the hash expression: two builds per row).
-- dup_check_off is always NULL. REFRESH ... CONCURRENTLY first looks for whole-row duplicates
-- in the new contents (every row sorted twice and compared as a record: 4.4 s of the KTO
-- view's 7.7 s at 1M log rows), and it leaves out of that search rows with a NULL column. The
-- search adds nothing here: each row's key is a log row's primary key (or a pair of them), so
-- the new contents cannot hold two identical rows, and two rows with one key would fail on
-- the view's unique index. The diff that follows compares rows by their binary image, where
-- NULL equals NULL. With the column the KTO view refreshes in 3.4-3.6 s instead.
-- Refreshed CONCURRENTLY by train.refresh_dataset_candidates() (one view or all); each has a
-- unique index.

-- SFT from every answer users wanted: an edit (the user's corrected text is the golden
-- completion: source 'edit') or an answer rated up as it was (source 'thumbs_up').
DROP MATERIALIZED VIEW IF EXISTS train.sft_candidate;
CREATE MATERIALIZED VIEW train.sft_candidate AS
SELECT c.*, sha256(convert_to(c.example::text, 'UTF8')) AS example_hash,
       NULL::boolean AS dup_check_off
  FROM (
  SELECT l.id                        AS prompt_log_id,
         l.created_at                AS prompt_created_at,
         ARRAY[l.id]                 AS log_ids,
         l.tenant_id,
         l.route,
         coalesce(l.fb_explicit, 0)  AS rating,
         l.created_at,
         CASE WHEN l.fb_edited THEN 'edit' ELSE 'thumbs_up' END AS source,
         train.sft_example(l.messages, CASE WHEN l.fb_edited THEN l.edited_completion
                                            ELSE l.completion END) AS example
    FROM obs.inference_log l
    JOIN tenant t ON t.id = l.tenant_id AND t.consent_training
   WHERE ((l.fb_edited AND l.edited_completion IS NOT NULL AND btrim(l.edited_completion) <> '')
          OR (NOT l.fb_edited AND NOT l.fb_regen AND l.fb_explicit > 0
              AND l.completion IS NOT NULL AND btrim(l.completion) <> '' AND l.status = 'ok'))
     AND l.pii_flags = 0
     AND l.created_at > now() - interval '180 days'
  OFFSET 0) c;
CREATE UNIQUE INDEX sft_candidate_key ON train.sft_candidate (prompt_log_id, prompt_created_at);
CREATE INDEX sft_candidate_route_idx ON train.sft_candidate (tenant_id, route, created_at);

-- KTO from thumbs: only explicit non-zero feedback (NULL and 0 carry no label).
DROP MATERIALIZED VIEW IF EXISTS train.kto_candidate;
CREATE MATERIALIZED VIEW train.kto_candidate AS
SELECT c.*, sha256(convert_to(c.example::text, 'UTF8')) AS example_hash,
       NULL::boolean AS dup_check_off
  FROM (
  SELECT l.id                 AS prompt_log_id,
         l.created_at         AS prompt_created_at,
         ARRAY[l.id]          AS log_ids,
         l.tenant_id,
         l.route,
         l.fb_explicit > 0    AS label,
         l.fb_explicit::int   AS rating,
         l.created_at,
         train.kto_example(l.messages, l.completion, l.fb_explicit > 0) AS example
    FROM obs.inference_log l
    JOIN tenant t ON t.id = l.tenant_id AND t.consent_training
   WHERE l.fb_explicit IS NOT NULL AND l.fb_explicit <> 0
     AND l.completion IS NOT NULL
     AND l.status = 'ok'
     AND l.pii_flags = 0
     AND l.created_at > now() - interval '180 days'
  OFFSET 0) c;
CREATE UNIQUE INDEX kto_candidate_key ON train.kto_candidate (prompt_log_id, prompt_created_at);
CREATE INDEX kto_candidate_route_idx ON train.kto_candidate (tenant_id, route, created_at);

-- Preference pairs (DPO, ORPO and SimPO train on the same view), from two signals:
--  * 'regen': the user regenerated a row (rejected); its child that was neither regenerated nor
--    rated negatively is chosen (an unrated child counts: `cho.fb_explicit >= 0` would silently
--    drop NULLs, i.e. most children). Against DPO's length bias the chosen length
--    must lie within 0.5-2.5x the rejected one (tokens_out; characters when a count is missing).
--  * 'edit': the user's edited text is chosen over the original completion.
DROP MATERIALIZED VIEW IF EXISTS train.pair_candidate;
CREATE MATERIALIZED VIEW train.pair_candidate AS
SELECT c.*, sha256(convert_to(c.example::text, 'UTF8')) AS example_hash,
       NULL::boolean AS dup_check_off
  FROM (
  SELECT 'regen'::text                  AS source,
         rej.id                         AS prompt_log_id,
         rej.created_at                 AS prompt_created_at,
         cho.id                         AS chosen_log_id,
         cho.created_at                 AS chosen_created_at,
         ARRAY[rej.id, cho.id]          AS log_ids,
         rej.tenant_id,
         rej.route,
         coalesce(cho.fb_explicit, 0)   AS rating,
         cho.created_at,
         train.pair_example(rej.messages, cho.completion, rej.completion) AS example
    FROM obs.inference_log rej
    JOIN obs.inference_log cho
      ON cho.parent_id = rej.id AND cho.tenant_id = rej.tenant_id AND cho.route = rej.route
    JOIN tenant t ON t.id = rej.tenant_id AND t.consent_training
   WHERE rej.fb_regen
     AND coalesce(rej.fb_explicit, 0) <= 0
     AND NOT cho.fb_regen
     AND coalesce(cho.fb_explicit, 0) >= 0
     AND rej.completion IS NOT NULL AND cho.completion IS NOT NULL
     AND cho.completion <> rej.completion
     AND rej.status = 'ok' AND cho.status = 'ok'
     AND rej.pii_flags = 0 AND cho.pii_flags = 0
     AND rej.created_at > now() - interval '180 days'
     AND cho.created_at > now() - interval '180 days'
     AND CASE WHEN rej.tokens_out > 0 AND cho.tokens_out IS NOT NULL
              THEN cho.tokens_out BETWEEN rej.tokens_out * 0.5 AND rej.tokens_out * 2.5
              ELSE char_length(cho.completion)
                   BETWEEN char_length(rej.completion) * 0.5 AND char_length(rej.completion) * 2.5
         END
  UNION ALL
  SELECT 'edit'::text,
         l.id, l.created_at, l.id, l.created_at,
         ARRAY[l.id],
         l.tenant_id,
         l.route,
         coalesce(l.fb_explicit, 0),
         l.created_at,
         train.pair_example(l.messages, l.edited_completion, l.completion)
    FROM obs.inference_log l
    JOIN tenant t ON t.id = l.tenant_id AND t.consent_training
   WHERE l.fb_edited
     AND l.edited_completion IS NOT NULL AND btrim(l.edited_completion) <> ''
     AND l.completion IS NOT NULL
     AND l.edited_completion <> l.completion
     AND l.pii_flags = 0
     AND l.created_at > now() - interval '180 days'
  OFFSET 0) c;
CREATE UNIQUE INDEX pair_candidate_key
  ON train.pair_candidate (source, prompt_log_id, prompt_created_at, chosen_log_id);
CREATE INDEX pair_candidate_route_idx ON train.pair_candidate (tenant_id, route, created_at);

COMMENT ON MATERIALIZED VIEW train.sft_candidate IS
  'SFT candidates (edits and thumbs-up answers) of consenting tenants, pii_flags = 0, last 180 days, with their examples; snapshots filter further.';
COMMENT ON MATERIALIZED VIEW train.kto_candidate IS
  'KTO candidates (explicit thumbs) of consenting tenants, pii_flags = 0, last 180 days.';
COMMENT ON MATERIALIZED VIEW train.pair_candidate IS
  'DPO/ORPO/SimPO pairs (regenerate, edits) of consenting tenants, pii_flags = 0, last 180 days.';

COMMENT ON COLUMN train.sft_candidate.prompt_log_id IS
  'id of the obs.inference_log row (edited or rated up); with prompt_created_at the view''s key.';
COMMENT ON COLUMN train.sft_candidate.prompt_created_at IS
  'created_at of that row (the rest of its primary key).';
COMMENT ON COLUMN train.sft_candidate.log_ids IS
  'ids of the log rows the example is built from (that one row).';
COMMENT ON COLUMN train.sft_candidate.tenant_id IS
  'The tenant whose traffic it is (consenting at the refresh).';
COMMENT ON COLUMN train.sft_candidate.route IS 'The route called.';
COMMENT ON COLUMN train.sft_candidate.rating IS
  'The row''s thumbs (fb_explicit; 0 when unrated): a snapshot''s '
  'dedup keeps the highest (rating, created_at, prompt_log_id).';
COMMENT ON COLUMN train.sft_candidate.source IS
  'edit (the user''s edited text is the answer) or thumbs_up (the answer, rated up as it was).';
COMMENT ON COLUMN train.sft_candidate.created_at IS
  'When the call was made: a snapshot''s window filters on it.';
COMMENT ON COLUMN train.sft_candidate.example IS
  'The TRL sft example: {messages: the prompt and the '
  'edited text, or the answer rated up, as the assistant turn} (train.sft_example).';
COMMENT ON COLUMN train.sft_candidate.example_hash IS
  'sha256 of the example''s jsonb text (train.example_hash): '
  'its identity and split bucket in a snapshot.';
COMMENT ON COLUMN train.sft_candidate.dup_check_off IS
  'Always NULL, so REFRESH ... CONCURRENTLY leaves every row out of its '
  'whole-row duplicate search (useless here: each row has its own key).';

COMMENT ON COLUMN train.kto_candidate.prompt_log_id IS
  'id of the rated obs.inference_log row; with prompt_created_at the view''s key.';
COMMENT ON COLUMN train.kto_candidate.prompt_created_at IS
  'created_at of that row (the rest of its primary key).';
COMMENT ON COLUMN train.kto_candidate.log_ids IS
  'ids of the log rows the example is built from (that one row).';
COMMENT ON COLUMN train.kto_candidate.tenant_id IS
  'The tenant whose traffic it is (consenting at the refresh).';
COMMENT ON COLUMN train.kto_candidate.route IS 'The route called.';
COMMENT ON COLUMN train.kto_candidate.label IS
  'The KTO label: true for thumbs up (fb_explicit 1), false for thumbs down (-1).';
COMMENT ON COLUMN train.kto_candidate.rating IS
  'fb_explicit as int (1 or -1): a snapshot''s dedup '
  'keeps the highest (rating, created_at, prompt_log_id).';
COMMENT ON COLUMN train.kto_candidate.created_at IS
  'When the call was made: a snapshot''s window filters on it.';
COMMENT ON COLUMN train.kto_candidate.example IS
  'The TRL kto example: {prompt, completion: the answer '
  'as the assistant turn, label} (train.kto_example).';
COMMENT ON COLUMN train.kto_candidate.example_hash IS
  'sha256 of the example''s jsonb text (train.example_hash): '
  'its identity and split bucket in a snapshot.';
COMMENT ON COLUMN train.kto_candidate.dup_check_off IS
  'Always NULL, so REFRESH ... CONCURRENTLY leaves every row out of its '
  'whole-row duplicate search (useless here: each row has its own key).';

COMMENT ON COLUMN train.pair_candidate.source IS
  'regen (a regenerated answer against its child) or '
  'edit (the user''s edit against the original answer).';
COMMENT ON COLUMN train.pair_candidate.prompt_log_id IS
  'id of the rejected obs.inference_log row (the regenerated '
  'one, or the edited one); its messages are the prompt.';
COMMENT ON COLUMN train.pair_candidate.prompt_created_at IS
  'created_at of that row (the rest of its primary key).';
COMMENT ON COLUMN train.pair_candidate.chosen_log_id IS
  'id of the row whose answer is chosen: the regenerated '
  'row''s child (regen), or the edited row itself (edit).';
COMMENT ON COLUMN train.pair_candidate.chosen_created_at IS 'created_at of the chosen row.';
COMMENT ON COLUMN train.pair_candidate.log_ids IS
  'ids of the log rows the pair is built from: rejected '
  'and chosen (regen), or the edited row (edit).';
COMMENT ON COLUMN train.pair_candidate.tenant_id IS
  'The tenant whose traffic it is (consenting at the refresh).';
COMMENT ON COLUMN train.pair_candidate.route IS 'The route called.';
COMMENT ON COLUMN train.pair_candidate.rating IS
  'The chosen row''s thumbs (fb_explicit; 0 when unrated): a snapshot''s '
  'dedup keeps the highest (rating, created_at, prompt_log_id).';
COMMENT ON COLUMN train.pair_candidate.created_at IS
  'When the chosen row''s call was made: a snapshot''s window filters on it.';
COMMENT ON COLUMN train.pair_candidate.example IS
  'The TRL preference pair: {prompt, chosen, rejected}, '
  'each answer as an assistant turn (train.pair_example).';
COMMENT ON COLUMN train.pair_candidate.example_hash IS
  'sha256 of the example''s jsonb text (train.example_hash): '
  'its identity and split bucket in a snapshot.';
COMMENT ON COLUMN train.pair_candidate.dup_check_off IS
  'Always NULL, so REFRESH ... CONCURRENTLY leaves every row out of its '
  'whole-row duplicate search (useless here: each row has its own key).';

-- The views have no row-level security (PostgreSQL has none for materialised views): the API
-- role reads them only through the snapshot functions, which pin the caller's tenant.
REVOKE ALL ON train.sft_candidate, train.kto_candidate, train.pair_candidate FROM PUBLIC;
GRANT SELECT ON train.sft_candidate, train.kto_candidate, train.pair_candidate
  TO cft_dashboard;
