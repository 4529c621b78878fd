-- The OpenAI fine-tuning API's files, jobs and events (app/finetuning; docs/openai-fine-tuning.md):
-- row-level security by tenant, the snapshot a job freezes from its files, and the job events
-- that the training run's changes write.

COMMENT ON TABLE train.training_file IS
  'Files uploaded for fine-tuning (POST /v1/files, purpose fine-tune), validated line by line.';
COMMENT ON COLUMN train.training_file.id IS 'The file''s id, as the OpenAI API names it (file-...).';
COMMENT ON COLUMN train.training_file.tenant_id IS 'The tenant that uploaded it.';
COMMENT ON COLUMN train.training_file.filename IS 'The name the upload gave.';
COMMENT ON COLUMN train.training_file.purpose IS 'fine-tune (the only purpose accepted).';
COMMENT ON COLUMN train.training_file.format IS
  'chat (lines of {"messages"}: supervised jobs) or preference (lines of {"input", '
  '"preferred_output", "non_preferred_output"}: dpo jobs).';
COMMENT ON COLUMN train.training_file.lines IS 'Examples in it (non-blank lines).';
COMMENT ON COLUMN train.training_file.bytes IS 'Its size in bytes (at most CFT_FILE_MAX_BYTES).';
COMMENT ON COLUMN train.training_file.sha256 IS 'Hex sha256 of its content.';
COMMENT ON COLUMN train.training_file.content IS 'The file as uploaded (JSONL, UTF-8).';
COMMENT ON COLUMN train.training_file.created_at IS 'When it was uploaded.';

COMMENT ON TABLE train.fine_tuning_job IS
  'Fine-tuning jobs (POST /v1/fine_tuning/jobs): each is a training run on a snapshot frozen '
  'from its files; its status is the run''s.';
COMMENT ON COLUMN train.fine_tuning_job.id IS 'The job''s id (ftjob-...).';
COMMENT ON COLUMN train.fine_tuning_job.tenant_id IS 'The tenant it trains for.';
COMMENT ON COLUMN train.fine_tuning_job.training_run_id IS
  'Its training run (train.training_run.id): status, progress, error and adapter.';
COMMENT ON COLUMN train.fine_tuning_job.model IS
  'The model the request named: a route of the tenant, or the base model of exactly one.';
COMMENT ON COLUMN train.fine_tuning_job.route IS 'The route its adapter is a candidate of.';
COMMENT ON COLUMN train.fine_tuning_job.method IS
  'supervised (an sft run) or dpo (a dpo run), the request''s method.type.';
COMMENT ON COLUMN train.fine_tuning_job.training_file IS
  'The training file''s id (its examples are the snapshot''s train split; the file may be '
  'deleted since).';
COMMENT ON COLUMN train.fine_tuning_job.validation_file IS
  'The validation file''s id (its examples are the eval split), or NULL.';
COMMENT ON COLUMN train.fine_tuning_job.suffix IS 'The suffix of its model name, or NULL.';
COMMENT ON COLUMN train.fine_tuning_job.seed IS 'The training seed (the request''s, else random).';
COMMENT ON COLUMN train.fine_tuning_job.hyperparameters IS
  'OpenAI''s hyperparameters as resolved ("auto" replaced by what the run trains with).';
COMMENT ON COLUMN train.fine_tuning_job.fine_tuned_model IS
  'The model name its adapter answers to on /v1/chat/completions once it succeeded: '
  'ft:<base>:<tenant>:<suffix>:<id>.';
COMMENT ON COLUMN train.fine_tuning_job.metadata IS 'The request''s metadata (string pairs).';
COMMENT ON COLUMN train.fine_tuning_job.created_at IS 'When it was created.';

COMMENT ON TABLE train.fine_tuning_event IS
  'What happened to a fine-tuning job (GET /v1/fine_tuning/jobs/{id}/events): written when it '
  'is created and by train.fine_tuning_run_event as its run changes.';
COMMENT ON COLUMN train.fine_tuning_event.id IS 'Order of the events (ftevent-<id> in the API).';
COMMENT ON COLUMN train.fine_tuning_event.tenant_id IS 'The job''s tenant.';
COMMENT ON COLUMN train.fine_tuning_event.job_id IS 'The job (train.fine_tuning_job.id).';
COMMENT ON COLUMN train.fine_tuning_event.created_at IS 'When it happened.';
COMMENT ON COLUMN train.fine_tuning_event.level IS 'info, warn or error.';
COMMENT ON COLUMN train.fine_tuning_event.type IS 'message, or metrics (a training step''s loss).';
COMMENT ON COLUMN train.fine_tuning_event.message IS 'What happened, in words.';
COMMENT ON COLUMN train.fine_tuning_event.data IS
  'Its numbers (a step''s loss) or the ids behind it (run, snapshot, adapter, route).';

-- Row-level security of the three tables: sql/core/tenant_isolation.sql.

GRANT SELECT, INSERT, DELETE ON train.training_file TO cft_app;
GRANT SELECT, INSERT ON train.fine_tuning_job, train.fine_tuning_event TO cft_app;
-- The file contents are the tenant's training data: the read-only roles see the jobs only.
GRANT SELECT ON train.fine_tuning_job, train.fine_tuning_event TO cft_release, cft_dashboard;

-- Freeze a snapshot of a job's examples (the API calls this as cft_app for one tenant, in the
-- request's transaction): p_train becomes the train split and p_eval the eval split, as the
-- files said (no split rule: train.verify_snapshot checks their counts). An example repeated
-- is kept once (the first), and an eval example that is also a training example stays in
-- train only; counts says how many went. log_ids are empty: no log row is behind a file.
CREATE OR REPLACE FUNCTION train.create_file_snapshot(
  p_tenant_id  int,
  p_route      text,
  p_method     text,
  p_train      jsonb,
  p_eval       jsonb,
  p_params     jsonb,
  p_created_by text
) RETURNS train.dataset_snapshot
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_id    uuid := uuidv7();
  v_train int;
  v_eval  int;
  v_hash  text;
  v_snap  train.dataset_snapshot;
BEGIN
  PERFORM train.check_snapshot_scope(p_tenant_id, p_route);
  IF jsonb_typeof(p_train) IS DISTINCT FROM 'array' OR jsonb_array_length(p_train) = 0
     OR jsonb_typeof(coalesce(p_eval, '[]')) <> 'array' THEN
    RAISE EXCEPTION 'a file snapshot needs a non-empty array of training examples'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;

  INSERT INTO train.dataset_snapshot
         (id, tenant_id, route, method, query_sql, params, counts, created_by)
  VALUES (v_id, p_tenant_id, p_route, p_method,
          '-- examples from uploaded files (train.training_file): the training file''s lines'
          || ' are the train split, the validation file''s the eval split',
          coalesce(p_params, '{}') || jsonb_build_object('source', 'files'), '{}', p_created_by);

  -- This draft's rows skip the per-row insert check (train/dataset_example_guard.sql).
  PERFORM set_config('cft.writing_snapshot', v_id::text, true);
  WITH t AS (
    SELECT DISTINCT ON (h) h, e FROM (
      SELECT train.example_hash(x.e) AS h, x.e, x.o
        FROM jsonb_array_elements(p_train) WITH ORDINALITY AS x(e, o)) s
     ORDER BY h, o
  ), v AS (
    SELECT DISTINCT ON (h) h, e FROM (
      SELECT train.example_hash(x.e) AS h, x.e, x.o
        FROM jsonb_array_elements(coalesce(p_eval, '[]')) WITH ORDINALITY AS x(e, o)) s
     WHERE h NOT IN (SELECT t.h FROM t)
     ORDER BY h, o
  )
  INSERT INTO train.dataset_example (snapshot_id, example_hash, split, log_ids, example)
  SELECT v_id, t.h, 'train', '{}'::bigint[], t.e FROM t
  UNION ALL
  SELECT v_id, v.h, 'eval', '{}'::bigint[], v.e FROM v;
  PERFORM set_config('cft.writing_snapshot', '', true);

  SELECT count(*) FILTER (WHERE split = 'train'), count(*) FILTER (WHERE split = 'eval'),
         encode(sha256(coalesce(string_agg(example_hash, ''::bytea ORDER BY example_hash),
                                ''::bytea)), 'hex')
    INTO v_train, v_eval, v_hash
    FROM train.dataset_example WHERE snapshot_id = v_id;

  UPDATE train.dataset_snapshot
     SET n_train = v_train, n_eval = v_eval, set_hash = v_hash,
         counts = jsonb_build_object(
           'train_examples', jsonb_array_length(p_train),
           'eval_examples', jsonb_array_length(coalesce(p_eval, '[]')),
           'train_kept', v_train, 'eval_kept', v_eval)
   WHERE id = v_id
  RETURNING * INTO v_snap;
  RETURN v_snap;
END
$$;
REVOKE ALL ON FUNCTION train.create_file_snapshot(int, text, text, jsonb, jsonb, jsonb, text)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION train.create_file_snapshot(int, text, text, jsonb, jsonb, jsonb, text)
  TO cft_app;
COMMENT ON FUNCTION train.create_file_snapshot(int, text, text, jsonb, jsonb, jsonb, text) IS
  'Freeze a fine-tuning job''s examples into a sealed snapshot: training examples in train, '
  'validation examples in eval (repeats kept once).';

-- A job's events from its training run: a status change, a cancel asked for, each new step
-- with its loss. Runs as the owner (the API cancels as cft_app; the trainer writes progress).
CREATE OR REPLACE FUNCTION train.fine_tuning_run_event() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_job   train.fine_tuning_job;
  v_step  int := (NEW.progress->>'step')::int;
  v_total int := (NEW.progress->>'total')::int;
  v_loss  double precision := (NEW.progress->>'loss')::double precision;
  v_old   int := coalesce((OLD.progress->>'step')::int, 0);
BEGIN
  SELECT * INTO v_job FROM train.fine_tuning_job WHERE training_run_id = NEW.id;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  -- Each logged step since the last change: the progress's loss history holds them even when
  -- a heartbeat came after several steps (the last loss alone when it has none).
  IF v_step > v_old THEN
    INSERT INTO train.fine_tuning_event (tenant_id, job_id, level, type, message, data)
    SELECT NEW.tenant_id, v_job.id, 'info', 'metrics',
           format('Step %s/%s: training loss=%s', p.step, v_total, round(p.loss::numeric, 4)),
           jsonb_build_object('step', p.step, 'total_steps', v_total, 'train_loss', p.loss)
      FROM (SELECT (h->>0)::numeric::int AS step, (h->>1)::double precision AS loss
              FROM jsonb_array_elements(coalesce(NEW.progress->'loss_history', '[]')) AS h
            UNION ALL
            SELECT v_step, v_loss
             WHERE v_loss IS NOT NULL
               AND NOT EXISTS (
                 SELECT 1 FROM jsonb_array_elements(coalesce(NEW.progress->'loss_history', '[]')) h
                  WHERE (h->>0)::numeric = v_step)) p
     WHERE p.step > v_old AND p.step <= v_step AND p.loss IS NOT NULL
     ORDER BY p.step;
  END IF;
  IF NEW.cancel_requested AND NOT OLD.cancel_requested AND NEW.status = 'running' THEN
    INSERT INTO train.fine_tuning_event (tenant_id, job_id, level, type, message)
    VALUES (NEW.tenant_id, v_job.id, 'info', 'message',
            'Cancellation requested: the trainer stops at its next step');
  END IF;
  IF NEW.status IS DISTINCT FROM OLD.status THEN
    INSERT INTO train.fine_tuning_event (tenant_id, job_id, level, type, message, data)
    SELECT NEW.tenant_id, v_job.id, e.level, 'message', e.message, e.data
      FROM (VALUES
        (1, 'running', 'info', CASE WHEN NEW.attempts > 1
                                    THEN format('Fine-tuning job started (attempt %s)', NEW.attempts)
                                    ELSE 'Fine-tuning job started' END,
         jsonb_build_object('host', NEW.host, 'devices', NEW.devices)),
        (2, 'queued', 'warn', format('Attempt %s failed (%s): queued again', NEW.attempts - 1,
                                     coalesce(NEW.error, 'no error recorded')), NULL::jsonb),
        (3, 'succeeded', 'info', format('New fine-tuned model created: %s', v_job.fine_tuned_model),
         jsonb_build_object('adapter_id', NEW.adapter_id, 'route', NEW.route,
                            'training_run_id', NEW.id, 'snapshot_id', NEW.snapshot_id)),
        (4, 'succeeded', 'info', 'The job has successfully completed', NULL),
        (5, 'failed', 'error', format('Fine-tuning job failed: %s',
                                      coalesce(NEW.error, 'no error recorded')), NULL),
        (6, 'cancelled', 'info', 'Fine-tuning job cancelled', NULL)
      ) AS e(n, status, level, message, data)
     WHERE e.status = NEW.status
     ORDER BY e.n;
  END IF;
  RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION train.fine_tuning_run_event() FROM PUBLIC;

CREATE OR REPLACE TRIGGER fine_tuning_run_event
  AFTER UPDATE OF status, progress, cancel_requested ON train.training_run
  FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status
        OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested
        OR OLD.progress->'step' IS DISTINCT FROM NEW.progress->'step')
  EXECUTE FUNCTION train.fine_tuning_run_event();
