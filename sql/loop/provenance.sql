-- From an adapter back to what made it: one row per thing, in order: the adapter, its cycle
-- (trigger and values, method and hyperparameters), the snapshot, each example, each source
-- log row still present (forgotten ones are gone), the eval results, the experiment numbers
-- and decision, the watch, every cycle transition and every registry event.
--   SELECT step, ref, detail FROM loop.provenance('support-20261201120000-1a2b3c4d');
CREATE OR REPLACE FUNCTION loop.provenance(p_adapter text)
RETURNS TABLE (ord int, step text, ref text, detail jsonb)
LANGUAGE sql STABLE AS $$
  WITH a AS (SELECT * FROM serve.adapter WHERE id = p_adapter),
  c AS (SELECT * FROM loop.cycle WHERE adapter_id = p_adapter ORDER BY id DESC LIMIT 1),
  s AS (SELECT sn.* FROM train.dataset_snapshot sn JOIN a ON sn.id = a.dataset_snapshot_id),
  e AS (SELECT x.* FROM train.dataset_example x JOIN s ON x.snapshot_id = s.id)
  SELECT 1, 'adapter', a.id, to_jsonb(a) - 'eval_summary' FROM a
  UNION ALL
  SELECT 2, 'cycle', c.id::text, jsonb_build_object('state', c.state, 'created_at', c.created_at,
         'finished_at', c.finished_at, 'method', c.method, 'method_reason', c.method_reason,
         'hyperparameters', c.hyperparameters, 'signal_counts', c.signal_counts,
         'training_run_id', c.training_run_id, 'attempts', c.attempts, 'error', c.error,
         'settings_tried', c.settings_tried) FROM c
  UNION ALL
  SELECT 3, 'trigger', c.trigger, c.trigger_values FROM c
  UNION ALL
  SELECT 4, 'snapshot', s.id::text, jsonb_build_object('method', s.method, 'counts', s.counts,
         'n_train', s.n_train, 'n_eval', s.n_eval, 'set_hash', s.set_hash,
         'created_at', s.created_at, 'tainted_at', s.tainted_at, 'query_sql', s.query_sql) FROM s
  UNION ALL
  SELECT 5, 'example', encode(e.example_hash, 'hex'),
         jsonb_build_object('split', e.split, 'log_ids', e.log_ids) FROM e
  UNION ALL
  SELECT 6, 'log_row', l.id::text, jsonb_build_object('created_at', l.created_at,
         'adapter_id', l.adapter_id, 'request_id', l.request_id, 'fb_explicit', l.fb_explicit,
         'fb_regen', l.fb_regen, 'fb_edited', l.fb_edited, 'user_hash', encode(l.user_hash, 'hex'))
    FROM obs.inference_log l
   WHERE l.id IN (SELECT unnest(e.log_ids) FROM e) AND l.tenant_id = (SELECT tenant_id FROM a)
  UNION ALL
  SELECT 7, 'eval', r.suite_id || '/' || r.metric, jsonb_build_object('score', r.score,
         'judge_model', r.judge_model, 'judged_at', r.judged_at, 'author', r.author)
    FROM train.eval_result_counted r WHERE r.adapter_id = p_adapter
  UNION ALL
  SELECT 8, 'gate', c.id::text, jsonb_build_object('current_prod', c.current_prod_id,
         'blockers', c.blockers, 'eval_scores', c.eval_scores) FROM c
  UNION ALL
  SELECT 9, 'experiment', c.id::text, jsonb_build_object('canary_pct', c.canary_pct,
         'canary_started_at', c.canary_started_at, 'numbers', c.experiment) FROM c
  UNION ALL
  SELECT 10, 'decision', c.decision, jsonb_build_object('code', c.decision_code,
         'reason', c.decision_reason, 'previous_prod_id', c.previous_prod_id,
         'promoted_at', c.promoted_at) FROM c WHERE c.decision IS NOT NULL
  UNION ALL
  SELECT 11, 'watch', c.id::text, jsonb_build_object('watch_until', c.watch_until, 'numbers', c.watch)
    FROM c WHERE c.watch IS NOT NULL
  UNION ALL
  SELECT 12, 'cycle_event', ev.id::text, jsonb_build_object('from', ev.from_state, 'to', ev.to_state,
         'at', ev.at, 'worker_id', ev.worker_id, 'note', ev.note, 'inputs', ev.inputs)
    FROM loop.cycle_event ev JOIN c ON ev.cycle_id = c.id
  UNION ALL
  SELECT 13, 'adapter_event', ae.id::text, jsonb_build_object('old_status', ae.old_status,
         'new_status', ae.new_status, 'traffic_pct', ae.new_traffic_pct, 'actor', ae.actor,
         'reason', ae.reason, 'at', ae.at)
    FROM serve.adapter_event ae WHERE ae.adapter_id = p_adapter
  ORDER BY 1, 3
$$;
COMMENT ON FUNCTION loop.provenance(text) IS
  'From an adapter back to its loop cycle, trigger, snapshot, examples, source log rows, evals, '
  'experiment, decision, watch and events: one row per thing.';
