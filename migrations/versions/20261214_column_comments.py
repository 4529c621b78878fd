"""Every column of cft's relations says what it holds: COMMENT ON COLUMN (docs/reference/sql.md).

488 columns had no comment: those of the tables loop.cycle, loop.cycle_event, loop.policy,
loop.control, obs.inference_log, obs.request_key, obs.prompt_neighbour_scan,
obs.prompt_embedding, obs.prompt_neighbour, obs.deleted_log, serve.route, serve.adapter,
serve.adapter_event, serve.adapter_deployment, serve.experiment_policy,
serve.experiment_decision, train.training_run, train.training_worker, train.dataset_snapshot,
train.dataset_example, train.eval_result, train.eval_suite, train.eval_case,
train.eval_calibration_case, train.eval_request, train.promotion_policy,
train.judge_calibration, train.judge_verdict, train.candidate_view_refresh, auth.api_key,
auth.forget_request, auth.tenant_offboarding and tenant; of the views obs.experiment,
obs.experiment_arm_7d, obs.experiment_compare_7d, obs.inference_log_partition and
train.training_run_wait; of the materialised views train.sft_candidate, train.kto_candidate
and train.pair_candidate; and of the composite type obs.arm_sample. Comments only: no object
changes (CREATE OR REPLACE VIEW keeps a view's column comments; a migration that drops and
creates one of these views must set them again).

The downgrade sets each of them back to NULL.

Revision ID: 20261214
Revises: 20261213
"""

from alembic import op

revision = "20261214"
down_revision = "20261213"
branch_labels = None
depends_on = None

UPGRADE_SQL = r"""
COMMENT ON COLUMN tenant.id IS 'The tenant''s number: tenant_id in every other table.';
COMMENT ON COLUMN tenant.name IS
  'Unique name (a-z, 0-9, _ . -), as the CLI and the operator API name the tenant.';
COMMENT ON COLUMN tenant.consent_training IS
  'The tenant lets its traffic train adapters; false (the default) keeps its rows out of '
  'every candidate view and snapshot.';
COMMENT ON COLUMN tenant.created_at IS 'When the tenant was created.';
COMMENT ON COLUMN tenant.updated_at IS 'Last change of the row (a consent change sets it).';

COMMENT ON COLUMN auth.api_key.id IS
  'The key''s number (cft key revoke takes it or the prefix; eval '
  'results name it in author_key_id).';
COMMENT ON COLUMN auth.api_key.tenant_id IS
  'The tenant the key acts for; NULL: an operator key (platform-wide).';
COMMENT ON COLUMN auth.api_key.role IS
  'What the key may do: ingest, client, trainer, release, reader, admin (a tenant''s key) or '
  'operator (administers tenants).';
COMMENT ON COLUMN auth.api_key.prefix IS
  'The key''s first 12 characters (cft_ and 8 more): names it in listings and audit lines.';
COMMENT ON COLUMN auth.api_key.key_hash IS
  'sha256 of the whole key: a request''s key is looked up by it; the key itself is never stored.';
COMMENT ON COLUMN auth.api_key.name IS
  'Free label given when the key was created (e.g. backend); NULL: none.';
COMMENT ON COLUMN auth.api_key.created_at IS 'When the key was created.';
COMMENT ON COLUMN auth.api_key.revoked_at IS
  'When it was revoked (cft key revoke, tenant offboarding): since then it '
  'authenticates nothing. NULL: live.';
COMMENT ON COLUMN auth.api_key.last_used_at IS
  'When the key last authenticated a request, to the minute (the key lookup sets it at most once '
  'a minute; the router re-verifies cached keys every CFT_ROUTER_KEY_CACHE_TTL s). NULL: never used.';

COMMENT ON COLUMN obs.inference_log.id IS
  'Row number; with created_at the primary key (the table is partitioned by week on created_at).';
COMMENT ON COLUMN obs.inference_log.request_id IS
  'The call''s UUID, chosen by the client (the router: X-Request-Id or a new one); unique per '
  'tenant through obs.request_key.';
COMMENT ON COLUMN obs.inference_log.tenant_id IS 'The tenant whose traffic it is.';
COMMENT ON COLUMN obs.inference_log.user_hash IS
  'The end user''s pseudonym: HMAC-SHA256 of the product''s user id (never stored raw); '
  'forgetting a user deletes by it.';
COMMENT ON COLUMN obs.inference_log.route IS
  'The route called (serve.route.name), e.g. support-es.';
COMMENT ON COLUMN obs.inference_log.adapter_id IS
  'What answered: an adapter id, or the base model (base when a logged record names none).';
COMMENT ON COLUMN obs.inference_log.model IS
  'The base model (the router logs the route''s base_model).';
COMMENT ON COLUMN obs.inference_log.experiment IS
  'Experiment the call belongs to (the router: the route''s experiment, or its name, '
  'while a canary serves); NULL: none.';
COMMENT ON COLUMN obs.inference_log.variant IS
  'Arm of that experiment: A = prod, B.. = canaries; NULL: no arm (no experiment, or a fallback).';
COMMENT ON COLUMN obs.inference_log.messages IS
  'The prompt: OpenAI chat messages (a completion call''s prompt as one user message).';
COMMENT ON COLUMN obs.inference_log.completion IS
  'The answer''s text; NULL when the call produced none.';
COMMENT ON COLUMN obs.inference_log.ttft_ms IS
  'Time to first token in ms (the router: to the first streamed text, or to the whole answer '
  'of a call that does not stream).';
COMMENT ON COLUMN obs.inference_log.tokens_in IS
  'Prompt tokens, as the caller or the engine''s usage reports them.';
COMMENT ON COLUMN obs.inference_log.tokens_out IS
  'Completion tokens, as the caller or the engine''s usage reports them.';
COMMENT ON COLUMN obs.inference_log.fb_explicit IS
  'Thumbs: 1 good, -1 bad, 0 neutral; NULL: not rated. The KTO signal.';
COMMENT ON COLUMN obs.inference_log.fb_regen IS
  'The user asked for another answer: this one is the rejected side of a regenerate pair.';
COMMENT ON COLUMN obs.inference_log.fb_edited IS
  'The user corrected the answer (edited_completion): an SFT example, and a '
  'pair of the edit over this answer.';
COMMENT ON COLUMN obs.inference_log.edited_completion IS
  'The answer as the user corrected it (feedback edited_completion).';
COMMENT ON COLUMN obs.inference_log.parent_id IS
  'id of the row this one regenerated, linked by obs.link_regenerations once both are logged.';
COMMENT ON COLUMN obs.inference_log.parent_request_id IS
  'request_id of the row this one regenerated, as logged (that row may arrive later).';
COMMENT ON COLUMN obs.inference_log.regenerated_by IS
  'request_id of the answer that replaced this one (feedback regenerated_by), if known.';
COMMENT ON COLUMN obs.inference_log.embedding IS
  'The prompt''s embedding (CFT_EMBEDDING_DIM dimensions), from the client or the '
  'embedder; NULL: not embedded yet.';
COMMENT ON COLUMN obs.inference_log.pii_flags IS
  'Bitmask of PII found at ingest (1 email, 2 phone, 4 card, 8 iban, 16 ipv4, 32 ipv6); a '
  'flagged row never enters a dataset.';
COMMENT ON COLUMN obs.inference_log.status IS
  'ok, error (no answer) or partial (the answer was cut short).';
COMMENT ON COLUMN obs.inference_log.feedback_at IS
  'When feedback (thumbs, regeneration, edit) last came for the row; NULL: none.';
COMMENT ON COLUMN obs.inference_log.created_at IS
  'When the call was made (default: when it was logged); the partition key.';

COMMENT ON COLUMN obs.request_key.tenant_id IS 'The tenant that logged the request.';
COMMENT ON COLUMN obs.request_key.request_id IS
  'The request''s id (obs.inference_log.request_id): unique per tenant across every partition.';
COMMENT ON COLUMN obs.request_key.log_id IS 'id of the log row it names.';
COMMENT ON COLUMN obs.request_key.created_at IS
  'created_at of that log row: with log_id, the row''s primary key (and so its partition).';

COMMENT ON COLUMN serve.route.name IS
  'The route''s name, unique across tenants: what a call names (model or '
  'X-Cft-Route), e.g. support-es.';
COMMENT ON COLUMN serve.route.tenant_id IS 'The tenant that owns the route.';
COMMENT ON COLUMN serve.route.base_model IS
  'The base model the route serves: it answers when no adapter is prod or one '
  'cannot serve; the loop trains on it.';
COMMENT ON COLUMN serve.route.experiment IS
  'Salt of the sticky canary split (a user''s bucket: md5(experiment:user)) and the experiment '
  'name logged; NULL: the route name. A new value reshuffles users.';
COMMENT ON COLUMN serve.route.created_at IS 'When the route was created.';

COMMENT ON COLUMN serve.adapter.id IS
  'The adapter''s name, never reused: its lora_name on the engines and '
  'the adapter_id the log records.';
COMMENT ON COLUMN serve.adapter.tenant_id IS 'The tenant that owns it (its route''s).';
COMMENT ON COLUMN serve.adapter.route IS 'The route it was trained for and may serve.';
COMMENT ON COLUMN serve.adapter.base_model IS 'The base model it was trained on.';
COMMENT ON COLUMN serve.adapter.base_revision IS
  'Revision of the base model''s weights it was trained on; the evaluator compares it with the '
  'prod only on the same base and revision.';
COMMENT ON COLUMN serve.adapter.rank IS 'LoRA rank r.';
COMMENT ON COLUMN serve.adapter.alpha IS 'LoRA alpha (the update is scaled by alpha / rank).';
COMMENT ON COLUMN serve.adapter.target_modules IS
  'Names of the modules the LoRA adapts (a JSON list).';
COMMENT ON COLUMN serve.adapter.method IS 'How it was trained: sft, dpo, kto, orpo or simpo.';
COMMENT ON COLUMN serve.adapter.training_run_id IS
  'The training run that made it (train.training_run.id).';
COMMENT ON COLUMN serve.adapter.dataset_snapshot_id IS
  'The snapshot it was trained on (train.dataset_snapshot.id): its '
  'held-out split and its provenance.';
COMMENT ON COLUMN serve.adapter.weights_uri IS
  'Where its artefact (the adapter directory) is stored, e.g. '
  'file:///...; engines load a verified copy.';
COMMENT ON COLUMN serve.adapter.sha256 IS
  'Hex sha256 of adapter_model.safetensors: a fetched artefact that differs is never loaded.';
COMMENT ON COLUMN serve.adapter.size_bytes IS 'Total size of the artefact''s files, in bytes.';
COMMENT ON COLUMN serve.adapter.eval_summary IS
  'The trainer''s metrics (train) and the evaluator''s summary (results of the candidate, the bare '
  'base and the prod it was compared with).';
COMMENT ON COLUMN serve.adapter.status IS
  'training, candidate (registered, not serving), canary (a share of users), prod (the rest; one '
  'per route), retired or failed; canary and prod pass the gate.';
COMMENT ON COLUMN serve.adapter.traffic_pct IS
  'Share of the route''s users in %: a canary''s split; 100 for prod, which gets every '
  'bucket no canary has; 0 otherwise.';
COMMENT ON COLUMN serve.adapter.experiment IS
  'A label kept from the seed schema (cft_release may set it); cft does not read it: the split''s '
  'salt is serve.route.experiment.';
COMMENT ON COLUMN serve.adapter.promoted_at IS 'When it last became prod (set by the gate).';
COMMENT ON COLUMN serve.adapter.tainted_at IS
  'When a user it was trained on was forgotten: a tainted adapter is neither promoted nor restored '
  'by a rollback, and a tainted prod fires the loop''s forget trigger. NULL: clean.';
COMMENT ON COLUMN serve.adapter.tainted_reason IS
  'Why it is tainted (the forget request that tainted it).';
COMMENT ON COLUMN serve.adapter.created_at IS 'When it was registered.';
COMMENT ON COLUMN serve.adapter.updated_at IS 'Last change of the row (kept by trigger).';

COMMENT ON COLUMN serve.adapter_event.id IS 'Event number, in the order the events were written.';
COMMENT ON COLUMN serve.adapter_event.adapter_id IS 'The adapter that changed.';
COMMENT ON COLUMN serve.adapter_event.route IS 'Its route.';
COMMENT ON COLUMN serve.adapter_event.tenant_id IS 'Its tenant.';
COMMENT ON COLUMN serve.adapter_event.op IS 'INSERT, UPDATE (of status or traffic_pct) or DELETE.';
COMMENT ON COLUMN serve.adapter_event.old_status IS 'Status before; NULL for an INSERT.';
COMMENT ON COLUMN serve.adapter_event.new_status IS 'Status after; NULL for a DELETE.';
COMMENT ON COLUMN serve.adapter_event.old_traffic_pct IS
  'traffic_pct before, in %; NULL for an INSERT.';
COMMENT ON COLUMN serve.adapter_event.new_traffic_pct IS
  'traffic_pct after, in %; NULL for a DELETE.';
COMMENT ON COLUMN serve.adapter_event.actor IS
  'Who: the session user, with "as <role>" when it acted as another role.';
COMMENT ON COLUMN serve.adapter_event.application_name IS
  'The writing session''s application_name, if set.';
COMMENT ON COLUMN serve.adapter_event.reason IS
  'Why, as the writer set it in cft.reason (an API reason, loop cycle N: ..., auto-policy: ...).';
COMMENT ON COLUMN serve.adapter_event.override IS
  'cft.override was on: an override of the gate or the canary '
  'ceiling (cft_release, with a reason).';
COMMENT ON COLUMN serve.adapter_event.detail IS
  'The gate''s verdict on the change: gate (promotion, canary or rollback), against, the '
  'blockers overridden, rolled_back.';
COMMENT ON COLUMN serve.adapter_event.at IS 'When (the clock time of the write).';

COMMENT ON COLUMN serve.adapter_deployment.adapter_id IS 'The adapter (serve.adapter.id).';
COMMENT ON COLUMN serve.adapter_deployment.engine_url IS 'The engine''s base URL.';
COMMENT ON COLUMN serve.adapter_deployment.state IS
  'The reconciler''s last outcome on that engine: loaded (verified and loaded, or staged '
  'for LoRAX), failed or unloaded.';
COMMENT ON COLUMN serve.adapter_deployment.error IS
  'Why it failed (a sha256 mismatch, a fetch or load error); NULL otherwise.';
COMMENT ON COLUMN serve.adapter_deployment.sha256_checked_at IS
  'When the artefact''s sha256 was last checked against serve.adapter.sha256 before a load.';
COMMENT ON COLUMN serve.adapter_deployment.updated_at IS
  'When the reconciler last recorded an outcome.';

COMMENT ON COLUMN serve.experiment_policy.route IS 'The route whose canaries the policy decides.';
COMMENT ON COLUMN serve.experiment_policy.tenant_id IS 'The route''s tenant.';
COMMENT ON COLUMN serve.experiment_policy.created_at IS 'When the policy was written.';
COMMENT ON COLUMN serve.experiment_policy.updated_at IS
  'Last change, as the writer sets it (now() at insert; no trigger keeps it).';

COMMENT ON COLUMN serve.experiment_decision.id IS 'Decision number, in order.';
COMMENT ON COLUMN serve.experiment_decision.route IS 'The route decided on.';
COMMENT ON COLUMN serve.experiment_decision.tenant_id IS 'The route''s tenant.';
COMMENT ON COLUMN serve.experiment_decision.experiment IS
  'Experiment name of the traffic read (serve.route.experiment, or the route name).';
COMMENT ON COLUMN serve.experiment_decision.canary_id IS
  'The canary decided on; for a watch decision (code watch_* or rollback_refused), the new prod.';
COMMENT ON COLUMN serve.experiment_decision.control_id IS
  'What it was compared with: the control arm (the prod, or the base model of a route without '
  'one), or for a watch the prod it replaced; NULL: none.';
COMMENT ON COLUMN serve.experiment_decision.metric IS
  'The policy''s primary metric when it decided.';
COMMENT ON COLUMN serve.experiment_decision.reason IS
  'The decision in words, with the numbers behind it.';
COMMENT ON COLUMN serve.experiment_decision.decided_by IS
  'The SQL role that recorded it (the one running serve.experiment_autopolicy).';
COMMENT ON COLUMN serve.experiment_decision.decided_at IS 'When (the clock time).';

COMMENT ON COLUMN train.training_run.id IS 'The run''s id.';
COMMENT ON COLUMN train.training_run.tenant_id IS 'The tenant it trains for.';
COMMENT ON COLUMN train.training_run.route IS 'The route its adapter is for.';
COMMENT ON COLUMN train.training_run.method IS
  'sft, dpo, kto, orpo or simpo (its snapshot''s examples fit the method).';
COMMENT ON COLUMN train.training_run.base_model IS
  'The base model it trains on (the request''s, else CFT_BASE_MODEL; '
  'the loop''s runs: the route''s).';
COMMENT ON COLUMN train.training_run.params IS
  'The hyperparameters the request set (app.training.methods.Hyperparameters keys; '
  'the others take their defaults).';
COMMENT ON COLUMN train.training_run.snapshot_id IS
  'The frozen dataset it trains on (train.dataset_snapshot.id).';
COMMENT ON COLUMN train.training_run.status IS
  'queued, running (a worker holds its lease), succeeded, failed or cancelled.';
COMMENT ON COLUMN train.training_run.priority IS
  'Higher is claimed first (-1000..1000, default 0); then runs needing '
  'more devices, then the oldest.';
COMMENT ON COLUMN train.training_run.worker_id IS
  'The trainer worker that holds it, or held it last; NULL until claimed, '
  'and once a retry queues it again.';
COMMENT ON COLUMN train.training_run.lease_until IS
  'End of that worker''s lease, renewed by its heartbeats; past it the run is claimed '
  'again, or failed after max_attempts.';
COMMENT ON COLUMN train.training_run.attempts IS
  'Claims so far (a claim after an expired lease counts).';
COMMENT ON COLUMN train.training_run.max_attempts IS
  'Claims allowed (default 3): an expired run that has used them fails.';
COMMENT ON COLUMN train.training_run.cancel_requested IS
  'Asked to stop: a queued run is cancelled at once, a running one when its '
  'worker sees it or its lease expires.';
COMMENT ON COLUMN train.training_run.progress IS
  'Live progress from the worker (step, total, loss, eta_s, tokens_per_s, loss_history, '
  'updated_at); when it succeeds, also the metrics.';
COMMENT ON COLUMN train.training_run.error IS
  'Why the last attempt failed, was claimed again or was cancelled; NULL once it succeeded.';
COMMENT ON COLUMN train.training_run.adapter_id IS
  'The candidate adapter it registered (serve.adapter.id), once succeeded.';
COMMENT ON COLUMN train.training_run.created_by IS
  'Who queued it: key:<prefix> (API), cli, or loop cycle N.';
COMMENT ON COLUMN train.training_run.created_at IS 'When it was queued.';
COMMENT ON COLUMN train.training_run.started_at IS 'When it was first claimed.';
COMMENT ON COLUMN train.training_run.finished_at IS 'When it succeeded, failed or was cancelled.';
COMMENT ON COLUMN train.training_run.updated_at IS 'Last change of the row.';

COMMENT ON COLUMN train.training_worker.worker_id IS
  'The worker''s id, as it claims runs (training_run.worker_id).';
COMMENT ON COLUMN train.training_worker.host IS 'Host the worker runs on.';
COMMENT ON COLUMN train.training_worker.devices IS
  'Its devices: CUDA indices (0,1) or cpu slots (cpu+cpu).';
COMMENT ON COLUMN train.training_worker.gpus IS
  'How many devices it holds: it claims runs that need at most this many.';
COMMENT ON COLUMN train.training_worker.gpu_memory_gb IS
  'Memory of its smallest GPU in GiB (as torch reports it, or --gpu-memory-gb); NULL: no GPU.';
COMMENT ON COLUMN train.training_worker.device_kind IS 'cuda or cpu; NULL: unknown.';
COMMENT ON COLUMN train.training_worker.seen_at IS 'When it last asked for a run.';
COMMENT ON COLUMN train.training_worker.alive_until IS
  'Live until then (its last ask plus one lease); a worker holding a run '
  'with a live lease is live too.';

COMMENT ON COLUMN train.dataset_snapshot.id IS
  'The snapshot''s id, as training runs and adapters name it.';
COMMENT ON COLUMN train.dataset_snapshot.tenant_id IS 'The tenant whose traffic it holds.';
COMMENT ON COLUMN train.dataset_snapshot.route IS 'The route whose traffic it holds.';
COMMENT ON COLUMN train.dataset_snapshot.method IS
  'The method its examples are for: its candidate view (sft: edits; kto: thumbs; dpo, '
  'orpo, simpo: preference pairs).';
COMMENT ON COLUMN train.dataset_snapshot.query_sql IS
  'The exact candidate query that produced its rows (params.write: the '
  'statement that wrote the examples).';
COMMENT ON COLUMN train.dataset_snapshot.params IS
  'Its inputs and rules: window (since, until), view, dedup threshold and neighbours, eval_pct, '
  'each step''s rule as text, step_ms.';
COMMENT ON COLUMN train.dataset_snapshot.counts IS
  'Rows left after each step (view_rows, in_window, live_ok, exact_dedup, '
  'semantic_dedup) and the dedup''s own counts.';
COMMENT ON COLUMN train.dataset_snapshot.n_train IS 'Examples in the train split.';
COMMENT ON COLUMN train.dataset_snapshot.n_eval IS
  'Examples in the eval split (held out: the evaluator''s held-out metrics).';
COMMENT ON COLUMN train.dataset_snapshot.set_hash IS
  'Hex sha256 over its sorted example hashes; set when the snapshot is sealed (NULL: a draft).';
COMMENT ON COLUMN train.dataset_snapshot.created_by IS
  'Who took it: api-key:<prefix>, cli, loop cycle N, or the SQL session user.';
COMMENT ON COLUMN train.dataset_snapshot.created_at IS 'When it was taken.';
COMMENT ON COLUMN train.dataset_snapshot.tainted_at IS
  'When a user whose rows it holds was forgotten (the one change a sealed '
  'snapshot admits); NULL: clean.';
COMMENT ON COLUMN train.dataset_snapshot.tainted_reason IS
  'Why it is tainted (the forget request that tainted it).';

COMMENT ON COLUMN train.dataset_example.snapshot_id IS
  'The snapshot it belongs to (train.dataset_snapshot.id, kept by trigger).';
COMMENT ON COLUMN train.dataset_example.example_hash IS
  'sha256 of the example''s canonical jsonb text (train.example_hash): '
  'its identity and split bucket.';
COMMENT ON COLUMN train.dataset_example.split IS
  'train or eval: eval when the hash''s bucket (train.split_bucket) is '
  'below the snapshot''s eval_pct.';
COMMENT ON COLUMN train.dataset_example.log_ids IS
  'ids of the obs.inference_log rows it was built from (one, or a '
  'pair''s rejected and chosen rows).';
COMMENT ON COLUMN train.dataset_example.example IS
  'The frozen example in TRL''s format for the snapshot''s method.';

COMMENT ON COLUMN train.eval_result.adapter_id IS 'The adapter scored.';
COMMENT ON COLUMN train.eval_result.suite_id IS
  'What it was scored on: a suite''s id (train.eval_suite), or heldout:<snapshot '
  'id> for a snapshot''s eval split.';
COMMENT ON COLUMN train.eval_result.metric IS
  'The metric, e.g. pass_rate (task suite), judge_score (judge suite, 0-10), loss, perplexity, '
  'preference_accuracy (held out).';
COMMENT ON COLUMN train.eval_result.score IS
  'The value, in the metric''s unit; NULL or NaN: the evaluation failed (the gate refuses it).';
COMMENT ON COLUMN train.eval_result.judge_model IS
  'The judge model that scored it; NULL: computed, not judged.';
COMMENT ON COLUMN train.eval_result.judged_at IS 'When it was scored (last written).';
COMMENT ON COLUMN train.eval_result.author_kind IS
  'How the database knew the author: evaluator (the worker), key (an '
  'API key) or sql (the SQL role).';
COMMENT ON COLUMN train.eval_result.author_key_id IS
  'The API key that wrote it (auth.api_key.id) when author_kind is key.';
COMMENT ON COLUMN train.eval_result.author IS
  'Who wrote it, for people: evaluator <id>, key <id> (<prefix>, role <role>) or sql role <role>.';
COMMENT ON COLUMN train.eval_result.rubric_version IS
  'A judge-scored result: the version of the rubric the judge applied (the '
  'evaluator''s: 12 hex of its sha256).';

COMMENT ON COLUMN train.promotion_policy.id IS 'The rule''s number.';
COMMENT ON COLUMN train.promotion_policy.route IS
  'The route the rule is for; NULL: every route (a route''s own rule overrides it '
  'for the same suite and metric).';
COMMENT ON COLUMN train.promotion_policy.suite_id IS
  'The suite compared (eval_result.suite_id); heldout:snapshot: the eval split of '
  'the candidate''s own snapshot.';
COMMENT ON COLUMN train.promotion_policy.metric IS 'The metric compared (eval_result.metric).';
COMMENT ON COLUMN train.promotion_policy.direction IS
  'Which way is better: higher or lower; ignore: not compared.';
COMMENT ON COLUMN train.promotion_policy.tolerance IS
  'Regression allowed, relative to |current score| (default 0.02: 2 %).';
COMMENT ON COLUMN train.promotion_policy.required IS
  'The candidate needs a finite result from a trusted author on it; false: compared when '
  'present, required for nothing.';
COMMENT ON COLUMN train.promotion_policy.created_at IS 'When the rule was written.';
COMMENT ON COLUMN train.promotion_policy.trusted_authors IS
  'The author_role values whose results satisfy the rule (default evaluator, release, owner).';
COMMENT ON COLUMN train.promotion_policy.min_judge_kappa IS
  'A judge-scored result counts only from a judge whose latest calibration on the suite has at '
  'least this Cohen''s kappa (default 0.6).';

COMMENT ON COLUMN train.eval_suite.id IS
  'The suite''s id (eval_result.suite_id); no '':'', so it never '
  'collides with heldout:<snapshot id>.';
COMMENT ON COLUMN train.eval_suite.tenant_id IS 'The tenant that owns it.';
COMMENT ON COLUMN train.eval_suite.route IS 'The route it scores; NULL: every route of the tenant.';
COMMENT ON COLUMN train.eval_suite.name IS 'A name for people (default: the id).';
COMMENT ON COLUMN train.eval_suite.kind IS
  'task: each answer is checked, the score is the pass rate; judge: a judge model scores '
  'each answer 0-10 by the rubric.';
COMMENT ON COLUMN train.eval_suite.rubric IS
  'Kind judge: what the judge scores (0-10); NULL: the configured default (CFT_EVAL_JUDGE_RUBRIC).';
COMMENT ON COLUMN train.eval_suite.created_at IS 'When the suite was created.';

COMMENT ON COLUMN train.eval_case.id IS 'The case''s number (cases run in this order).';
COMMENT ON COLUMN train.eval_case.suite_id IS 'The suite it belongs to.';
COMMENT ON COLUMN train.eval_case.messages IS
  'The conversation the adapter answers (OpenAI chat messages).';
COMMENT ON COLUMN train.eval_case.check_kind IS
  'How a task suite checks the answer: exact, contains, regex, json_schema or max_length '
  '(a judge suite does not check).';
COMMENT ON COLUMN train.eval_case.expected IS
  'What the check compares with: the text, a string or list of strings (all contained, any case), '
  'a pattern, a JSON Schema, or a length in characters.';
COMMENT ON COLUMN train.eval_case.max_tokens IS
  'Most tokens the answer may have (1-4096, default 32).';

COMMENT ON COLUMN train.eval_request.id IS 'The request''s number (claimed in this order).';
COMMENT ON COLUMN train.eval_request.tenant_id IS 'The adapter''s tenant.';
COMMENT ON COLUMN train.eval_request.adapter_id IS 'The adapter to evaluate.';
COMMENT ON COLUMN train.eval_request.status IS
  'queued, running (an evaluator holds its lease), done or failed.';
COMMENT ON COLUMN train.eval_request.requested_by IS
  'Who asked: key:<prefix> (API), or "evaluator: new candidate" for a candidate never evaluated.';
COMMENT ON COLUMN train.eval_request.worker_id IS 'The evaluator worker that claimed it last.';
COMMENT ON COLUMN train.eval_request.lease_until IS
  'End of that worker''s lease; past it the request is claimed again (failed after 3 attempts).';
COMMENT ON COLUMN train.eval_request.attempts IS 'Claims so far.';
COMMENT ON COLUMN train.eval_request.error IS 'Why the last attempt failed; NULL once done.';
COMMENT ON COLUMN train.eval_request.created_at IS 'When it was asked for.';
COMMENT ON COLUMN train.eval_request.started_at IS 'When it was first claimed.';
COMMENT ON COLUMN train.eval_request.finished_at IS 'When it ended, done or failed.';

COMMENT ON COLUMN train.judge_calibration.id IS 'The calibration''s number.';
COMMENT ON COLUMN train.judge_calibration.suite_id IS
  'The judge suite whose calibration set was judged.';
COMMENT ON COLUMN train.judge_calibration.judge_model IS 'The judge model.';
COMMENT ON COLUMN train.judge_calibration.rubric_version IS
  'Version of the rubric it judged by (12 hex of its sha256): an edited rubric '
  'needs a calibration of its own.';
COMMENT ON COLUMN train.judge_calibration.threshold IS
  'A judge score at or above it reads as acceptable (default 5, of 0-10).';
COMMENT ON COLUMN train.judge_calibration.n IS 'Calibration cases judged.';
COMMENT ON COLUMN train.judge_calibration.accuracy IS
  'Share of cases where the judge agrees with people.';
COMMENT ON COLUMN train.judge_calibration.kappa IS
  'Cohen''s kappa of the judge against people; NULL when chance agreement is 1. The gate '
  'compares it with min_judge_kappa.';
COMMENT ON COLUMN train.judge_calibration.bias IS 'Judge positive rate minus human positive rate.';
COMMENT ON COLUMN train.judge_calibration.judge_positive_rate IS
  'Share of cases the judge read as acceptable.';
COMMENT ON COLUMN train.judge_calibration.human_positive_rate IS
  'Share of cases people labelled acceptable.';
COMMENT ON COLUMN train.judge_calibration.author_role IS
  'Who ran it, as trusted_authors names authors (train.current_author).';
COMMENT ON COLUMN train.judge_calibration.author IS
  'Who ran it, for people (train.current_author).';
COMMENT ON COLUMN train.judge_calibration.calibrated_at IS 'When it ran.';

COMMENT ON COLUMN train.judge_verdict.calibration_id IS
  'The calibration run (train.judge_calibration.id).';
COMMENT ON COLUMN train.judge_verdict.case_id IS
  'The calibration case judged (train.eval_calibration_case.id).';
COMMENT ON COLUMN train.judge_verdict.judge_score IS
  'The judge''s score, 0-10; NULL: its reply held no score (read as not acceptable).';
COMMENT ON COLUMN train.judge_verdict.judge_reply IS 'The judge''s reply as it came.';
COMMENT ON COLUMN train.judge_verdict.judge_label IS
  'The judge''s verdict (true: acceptable): judge_score at or above the calibration''s threshold.';
COMMENT ON COLUMN train.judge_verdict.human_label IS
  'People''s label of the case when it was judged (true: acceptable).';

COMMENT ON COLUMN auth.forget_request.id IS
  'The request''s number; the taint reasons of snapshots and adapters name it.';
COMMENT ON COLUMN auth.forget_request.tenant_id IS 'The tenant the user belonged to.';
COMMENT ON COLUMN auth.forget_request.user_hash IS
  'The forgotten user''s pseudonym: HMAC-SHA256 of the user id, as in obs.inference_log.';
COMMENT ON COLUMN auth.forget_request.logs_deleted IS 'obs.inference_log rows deleted.';
COMMENT ON COLUMN auth.forget_request.request_keys_deleted IS 'obs.request_key rows deleted.';
COMMENT ON COLUMN auth.forget_request.snapshots_tainted IS
  'Snapshots holding an example built from those rows, marked tainted.';
COMMENT ON COLUMN auth.forget_request.adapters_tainted IS
  'Adapters trained on such a snapshot, marked tainted (not retired: a release manager decides).';
COMMENT ON COLUMN auth.forget_request.created_at IS 'When the user was forgotten.';

COMMENT ON COLUMN auth.tenant_offboarding.id IS 'The offboarding''s number.';
COMMENT ON COLUMN auth.tenant_offboarding.tenant_id IS
  'The tenant''s id (no foreign key: the row outlives the tenant).';
COMMENT ON COLUMN auth.tenant_offboarding.tenant_name IS
  'The tenant''s name when it was offboarded.';
COMMENT ON COLUMN auth.tenant_offboarding.requested_by IS
  'Who asked: operator key <prefix> (REST), cli <user>, or the SQL session user.';
COMMENT ON COLUMN auth.tenant_offboarding.status IS
  'unloading (step 1 done, rows not deleted yet), artefacts (rows '
  'deleted, artefacts pending) or done.';
COMMENT ON COLUMN auth.tenant_offboarding.retired_adapters IS
  'The canary and prod adapters step 1 retired.';
COMMENT ON COLUMN auth.tenant_offboarding.forced IS
  'Step 2 was forced: it ran whether or not an engine still had an adapter of the tenant loaded.';
COMMENT ON COLUMN auth.tenant_offboarding.counts IS 'Rows deleted per table (schema.table: count).';
COMMENT ON COLUMN auth.tenant_offboarding.artefacts_pending IS
  'Artefact URIs (weights_uri) still to delete from the store.';
COMMENT ON COLUMN auth.tenant_offboarding.artefacts_deleted IS
  'Artefact URIs deleted and ticked off (auth.offboard_artefact_deleted).';
COMMENT ON COLUMN auth.tenant_offboarding.started_at IS 'When step 1 first ran.';
COMMENT ON COLUMN auth.tenant_offboarding.data_deleted_at IS
  'When step 2 deleted the tenant''s rows and the tenant.';
COMMENT ON COLUMN auth.tenant_offboarding.finished_at IS
  'When no artefact was left pending (status done).';

COMMENT ON COLUMN obs.prompt_neighbour_scan.log_id IS 'id of the embedded obs.inference_log row.';
COMMENT ON COLUMN obs.prompt_neighbour_scan.created_at IS
  'created_at of that row (with log_id, its primary key).';
COMMENT ON COLUMN obs.prompt_neighbour_scan.tenant_id IS 'The log row''s tenant.';
COMMENT ON COLUMN obs.prompt_neighbour_scan.route IS
  'The log row''s route: neighbours are searched within it.';
COMMENT ON COLUMN obs.prompt_neighbour_scan.radius IS
  'The cosine distance the search used; NULL: not searched (a candidate then waits in the queue).';
COMMENT ON COLUMN obs.prompt_neighbour_scan.max_neighbours IS
  'k of that search: at most this many neighbours were kept.';
COMMENT ON COLUMN obs.prompt_neighbour_scan.prompt_hash IS
  'train.prompt_hash(messages), set with radius, so a snapshot need not compute it.';
COMMENT ON COLUMN obs.prompt_neighbour_scan.scanned_at IS 'When it was searched.';
COMMENT ON COLUMN obs.prompt_neighbour_scan.candidate IS
  'The row has a signal a dataset uses (obs.is_dataset_prompt): only '
  'candidates are searched and indexed.';

COMMENT ON COLUMN obs.prompt_embedding.log_id IS 'id of the candidate obs.inference_log row.';
COMMENT ON COLUMN obs.prompt_embedding.created_at IS
  'created_at of that row (with log_id, its primary key).';
COMMENT ON COLUMN obs.prompt_embedding.tenant_id IS
  'The log row''s tenant: the search stays within it.';
COMMENT ON COLUMN obs.prompt_embedding.route IS 'The log row''s route: the search stays within it.';
COMMENT ON COLUMN obs.prompt_embedding.embedding IS
  'The prompt''s embedding, copied from obs.inference_log.embedding.';

COMMENT ON COLUMN obs.prompt_neighbour.tenant_id IS 'The tenant of both rows.';
COMMENT ON COLUMN obs.prompt_neighbour.route IS 'The route of both rows.';
COMMENT ON COLUMN obs.prompt_neighbour.a_id IS
  'id of the older log row: (a_created_at, a_id) < (b_created_at, b_id).';
COMMENT ON COLUMN obs.prompt_neighbour.a_created_at IS 'created_at of the older row.';
COMMENT ON COLUMN obs.prompt_neighbour.b_id IS 'id of the newer log row.';
COMMENT ON COLUMN obs.prompt_neighbour.b_created_at IS 'created_at of the newer row.';
COMMENT ON COLUMN obs.prompt_neighbour.distance IS 'Cosine distance of the two prompt embeddings.';

COMMENT ON COLUMN obs.experiment.tenant_id IS 'The tenant whose traffic it is.';
COMMENT ON COLUMN obs.experiment.route IS
  'The route logged (the first by name if several carry the experiment).';
COMMENT ON COLUMN obs.experiment.adapters IS 'Adapters that served its arms.';
COMMENT ON COLUMN obs.experiment.first_at IS 'When its first row was logged.';
COMMENT ON COLUMN obs.experiment.last_at IS 'When its last row was logged.';

COMMENT ON COLUMN loop.control.id IS 'Always true: the key of the one row.';
COMMENT ON COLUMN loop.control.paused IS
  'The kill switch: true stops every loop cycle from starting (cycles in flight finish).';
COMMENT ON COLUMN loop.control.reason IS 'Why the loop was stopped (stopping needs one).';
COMMENT ON COLUMN loop.control.changed_by IS
  'Who changed the switch last: key <prefix> (API), cli, or the SQL session user.';
COMMENT ON COLUMN loop.control.changed_at IS 'When the switch was changed last.';
COMMENT ON COLUMN loop.control.max_concurrent_training IS
  'Platform cap: training runs queued or running, plus loop cycles '
  'about to queue one, of all tenants.';

COMMENT ON COLUMN loop.policy.route IS 'The route whose loop this is.';
COMMENT ON COLUMN loop.policy.tenant_id IS 'The route''s tenant.';
COMMENT ON COLUMN loop.policy.paused_reason IS 'Why the route is paused (loop.limits shows it).';
COMMENT ON COLUMN loop.policy.decline_enabled IS
  'Decline trigger on: a cycle when the prod''s thumbs-up rate falls significantly '
  'below its rate after promotion.';
COMMENT ON COLUMN loop.policy.decline_window IS
  'Decline trigger: length of the two windows compared (the first '
  'after promotion, and the latest).';
COMMENT ON COLUMN loop.policy.decline_min_n IS 'Decline trigger: rated rows each window needs.';
COMMENT ON COLUMN loop.policy.drift_enabled IS
  'Drift trigger on: a cycle when recent prompts lie far from the prod''s training prompts.';
COMMENT ON COLUMN loop.policy.drift_sample IS
  'Drift trigger: the route''s latest embedded prompts compared.';
COMMENT ON COLUMN loop.policy.drift_min_n IS
  'Drift trigger: recent embedded prompts needed before it may fire.';
COMMENT ON COLUMN loop.policy.max_cycles_per_day IS
  'Limit: cycles started for the route in the last 24 h.';
COMMENT ON COLUMN loop.policy.max_concurrent_training IS
  'Limit: the tenant''s training runs queued or running, plus its cycles about to queue one.';
COMMENT ON COLUMN loop.policy.cooldown_after_reject IS
  'Limit: no new cycle this long after a rejected or rolled-back one (a forget cycle is not held).';
COMMENT ON COLUMN loop.policy.canary_max_users IS
  'Canary budget: distinct users of the canary; when reached undecided, one final look decides.';
COMMENT ON COLUMN loop.policy.canary_max_duration IS
  'Canary budget: time since the canary opened; when reached undecided, one final look decides.';
COMMENT ON COLUMN loop.policy.decision_metric IS
  'The metric the canary is judged on (the always-valid test of serve.canary_decision).';
COMMENT ON COLUMN loop.policy.decision_alpha IS
  'Error bound of the canary decision, and of the watch against the previous prod.';
COMMENT ON COLUMN loop.policy.decision_min_n IS
  'Sample floor: no canary decision before both arms have this many (in the metric''s unit).';
COMMENT ON COLUMN loop.policy.watch_window IS
  'How long a new prod is watched after its promotion (0: no watch).';
COMMENT ON COLUMN loop.policy.watch_alpha IS
  'Level of the watch''s test when there is no previous prod '
  '(loop.watch_verdict, against the base''s traffic).';
COMMENT ON COLUMN loop.policy.watch_min_n IS
  'Rows each side of that test needs (rated rows for the thumbs-down rate).';
COMMENT ON COLUMN loop.policy.eval_timeout IS
  'How long a cycle waits for the evaluator''s results before it fails.';
COMMENT ON COLUMN loop.policy.created_at IS
  'When the row was written first; the schedule trigger counts from it before any cycle.';
COMMENT ON COLUMN loop.policy.updated_at IS 'Last change of the row (kept by trigger).';
COMMENT ON COLUMN loop.policy.updated_by IS
  'Who wrote it last through the API (key <prefix>) or the CLI (cli).';

COMMENT ON COLUMN loop.cycle.id IS 'The cycle''s number (cycle N in audit reasons and actors).';
COMMENT ON COLUMN loop.cycle.tenant_id IS 'The route''s tenant.';
COMMENT ON COLUMN loop.cycle.route IS 'The route it runs on.';
COMMENT ON COLUMN loop.cycle.state IS
  'Its step: triggered, snapshot, training, evaluating, canary, deciding, watching; finished: '
  'promoted, rejected, rolled_back, failed.';
COMMENT ON COLUMN loop.cycle.trigger IS
  'What started it: forget, decline, drift, volume or schedule (the first that fired; or manual).';
COMMENT ON COLUMN loop.cycle.trigger_values IS
  'Every trigger and limit when it started (loop.triggers, loop.limits), and '
  'the line of the one that fired.';
COMMENT ON COLUMN loop.cycle.policy IS
  'The loop policy when it started, for the record (steps read the route''s policy now).';
COMMENT ON COLUMN loop.cycle.signal_counts IS
  'The usable examples per signal the method rule read: new since '
  'the previous cycle, and in total.';
COMMENT ON COLUMN loop.cycle.method IS 'The method chosen: sft, dpo, kto, orpo or simpo.';
COMMENT ON COLUMN loop.cycle.method_reason IS 'Why that method (app/loop/method.py).';
COMMENT ON COLUMN loop.cycle.hyperparameters IS
  'The hyperparameters enqueued: scaled to the snapshot''s size, then the policy''s overrides.';
COMMENT ON COLUMN loop.cycle.snapshot_id IS 'The snapshot it froze (train.dataset_snapshot.id).';
COMMENT ON COLUMN loop.cycle.snapshot_counts IS
  'That snapshot''s counts (rows left after each step).';
COMMENT ON COLUMN loop.cycle.n_train IS 'That snapshot''s training examples.';
COMMENT ON COLUMN loop.cycle.n_eval IS 'That snapshot''s eval examples.';
COMMENT ON COLUMN loop.cycle.training_run_id IS
  'The training run it queued (train.training_run.id), stored at once so a '
  'resumed step does not queue another.';
COMMENT ON COLUMN loop.cycle.adapter_id IS 'The candidate adapter the run registered.';
COMMENT ON COLUMN loop.cycle.current_prod_id IS
  'The prod the candidate competes with (when the method was chosen, then when '
  'the gate was asked); NULL: none.';
COMMENT ON COLUMN loop.cycle.eval_scores IS
  'The candidate''s eval results when the gate was asked: {suite/metric: score}.';
COMMENT ON COLUMN loop.cycle.blockers IS
  'The gate''s blockers then (serve.promotion_blockers rows); empty: it holds.';
COMMENT ON COLUMN loop.cycle.canary_pct IS
  'The canary''s share of users as opened, in %: the policy''s, less if the '
  'route''s ceiling had less room.';
COMMENT ON COLUMN loop.cycle.canary_started_at IS
  'When the canary opened: its budget and the final look count from then.';
COMMENT ON COLUMN loop.cycle.experiment IS
  'The numbers the canary decision read (always-valid test, budget, '
  'canary users, fixed-horizon look).';
COMMENT ON COLUMN loop.cycle.decision IS
  'promote (through the gate), retire (the canary lost), reject (refused by the gate or the '
  'canary) or rollback (the watch).';
COMMENT ON COLUMN loop.cycle.decision_code IS
  'Why, as a code: the decision rule''s (e.g. significantly_better, guard_regen, '
  'budget_non_inferior), or gate, gate_refused, canary_refused, forget.';
COMMENT ON COLUMN loop.cycle.decision_reason IS
  'The decision in words, with the numbers behind it.';
COMMENT ON COLUMN loop.cycle.previous_prod_id IS
  'The prod the promotion replaced (serve.adapter.previous_prod_id): what a rollback restores.';
COMMENT ON COLUMN loop.cycle.promoted_at IS 'When the candidate became prod.';
COMMENT ON COLUMN loop.cycle.watch_until IS 'End of the watch: promoted_at + watch_window.';
COMMENT ON COLUMN loop.cycle.watch IS
  'The guard numbers of the watch (serve.watch_decision, or loop.watch_verdict).';
COMMENT ON COLUMN loop.cycle.forget_request_id IS
  'A forget cycle: the auth.forget_request that tainted the prod '
  '(forget_to_live_s counts from it).';
COMMENT ON COLUMN loop.cycle.error IS
  'Why it failed, or what went wrong in the last attempt (a failed step, a stopped worker).';
COMMENT ON COLUMN loop.cycle.waiting_for IS
  'What the current step waits for (a training slot, the trainer, the evaluator, '
  'canary traffic); NULL: not waiting.';
COMMENT ON COLUMN loop.cycle.worker_id IS 'The loop worker that holds it now; NULL between steps.';
COMMENT ON COLUMN loop.cycle.lease_until IS
  'End of that worker''s lease; past it another worker resumes the cycle (attempts + 1).';
COMMENT ON COLUMN loop.cycle.attempts IS 'Failed steps and stopped workers so far.';
COMMENT ON COLUMN loop.cycle.max_attempts IS
  'Attempts allowed (default 5): then the cycle fails with the reason.';
COMMENT ON COLUMN loop.cycle.next_step_at IS
  'When its step is due: a waiting or failed step is tried again from then.';
COMMENT ON COLUMN loop.cycle.state_entered_at IS
  'When it entered its state (eval_timeout counts from it).';
COMMENT ON COLUMN loop.cycle.created_at IS
  'When it started (max_cycles_per_day and min_interval count these).';
COMMENT ON COLUMN loop.cycle.updated_at IS 'Last change of the row.';
COMMENT ON COLUMN loop.cycle.finished_at IS
  'When it reached promoted, rejected, rolled_back or failed.';

COMMENT ON COLUMN loop.cycle_event.id IS 'Event number, in order.';
COMMENT ON COLUMN loop.cycle_event.cycle_id IS 'The cycle (loop.cycle.id).';
COMMENT ON COLUMN loop.cycle_event.tenant_id IS 'The cycle''s tenant.';
COMMENT ON COLUMN loop.cycle_event.from_state IS 'State before; NULL when the cycle started.';
COMMENT ON COLUMN loop.cycle_event.to_state IS
  'State after (the same as from_state for a retried or resumed step).';
COMMENT ON COLUMN loop.cycle_event.worker_id IS
  'The loop worker that made the transition; NULL when the cycle started.';
COMMENT ON COLUMN loop.cycle_event.inputs IS
  'What it was decided on: the step''s results, or every trigger and limit when the cycle started.';
COMMENT ON COLUMN loop.cycle_event.note IS
  'A line for people: why (the step''s note, or the error).';
COMMENT ON COLUMN loop.cycle_event.at IS 'When (the clock time).';

COMMENT ON COLUMN obs.inference_log_partition.name IS
  'The partition''s table in schema obs: inference_log_<ISO year>w<ISO week>.';
COMMENT ON COLUMN obs.inference_log_partition.from_at IS
  'Start of its week, Monday 00:00 UTC (inclusive bound).';
COMMENT ON COLUMN obs.inference_log_partition.to_at IS
  'End of its week (exclusive bound): obs.drop_partitions '
  'drops it once this is past the retention cutoff.';

COMMENT ON COLUMN train.training_run_wait.id IS 'The queued run (train.training_run.id).';
COMMENT ON COLUMN train.training_run_wait.tenant_id IS 'The tenant it trains for.';
COMMENT ON COLUMN train.training_run_wait.route IS 'The route its adapter is for.';
COMMENT ON COLUMN train.training_run_wait.method IS 'sft, dpo, kto, orpo or simpo.';
COMMENT ON COLUMN train.training_run_wait.priority IS 'Its priority: higher is claimed first.';
COMMENT ON COLUMN train.training_run_wait.gpus IS 'Devices it needs in one worker.';
COMMENT ON COLUMN train.training_run_wait.min_gpu_memory_gb IS
  'Least memory it needs on each GPU, in GiB; NULL: any.';
COMMENT ON COLUMN train.training_run_wait.device_kind IS
  'cuda or cpu, the kind of device it needs; NULL: any.';
COMMENT ON COLUMN train.training_run_wait.created_at IS 'When it was queued.';
COMMENT ON COLUMN train.training_run_wait.waiting_for IS
  'How long it has been queued (now() - created_at).';
COMMENT ON COLUMN train.training_run_wait.able_workers IS
  'Live trainer workers that meet all its needs (devices, memory per GPU, kind).';
COMMENT ON COLUMN train.training_run_wait.able_workers_busy IS
  'Of those, the ones holding a run with a live lease.';
COMMENT ON COLUMN train.training_run_wait.reason IS
  'Why it waits, in words: no live worker, which need no live worker '
  'meets, every able worker busy, or claimable (idle able workers).';

COMMENT ON COLUMN obs.arm_sample.adapter_id IS 'The adapter whose rows were sampled.';
COMMENT ON COLUMN obs.arm_sample.since IS 'Start of the window (inclusive).';
COMMENT ON COLUMN obs.arm_sample.until IS 'End of the window (exclusive).';
COMMENT ON COLUMN obs.arm_sample.first_at IS
  'When the sample''s first row was logged; NULL: no rows.';
COMMENT ON COLUMN obs.arm_sample.last_at IS
  'When the sample''s last row was logged; NULL: no rows.';
COMMENT ON COLUMN obs.arm_sample.n IS 'Rows in the sample.';
COMMENT ON COLUMN obs.arm_sample.n_feedback IS
  'Rows with explicit feedback (fb_explicit not NULL).';
COMMENT ON COLUMN obs.arm_sample.feedback_mean IS 'Mean fb_explicit over those rows (-1..1).';
COMMENT ON COLUMN obs.arm_sample.feedback_var IS 'Sample variance of fb_explicit over those rows.';
COMMENT ON COLUMN obs.arm_sample.n_thumbs_up IS 'Rows rated 1 (thumbs up).';
COMMENT ON COLUMN obs.arm_sample.n_thumbs_down IS 'Rows rated -1 (thumbs down).';
COMMENT ON COLUMN obs.arm_sample.n_regen IS 'Rows the user regenerated (fb_regen).';
COMMENT ON COLUMN obs.arm_sample.n_edited IS 'Rows the user corrected (fb_edited).';
COMMENT ON COLUMN obs.arm_sample.n_bad IS 'Rows with status error or partial.';
COMMENT ON COLUMN obs.arm_sample.n_tokens IS
  'Rows with a completion token count (tokens_out not NULL).';
COMMENT ON COLUMN obs.arm_sample.tokens_out_avg IS 'Mean completion tokens over those rows.';
COMMENT ON COLUMN obs.arm_sample.tokens_out_var IS
  'Sample variance of completion tokens over those rows.';
COMMENT ON COLUMN obs.arm_sample.n_ttft IS 'Rows with a time to first token (ttft_ms not NULL).';
COMMENT ON COLUMN obs.arm_sample.ttft_p95 IS
  '95th percentile of the time to first token, in ms (percentile_cont).';
COMMENT ON COLUMN obs.arm_sample.ttft_threshold IS
  'The time to first token the sample counts rows above, '
  'in ms (the sampler''s p_ttft_threshold); NULL: none.';
COMMENT ON COLUMN obs.arm_sample.n_ttft_over IS
  'Rows slower than ttft_threshold (0 when it is NULL).';

COMMENT ON COLUMN obs.experiment_arm_7d.experiment IS 'The experiment (obs.experiment.experiment).';
COMMENT ON COLUMN obs.experiment_arm_7d.variant IS
  'The arm''s variant: A = prod (the control), B.. = canaries.';
COMMENT ON COLUMN obs.experiment_arm_7d.adapter_id IS
  'The adapter that served the arm (an arm is variant × adapter).';
COMMENT ON COLUMN obs.experiment_arm_7d.route IS
  'The route logged (the first by name if the arm''s rows carry several).';
COMMENT ON COLUMN obs.experiment_arm_7d.n IS
  'The arm''s rows (logged inferences) in the last 7 days.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_error IS 'Rows with status error.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_feedback IS
  'Rows with explicit feedback (fb_explicit not NULL).';
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_mean IS
  'Mean fb_explicit over rated rows (-1..1).';
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_var IS
  'Sample variance of fb_explicit over rated rows.';
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_se IS
  'Standard error of feedback_mean: sqrt(feedback_var / n_feedback).';
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_ci_low IS
  'Low end of the 95 % interval of feedback_mean (Student''s t, n_feedback - 1 df).';
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_ci_high IS
  'High end of the 95 % interval of feedback_mean.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_thumbs_up IS 'Rows rated 1 (thumbs up).';
COMMENT ON COLUMN obs.experiment_arm_7d.n_thumbs_down IS 'Rows rated -1 (thumbs down).';
COMMENT ON COLUMN obs.experiment_arm_7d.thumbs_up_rate IS
  'n_thumbs_up / n_feedback (neutral ratings count as not up); NULL: none rated.';
COMMENT ON COLUMN obs.experiment_arm_7d.thumbs_up_ci_low IS
  'Low end of the 95 % Wilson interval of thumbs_up_rate.';
COMMENT ON COLUMN obs.experiment_arm_7d.thumbs_up_ci_high IS
  'High end of the 95 % Wilson interval of thumbs_up_rate.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_regen IS 'Rows the user regenerated (fb_regen).';
COMMENT ON COLUMN obs.experiment_arm_7d.regen_rate IS 'n_regen / n.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_edited IS 'Rows the user corrected (fb_edited).';
COMMENT ON COLUMN obs.experiment_arm_7d.edit_rate IS 'n_edited / n.';
COMMENT ON COLUMN obs.experiment_arm_7d.n_ttft IS
  'Rows with a time to first token (ttft_ms not NULL).';
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_avg IS 'Mean time to first token, in ms.';
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_var IS
  'Sample variance of the time to first token, in ms squared.';
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_p50 IS
  'Median time to first token, in ms (percentile_cont).';
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_p95 IS
  '95th percentile of the time to first token, in ms (percentile_cont).';
COMMENT ON COLUMN obs.experiment_arm_7d.tokens_out_avg IS
  'Mean completion tokens per row (of rows with a count).';
COMMENT ON COLUMN obs.experiment_arm_7d.tokens_out_sum IS
  'Completion tokens of all the arm''s rows.';
COMMENT ON COLUMN obs.experiment_arm_7d.first_at IS
  'When the arm''s first row in the window was logged.';
COMMENT ON COLUMN obs.experiment_arm_7d.last_at IS
  'When the arm''s last row in the window was logged.';

COMMENT ON COLUMN obs.experiment_compare_7d.experiment IS
  'The experiment (obs.experiment.experiment).';
COMMENT ON COLUMN obs.experiment_compare_7d.metric IS
  'What is compared: feedback_mean, thumbs_up_rate, regen_rate, edit_rate, ttft_avg or ttft_p95.';
COMMENT ON COLUMN obs.experiment_compare_7d.test IS
  'welch_t (feedback_mean, ttft_avg), two_proportion_z (the rates) or none (ttft_p95).';
COMMENT ON COLUMN obs.experiment_compare_7d.higher_is_better IS
  'True for feedback_mean and thumbs_up_rate; false for the regen, edit and ttft metrics.';
COMMENT ON COLUMN obs.experiment_compare_7d.control_variant IS 'The control arm''s variant (A).';
COMMENT ON COLUMN obs.experiment_compare_7d.control_adapter IS
  'The control arm''s adapter: of the A arms, the one with the most rows.';
COMMENT ON COLUMN obs.experiment_compare_7d.canary_variant IS 'The canary arm''s variant (B..).';
COMMENT ON COLUMN obs.experiment_compare_7d.canary_adapter IS 'The canary arm''s adapter.';
COMMENT ON COLUMN obs.experiment_compare_7d.n_control IS
  'The control''s observations of the metric: rated rows (feedback_mean, '
  'thumbs_up_rate), all rows (regen_rate, edit_rate) or rows with a ttft.';
COMMENT ON COLUMN obs.experiment_compare_7d.n_canary IS
  'The canary''s observations of the metric, counted as n_control.';
COMMENT ON COLUMN obs.experiment_compare_7d.control_value IS
  'The metric on the control arm (ttft metrics in ms).';
COMMENT ON COLUMN obs.experiment_compare_7d.canary_value IS
  'The metric on the canary arm (ttft metrics in ms).';
COMMENT ON COLUMN obs.experiment_compare_7d.diff IS 'canary_value - control_value.';
COMMENT ON COLUMN obs.experiment_compare_7d.diff_ci_low IS
  'Low end of the 95 % interval of diff; NULL: no test, or too few rows.';
COMMENT ON COLUMN obs.experiment_compare_7d.diff_ci_high IS
  'High end of the 95 % interval of diff; NULL: no test, or too few rows.';
COMMENT ON COLUMN obs.experiment_compare_7d.statistic IS
  'Welch''s t, or the pooled two-proportion z; NULL: no test, too few rows or zero standard error.';
COMMENT ON COLUMN obs.experiment_compare_7d.df IS
  'Welch-Satterthwaite degrees of freedom (welch_t only; NULL otherwise).';
COMMENT ON COLUMN obs.experiment_compare_7d.p_value IS
  'Two-sided p-value of the test; NULL: no test or no statistic.';
COMMENT ON COLUMN obs.experiment_compare_7d.alpha IS 'The significance level: 0.05.';
COMMENT ON COLUMN obs.experiment_compare_7d.significant IS
  'p_value < alpha (false when there is no p-value).';
COMMENT ON COLUMN obs.experiment_compare_7d.canary_better IS
  'diff goes the better way (per higher_is_better); NULL: diff 0 or unknown.';
COMMENT ON COLUMN obs.experiment_compare_7d.mde IS
  'The absolute effect the sample size is for: 0.1 for '
  'feedback_mean, 0.05 for the rates; NULL for the ttft metrics.';
COMMENT ON COLUMN obs.experiment_compare_7d.power IS 'The power the sample size is for: 0.8.';
COMMENT ON COLUMN obs.experiment_compare_7d.n_required_per_arm IS
  'Observations each arm needs to detect mde at alpha with that '
  'power; NULL: no mde, or no variance or rate to size from.';
COMMENT ON COLUMN obs.experiment_compare_7d.n_more_needed IS
  'n_required_per_arm minus the smaller of n_control and '
  'n_canary, at least 0 (0 also when n_required_per_arm is NULL).';

COMMENT ON COLUMN train.eval_calibration_case.id IS
  'The case''s number (train.judge_verdict.case_id); a calibration judges cases in this order.';
COMMENT ON COLUMN train.eval_calibration_case.suite_id IS
  'The judge suite whose calibration set it belongs to (train.eval_suite.id).';
COMMENT ON COLUMN train.eval_calibration_case.messages IS
  'The conversation that was answered (OpenAI chat messages).';
COMMENT ON COLUMN train.eval_calibration_case.answer IS
  'The answer people judged; the judge is shown the conversation and this answer.';
COMMENT ON COLUMN train.eval_calibration_case.human_label IS
  'People''s verdict under the suite''s rubric (true: '
  'acceptable): the label of POST /v1/eval-suites.';
COMMENT ON COLUMN train.eval_calibration_case.author IS
  'Who added or last changed it, set by the database (train.current_author): '
  'key <id> (<prefix>, role <role>), evaluator <id> or sql role <role>.';
COMMENT ON COLUMN train.eval_calibration_case.created_at IS 'When the case was added.';

COMMENT ON COLUMN obs.deleted_log.log_id IS
  'id of the obs.inference_log row deleted or newly PII-flagged.';
COMMENT ON COLUMN obs.deleted_log.created_at IS
  'created_at of that log row (the rest of its primary key), not when it was marked.';
COMMENT ON COLUMN obs.deleted_log.xid IS
  'The transaction that deleted or flagged it (the latest, if marked again): the marker '
  'goes once every candidate view has been refreshed from a snapshot that sees it.';

COMMENT ON COLUMN train.sft_candidate.prompt_log_id IS
  'id of the edited obs.inference_log row; with prompt_created_at the view''s key.';
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
COMMENT ON COLUMN train.sft_candidate.created_at IS
  'When the call was made: a snapshot''s window filters on it.';
COMMENT ON COLUMN train.sft_candidate.example IS
  'The TRL sft example: {messages: the prompt and the '
  'edited text as the assistant turn} (train.sft_example).';
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

COMMENT ON COLUMN train.candidate_view_refresh.view_name IS
  'The candidate view: train.sft_candidate, train.kto_candidate or train.pair_candidate.';
COMMENT ON COLUMN train.candidate_view_refresh.refreshed_at IS
  'When train.refresh_dataset_candidates last refreshed it (once that '
  'call''s refreshes were done); NULL: never since this table was made.';
COMMENT ON COLUMN train.candidate_view_refresh.seen IS
  'The snapshot of committed transactions taken before that refresh began: obs.deleted_log '
  'markers visible in it are accounted for by this view. NULL: never refreshed, so none are.';
"""

DOWNGRADE_SQL = r"""
COMMENT ON COLUMN tenant.id IS NULL;
COMMENT ON COLUMN tenant.name IS NULL;
COMMENT ON COLUMN tenant.consent_training IS NULL;
COMMENT ON COLUMN tenant.created_at IS NULL;
COMMENT ON COLUMN tenant.updated_at IS NULL;
COMMENT ON COLUMN auth.api_key.id IS NULL;
COMMENT ON COLUMN auth.api_key.tenant_id IS NULL;
COMMENT ON COLUMN auth.api_key.role IS NULL;
COMMENT ON COLUMN auth.api_key.prefix IS NULL;
COMMENT ON COLUMN auth.api_key.key_hash IS NULL;
COMMENT ON COLUMN auth.api_key.name IS NULL;
COMMENT ON COLUMN auth.api_key.created_at IS NULL;
COMMENT ON COLUMN auth.api_key.revoked_at IS NULL;
COMMENT ON COLUMN auth.api_key.last_used_at IS NULL;
COMMENT ON COLUMN obs.inference_log.id IS NULL;
COMMENT ON COLUMN obs.inference_log.request_id IS NULL;
COMMENT ON COLUMN obs.inference_log.tenant_id IS NULL;
COMMENT ON COLUMN obs.inference_log.user_hash IS NULL;
COMMENT ON COLUMN obs.inference_log.route IS NULL;
COMMENT ON COLUMN obs.inference_log.adapter_id IS NULL;
COMMENT ON COLUMN obs.inference_log.model IS NULL;
COMMENT ON COLUMN obs.inference_log.experiment IS NULL;
COMMENT ON COLUMN obs.inference_log.variant IS NULL;
COMMENT ON COLUMN obs.inference_log.messages IS NULL;
COMMENT ON COLUMN obs.inference_log.completion IS NULL;
COMMENT ON COLUMN obs.inference_log.ttft_ms IS NULL;
COMMENT ON COLUMN obs.inference_log.tokens_in IS NULL;
COMMENT ON COLUMN obs.inference_log.tokens_out IS NULL;
COMMENT ON COLUMN obs.inference_log.fb_explicit IS NULL;
COMMENT ON COLUMN obs.inference_log.fb_regen IS NULL;
COMMENT ON COLUMN obs.inference_log.fb_edited IS NULL;
COMMENT ON COLUMN obs.inference_log.edited_completion IS NULL;
COMMENT ON COLUMN obs.inference_log.parent_id IS NULL;
COMMENT ON COLUMN obs.inference_log.parent_request_id IS NULL;
COMMENT ON COLUMN obs.inference_log.regenerated_by IS NULL;
COMMENT ON COLUMN obs.inference_log.embedding IS NULL;
COMMENT ON COLUMN obs.inference_log.pii_flags IS NULL;
COMMENT ON COLUMN obs.inference_log.status IS NULL;
COMMENT ON COLUMN obs.inference_log.feedback_at IS NULL;
COMMENT ON COLUMN obs.inference_log.created_at IS NULL;
COMMENT ON COLUMN obs.request_key.tenant_id IS NULL;
COMMENT ON COLUMN obs.request_key.request_id IS NULL;
COMMENT ON COLUMN obs.request_key.log_id IS NULL;
COMMENT ON COLUMN obs.request_key.created_at IS NULL;
COMMENT ON COLUMN serve.route.name IS NULL;
COMMENT ON COLUMN serve.route.tenant_id IS NULL;
COMMENT ON COLUMN serve.route.base_model IS NULL;
COMMENT ON COLUMN serve.route.experiment IS NULL;
COMMENT ON COLUMN serve.route.created_at IS NULL;
COMMENT ON COLUMN serve.adapter.id IS NULL;
COMMENT ON COLUMN serve.adapter.tenant_id IS NULL;
COMMENT ON COLUMN serve.adapter.route IS NULL;
COMMENT ON COLUMN serve.adapter.base_model IS NULL;
COMMENT ON COLUMN serve.adapter.base_revision IS NULL;
COMMENT ON COLUMN serve.adapter.rank IS NULL;
COMMENT ON COLUMN serve.adapter.alpha IS NULL;
COMMENT ON COLUMN serve.adapter.target_modules IS NULL;
COMMENT ON COLUMN serve.adapter.method IS NULL;
COMMENT ON COLUMN serve.adapter.training_run_id IS NULL;
COMMENT ON COLUMN serve.adapter.dataset_snapshot_id IS NULL;
COMMENT ON COLUMN serve.adapter.weights_uri IS NULL;
COMMENT ON COLUMN serve.adapter.sha256 IS NULL;
COMMENT ON COLUMN serve.adapter.size_bytes IS NULL;
COMMENT ON COLUMN serve.adapter.eval_summary IS NULL;
COMMENT ON COLUMN serve.adapter.status IS NULL;
COMMENT ON COLUMN serve.adapter.traffic_pct IS NULL;
COMMENT ON COLUMN serve.adapter.experiment IS NULL;
COMMENT ON COLUMN serve.adapter.promoted_at IS NULL;
COMMENT ON COLUMN serve.adapter.tainted_at IS NULL;
COMMENT ON COLUMN serve.adapter.tainted_reason IS NULL;
COMMENT ON COLUMN serve.adapter.created_at IS NULL;
COMMENT ON COLUMN serve.adapter.updated_at IS NULL;
COMMENT ON COLUMN serve.adapter_event.id IS NULL;
COMMENT ON COLUMN serve.adapter_event.adapter_id IS NULL;
COMMENT ON COLUMN serve.adapter_event.route IS NULL;
COMMENT ON COLUMN serve.adapter_event.tenant_id IS NULL;
COMMENT ON COLUMN serve.adapter_event.op IS NULL;
COMMENT ON COLUMN serve.adapter_event.old_status IS NULL;
COMMENT ON COLUMN serve.adapter_event.new_status IS NULL;
COMMENT ON COLUMN serve.adapter_event.old_traffic_pct IS NULL;
COMMENT ON COLUMN serve.adapter_event.new_traffic_pct IS NULL;
COMMENT ON COLUMN serve.adapter_event.actor IS NULL;
COMMENT ON COLUMN serve.adapter_event.application_name IS NULL;
COMMENT ON COLUMN serve.adapter_event.reason IS NULL;
COMMENT ON COLUMN serve.adapter_event.override IS NULL;
COMMENT ON COLUMN serve.adapter_event.detail IS NULL;
COMMENT ON COLUMN serve.adapter_event.at IS NULL;
COMMENT ON COLUMN serve.adapter_deployment.adapter_id IS NULL;
COMMENT ON COLUMN serve.adapter_deployment.engine_url IS NULL;
COMMENT ON COLUMN serve.adapter_deployment.state IS NULL;
COMMENT ON COLUMN serve.adapter_deployment.error IS NULL;
COMMENT ON COLUMN serve.adapter_deployment.sha256_checked_at IS NULL;
COMMENT ON COLUMN serve.adapter_deployment.updated_at IS NULL;
COMMENT ON COLUMN serve.experiment_policy.route IS NULL;
COMMENT ON COLUMN serve.experiment_policy.tenant_id IS NULL;
COMMENT ON COLUMN serve.experiment_policy.created_at IS NULL;
COMMENT ON COLUMN serve.experiment_policy.updated_at IS NULL;
COMMENT ON COLUMN serve.experiment_decision.id IS NULL;
COMMENT ON COLUMN serve.experiment_decision.route IS NULL;
COMMENT ON COLUMN serve.experiment_decision.tenant_id IS NULL;
COMMENT ON COLUMN serve.experiment_decision.experiment IS NULL;
COMMENT ON COLUMN serve.experiment_decision.canary_id IS NULL;
COMMENT ON COLUMN serve.experiment_decision.control_id IS NULL;
COMMENT ON COLUMN serve.experiment_decision.metric IS NULL;
COMMENT ON COLUMN serve.experiment_decision.reason IS NULL;
COMMENT ON COLUMN serve.experiment_decision.decided_by IS NULL;
COMMENT ON COLUMN serve.experiment_decision.decided_at IS NULL;
COMMENT ON COLUMN train.training_run.id IS NULL;
COMMENT ON COLUMN train.training_run.tenant_id IS NULL;
COMMENT ON COLUMN train.training_run.route IS NULL;
COMMENT ON COLUMN train.training_run.method IS NULL;
COMMENT ON COLUMN train.training_run.base_model IS NULL;
COMMENT ON COLUMN train.training_run.params IS NULL;
COMMENT ON COLUMN train.training_run.snapshot_id IS NULL;
COMMENT ON COLUMN train.training_run.status IS NULL;
COMMENT ON COLUMN train.training_run.priority IS NULL;
COMMENT ON COLUMN train.training_run.worker_id IS NULL;
COMMENT ON COLUMN train.training_run.lease_until IS NULL;
COMMENT ON COLUMN train.training_run.attempts IS NULL;
COMMENT ON COLUMN train.training_run.max_attempts IS NULL;
COMMENT ON COLUMN train.training_run.cancel_requested IS NULL;
COMMENT ON COLUMN train.training_run.progress IS NULL;
COMMENT ON COLUMN train.training_run.error IS NULL;
COMMENT ON COLUMN train.training_run.adapter_id IS NULL;
COMMENT ON COLUMN train.training_run.created_by IS NULL;
COMMENT ON COLUMN train.training_run.created_at IS NULL;
COMMENT ON COLUMN train.training_run.started_at IS NULL;
COMMENT ON COLUMN train.training_run.finished_at IS NULL;
COMMENT ON COLUMN train.training_run.updated_at IS NULL;
COMMENT ON COLUMN train.training_worker.worker_id IS NULL;
COMMENT ON COLUMN train.training_worker.host IS NULL;
COMMENT ON COLUMN train.training_worker.devices IS NULL;
COMMENT ON COLUMN train.training_worker.gpus IS NULL;
COMMENT ON COLUMN train.training_worker.gpu_memory_gb IS NULL;
COMMENT ON COLUMN train.training_worker.device_kind IS NULL;
COMMENT ON COLUMN train.training_worker.seen_at IS NULL;
COMMENT ON COLUMN train.training_worker.alive_until IS NULL;
COMMENT ON COLUMN train.dataset_snapshot.id IS NULL;
COMMENT ON COLUMN train.dataset_snapshot.tenant_id IS NULL;
COMMENT ON COLUMN train.dataset_snapshot.route IS NULL;
COMMENT ON COLUMN train.dataset_snapshot.method IS NULL;
COMMENT ON COLUMN train.dataset_snapshot.query_sql IS NULL;
COMMENT ON COLUMN train.dataset_snapshot.params IS NULL;
COMMENT ON COLUMN train.dataset_snapshot.counts IS NULL;
COMMENT ON COLUMN train.dataset_snapshot.n_train IS NULL;
COMMENT ON COLUMN train.dataset_snapshot.n_eval IS NULL;
COMMENT ON COLUMN train.dataset_snapshot.set_hash IS NULL;
COMMENT ON COLUMN train.dataset_snapshot.created_by IS NULL;
COMMENT ON COLUMN train.dataset_snapshot.created_at IS NULL;
COMMENT ON COLUMN train.dataset_snapshot.tainted_at IS NULL;
COMMENT ON COLUMN train.dataset_snapshot.tainted_reason IS NULL;
COMMENT ON COLUMN train.dataset_example.snapshot_id IS NULL;
COMMENT ON COLUMN train.dataset_example.example_hash IS NULL;
COMMENT ON COLUMN train.dataset_example.split IS NULL;
COMMENT ON COLUMN train.dataset_example.log_ids IS NULL;
COMMENT ON COLUMN train.dataset_example.example IS NULL;
COMMENT ON COLUMN train.eval_result.adapter_id IS NULL;
COMMENT ON COLUMN train.eval_result.suite_id IS NULL;
COMMENT ON COLUMN train.eval_result.metric IS NULL;
COMMENT ON COLUMN train.eval_result.score IS NULL;
COMMENT ON COLUMN train.eval_result.judge_model IS NULL;
COMMENT ON COLUMN train.eval_result.judged_at IS NULL;
COMMENT ON COLUMN train.eval_result.author_kind IS NULL;
COMMENT ON COLUMN train.eval_result.author_key_id IS NULL;
COMMENT ON COLUMN train.eval_result.author IS NULL;
COMMENT ON COLUMN train.eval_result.rubric_version IS NULL;
COMMENT ON COLUMN train.promotion_policy.id IS NULL;
COMMENT ON COLUMN train.promotion_policy.route IS NULL;
COMMENT ON COLUMN train.promotion_policy.suite_id IS NULL;
COMMENT ON COLUMN train.promotion_policy.metric IS NULL;
COMMENT ON COLUMN train.promotion_policy.direction IS NULL;
COMMENT ON COLUMN train.promotion_policy.tolerance IS NULL;
COMMENT ON COLUMN train.promotion_policy.required IS NULL;
COMMENT ON COLUMN train.promotion_policy.created_at IS NULL;
COMMENT ON COLUMN train.promotion_policy.trusted_authors IS NULL;
COMMENT ON COLUMN train.promotion_policy.min_judge_kappa IS NULL;
COMMENT ON COLUMN train.eval_suite.id IS NULL;
COMMENT ON COLUMN train.eval_suite.tenant_id IS NULL;
COMMENT ON COLUMN train.eval_suite.route IS NULL;
COMMENT ON COLUMN train.eval_suite.name IS NULL;
COMMENT ON COLUMN train.eval_suite.kind IS NULL;
COMMENT ON COLUMN train.eval_suite.rubric IS NULL;
COMMENT ON COLUMN train.eval_suite.created_at IS NULL;
COMMENT ON COLUMN train.eval_case.id IS NULL;
COMMENT ON COLUMN train.eval_case.suite_id IS NULL;
COMMENT ON COLUMN train.eval_case.messages IS NULL;
COMMENT ON COLUMN train.eval_case.check_kind IS NULL;
COMMENT ON COLUMN train.eval_case.expected IS NULL;
COMMENT ON COLUMN train.eval_case.max_tokens IS NULL;
COMMENT ON COLUMN train.eval_request.id IS NULL;
COMMENT ON COLUMN train.eval_request.tenant_id IS NULL;
COMMENT ON COLUMN train.eval_request.adapter_id IS NULL;
COMMENT ON COLUMN train.eval_request.status IS NULL;
COMMENT ON COLUMN train.eval_request.requested_by IS NULL;
COMMENT ON COLUMN train.eval_request.worker_id IS NULL;
COMMENT ON COLUMN train.eval_request.lease_until IS NULL;
COMMENT ON COLUMN train.eval_request.attempts IS NULL;
COMMENT ON COLUMN train.eval_request.error IS NULL;
COMMENT ON COLUMN train.eval_request.created_at IS NULL;
COMMENT ON COLUMN train.eval_request.started_at IS NULL;
COMMENT ON COLUMN train.eval_request.finished_at IS NULL;
COMMENT ON COLUMN train.judge_calibration.id IS NULL;
COMMENT ON COLUMN train.judge_calibration.suite_id IS NULL;
COMMENT ON COLUMN train.judge_calibration.judge_model IS NULL;
COMMENT ON COLUMN train.judge_calibration.rubric_version IS NULL;
COMMENT ON COLUMN train.judge_calibration.threshold IS NULL;
COMMENT ON COLUMN train.judge_calibration.n IS NULL;
COMMENT ON COLUMN train.judge_calibration.accuracy IS NULL;
COMMENT ON COLUMN train.judge_calibration.kappa IS NULL;
COMMENT ON COLUMN train.judge_calibration.bias IS NULL;
COMMENT ON COLUMN train.judge_calibration.judge_positive_rate IS NULL;
COMMENT ON COLUMN train.judge_calibration.human_positive_rate IS NULL;
COMMENT ON COLUMN train.judge_calibration.author_role IS NULL;
COMMENT ON COLUMN train.judge_calibration.author IS NULL;
COMMENT ON COLUMN train.judge_calibration.calibrated_at IS NULL;
COMMENT ON COLUMN train.judge_verdict.calibration_id IS NULL;
COMMENT ON COLUMN train.judge_verdict.case_id IS NULL;
COMMENT ON COLUMN train.judge_verdict.judge_score IS NULL;
COMMENT ON COLUMN train.judge_verdict.judge_reply IS NULL;
COMMENT ON COLUMN train.judge_verdict.judge_label IS NULL;
COMMENT ON COLUMN train.judge_verdict.human_label IS NULL;
COMMENT ON COLUMN auth.forget_request.id IS NULL;
COMMENT ON COLUMN auth.forget_request.tenant_id IS NULL;
COMMENT ON COLUMN auth.forget_request.user_hash IS NULL;
COMMENT ON COLUMN auth.forget_request.logs_deleted IS NULL;
COMMENT ON COLUMN auth.forget_request.request_keys_deleted IS NULL;
COMMENT ON COLUMN auth.forget_request.snapshots_tainted IS NULL;
COMMENT ON COLUMN auth.forget_request.adapters_tainted IS NULL;
COMMENT ON COLUMN auth.forget_request.created_at IS NULL;
COMMENT ON COLUMN auth.tenant_offboarding.id IS NULL;
COMMENT ON COLUMN auth.tenant_offboarding.tenant_id IS NULL;
COMMENT ON COLUMN auth.tenant_offboarding.tenant_name IS NULL;
COMMENT ON COLUMN auth.tenant_offboarding.requested_by IS NULL;
COMMENT ON COLUMN auth.tenant_offboarding.status IS NULL;
COMMENT ON COLUMN auth.tenant_offboarding.retired_adapters IS NULL;
COMMENT ON COLUMN auth.tenant_offboarding.forced IS NULL;
COMMENT ON COLUMN auth.tenant_offboarding.counts IS NULL;
COMMENT ON COLUMN auth.tenant_offboarding.artefacts_pending IS NULL;
COMMENT ON COLUMN auth.tenant_offboarding.artefacts_deleted IS NULL;
COMMENT ON COLUMN auth.tenant_offboarding.started_at IS NULL;
COMMENT ON COLUMN auth.tenant_offboarding.data_deleted_at IS NULL;
COMMENT ON COLUMN auth.tenant_offboarding.finished_at IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour_scan.log_id IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour_scan.created_at IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour_scan.tenant_id IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour_scan.route IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour_scan.radius IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour_scan.max_neighbours IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour_scan.prompt_hash IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour_scan.scanned_at IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour_scan.candidate IS NULL;
COMMENT ON COLUMN obs.prompt_embedding.log_id IS NULL;
COMMENT ON COLUMN obs.prompt_embedding.created_at IS NULL;
COMMENT ON COLUMN obs.prompt_embedding.tenant_id IS NULL;
COMMENT ON COLUMN obs.prompt_embedding.route IS NULL;
COMMENT ON COLUMN obs.prompt_embedding.embedding IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour.tenant_id IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour.route IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour.a_id IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour.a_created_at IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour.b_id IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour.b_created_at IS NULL;
COMMENT ON COLUMN obs.prompt_neighbour.distance IS NULL;
COMMENT ON COLUMN obs.experiment.tenant_id IS NULL;
COMMENT ON COLUMN obs.experiment.route IS NULL;
COMMENT ON COLUMN obs.experiment.adapters IS NULL;
COMMENT ON COLUMN obs.experiment.first_at IS NULL;
COMMENT ON COLUMN obs.experiment.last_at IS NULL;
COMMENT ON COLUMN loop.control.id IS NULL;
COMMENT ON COLUMN loop.control.paused IS NULL;
COMMENT ON COLUMN loop.control.reason IS NULL;
COMMENT ON COLUMN loop.control.changed_by IS NULL;
COMMENT ON COLUMN loop.control.changed_at IS NULL;
COMMENT ON COLUMN loop.control.max_concurrent_training IS NULL;
COMMENT ON COLUMN loop.policy.route IS NULL;
COMMENT ON COLUMN loop.policy.tenant_id IS NULL;
COMMENT ON COLUMN loop.policy.paused_reason IS NULL;
COMMENT ON COLUMN loop.policy.decline_enabled IS NULL;
COMMENT ON COLUMN loop.policy.decline_window IS NULL;
COMMENT ON COLUMN loop.policy.decline_min_n IS NULL;
COMMENT ON COLUMN loop.policy.drift_enabled IS NULL;
COMMENT ON COLUMN loop.policy.drift_sample IS NULL;
COMMENT ON COLUMN loop.policy.drift_min_n IS NULL;
COMMENT ON COLUMN loop.policy.max_cycles_per_day IS NULL;
COMMENT ON COLUMN loop.policy.max_concurrent_training IS NULL;
COMMENT ON COLUMN loop.policy.cooldown_after_reject IS NULL;
COMMENT ON COLUMN loop.policy.canary_max_users IS NULL;
COMMENT ON COLUMN loop.policy.canary_max_duration IS NULL;
COMMENT ON COLUMN loop.policy.decision_metric IS NULL;
COMMENT ON COLUMN loop.policy.decision_alpha IS NULL;
COMMENT ON COLUMN loop.policy.decision_min_n IS NULL;
COMMENT ON COLUMN loop.policy.watch_window IS NULL;
COMMENT ON COLUMN loop.policy.watch_alpha IS NULL;
COMMENT ON COLUMN loop.policy.watch_min_n IS NULL;
COMMENT ON COLUMN loop.policy.eval_timeout IS NULL;
COMMENT ON COLUMN loop.policy.created_at IS NULL;
COMMENT ON COLUMN loop.policy.updated_at IS NULL;
COMMENT ON COLUMN loop.policy.updated_by IS NULL;
COMMENT ON COLUMN loop.cycle.id IS NULL;
COMMENT ON COLUMN loop.cycle.tenant_id IS NULL;
COMMENT ON COLUMN loop.cycle.route IS NULL;
COMMENT ON COLUMN loop.cycle.state IS NULL;
COMMENT ON COLUMN loop.cycle.trigger IS NULL;
COMMENT ON COLUMN loop.cycle.trigger_values IS NULL;
COMMENT ON COLUMN loop.cycle.policy IS NULL;
COMMENT ON COLUMN loop.cycle.signal_counts IS NULL;
COMMENT ON COLUMN loop.cycle.method IS NULL;
COMMENT ON COLUMN loop.cycle.method_reason IS NULL;
COMMENT ON COLUMN loop.cycle.hyperparameters IS NULL;
COMMENT ON COLUMN loop.cycle.snapshot_id IS NULL;
COMMENT ON COLUMN loop.cycle.snapshot_counts IS NULL;
COMMENT ON COLUMN loop.cycle.n_train IS NULL;
COMMENT ON COLUMN loop.cycle.n_eval IS NULL;
COMMENT ON COLUMN loop.cycle.training_run_id IS NULL;
COMMENT ON COLUMN loop.cycle.adapter_id IS NULL;
COMMENT ON COLUMN loop.cycle.current_prod_id IS NULL;
COMMENT ON COLUMN loop.cycle.eval_scores IS NULL;
COMMENT ON COLUMN loop.cycle.blockers IS NULL;
COMMENT ON COLUMN loop.cycle.canary_pct IS NULL;
COMMENT ON COLUMN loop.cycle.canary_started_at IS NULL;
COMMENT ON COLUMN loop.cycle.experiment IS NULL;
COMMENT ON COLUMN loop.cycle.decision IS NULL;
COMMENT ON COLUMN loop.cycle.decision_code IS NULL;
COMMENT ON COLUMN loop.cycle.decision_reason IS NULL;
COMMENT ON COLUMN loop.cycle.previous_prod_id IS NULL;
COMMENT ON COLUMN loop.cycle.promoted_at IS NULL;
COMMENT ON COLUMN loop.cycle.watch_until IS NULL;
COMMENT ON COLUMN loop.cycle.watch IS NULL;
COMMENT ON COLUMN loop.cycle.forget_request_id IS NULL;
COMMENT ON COLUMN loop.cycle.error IS NULL;
COMMENT ON COLUMN loop.cycle.waiting_for IS NULL;
COMMENT ON COLUMN loop.cycle.worker_id IS NULL;
COMMENT ON COLUMN loop.cycle.lease_until IS NULL;
COMMENT ON COLUMN loop.cycle.attempts IS NULL;
COMMENT ON COLUMN loop.cycle.max_attempts IS NULL;
COMMENT ON COLUMN loop.cycle.next_step_at IS NULL;
COMMENT ON COLUMN loop.cycle.state_entered_at IS NULL;
COMMENT ON COLUMN loop.cycle.created_at IS NULL;
COMMENT ON COLUMN loop.cycle.updated_at IS NULL;
COMMENT ON COLUMN loop.cycle.finished_at IS NULL;
COMMENT ON COLUMN loop.cycle_event.id IS NULL;
COMMENT ON COLUMN loop.cycle_event.cycle_id IS NULL;
COMMENT ON COLUMN loop.cycle_event.tenant_id IS NULL;
COMMENT ON COLUMN loop.cycle_event.from_state IS NULL;
COMMENT ON COLUMN loop.cycle_event.to_state IS NULL;
COMMENT ON COLUMN loop.cycle_event.worker_id IS NULL;
COMMENT ON COLUMN loop.cycle_event.inputs IS NULL;
COMMENT ON COLUMN loop.cycle_event.note IS NULL;
COMMENT ON COLUMN loop.cycle_event.at IS NULL;
COMMENT ON COLUMN obs.inference_log_partition.name IS NULL;
COMMENT ON COLUMN obs.inference_log_partition.from_at IS NULL;
COMMENT ON COLUMN obs.inference_log_partition.to_at IS NULL;
COMMENT ON COLUMN train.training_run_wait.id IS NULL;
COMMENT ON COLUMN train.training_run_wait.tenant_id IS NULL;
COMMENT ON COLUMN train.training_run_wait.route IS NULL;
COMMENT ON COLUMN train.training_run_wait.method IS NULL;
COMMENT ON COLUMN train.training_run_wait.priority IS NULL;
COMMENT ON COLUMN train.training_run_wait.gpus IS NULL;
COMMENT ON COLUMN train.training_run_wait.min_gpu_memory_gb IS NULL;
COMMENT ON COLUMN train.training_run_wait.device_kind IS NULL;
COMMENT ON COLUMN train.training_run_wait.created_at IS NULL;
COMMENT ON COLUMN train.training_run_wait.waiting_for IS NULL;
COMMENT ON COLUMN train.training_run_wait.able_workers IS NULL;
COMMENT ON COLUMN train.training_run_wait.able_workers_busy IS NULL;
COMMENT ON COLUMN train.training_run_wait.reason IS NULL;
COMMENT ON COLUMN obs.arm_sample.adapter_id IS NULL;
COMMENT ON COLUMN obs.arm_sample.since IS NULL;
COMMENT ON COLUMN obs.arm_sample.until IS NULL;
COMMENT ON COLUMN obs.arm_sample.first_at IS NULL;
COMMENT ON COLUMN obs.arm_sample.last_at IS NULL;
COMMENT ON COLUMN obs.arm_sample.n IS NULL;
COMMENT ON COLUMN obs.arm_sample.n_feedback IS NULL;
COMMENT ON COLUMN obs.arm_sample.feedback_mean IS NULL;
COMMENT ON COLUMN obs.arm_sample.feedback_var IS NULL;
COMMENT ON COLUMN obs.arm_sample.n_thumbs_up IS NULL;
COMMENT ON COLUMN obs.arm_sample.n_thumbs_down IS NULL;
COMMENT ON COLUMN obs.arm_sample.n_regen IS NULL;
COMMENT ON COLUMN obs.arm_sample.n_edited IS NULL;
COMMENT ON COLUMN obs.arm_sample.n_bad IS NULL;
COMMENT ON COLUMN obs.arm_sample.n_tokens IS NULL;
COMMENT ON COLUMN obs.arm_sample.tokens_out_avg IS NULL;
COMMENT ON COLUMN obs.arm_sample.tokens_out_var IS NULL;
COMMENT ON COLUMN obs.arm_sample.n_ttft IS NULL;
COMMENT ON COLUMN obs.arm_sample.ttft_p95 IS NULL;
COMMENT ON COLUMN obs.arm_sample.ttft_threshold IS NULL;
COMMENT ON COLUMN obs.arm_sample.n_ttft_over IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.experiment IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.variant IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.adapter_id IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.route IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.n IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.n_error IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.n_feedback IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_mean IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_var IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_se IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_ci_low IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.feedback_ci_high IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.n_thumbs_up IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.n_thumbs_down IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.thumbs_up_rate IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.thumbs_up_ci_low IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.thumbs_up_ci_high IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.n_regen IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.regen_rate IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.n_edited IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.edit_rate IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.n_ttft IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_avg IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_var IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_p50 IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.ttft_p95 IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.tokens_out_avg IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.tokens_out_sum IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.first_at IS NULL;
COMMENT ON COLUMN obs.experiment_arm_7d.last_at IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.experiment IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.metric IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.test IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.higher_is_better IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.control_variant IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.control_adapter IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.canary_variant IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.canary_adapter IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.n_control IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.n_canary IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.control_value IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.canary_value IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.diff IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.diff_ci_low IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.diff_ci_high IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.statistic IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.df IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.p_value IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.alpha IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.significant IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.canary_better IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.mde IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.power IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.n_required_per_arm IS NULL;
COMMENT ON COLUMN obs.experiment_compare_7d.n_more_needed IS NULL;
COMMENT ON COLUMN train.eval_calibration_case.id IS NULL;
COMMENT ON COLUMN train.eval_calibration_case.suite_id IS NULL;
COMMENT ON COLUMN train.eval_calibration_case.messages IS NULL;
COMMENT ON COLUMN train.eval_calibration_case.answer IS NULL;
COMMENT ON COLUMN train.eval_calibration_case.human_label IS NULL;
COMMENT ON COLUMN train.eval_calibration_case.author IS NULL;
COMMENT ON COLUMN train.eval_calibration_case.created_at IS NULL;
COMMENT ON COLUMN obs.deleted_log.log_id IS NULL;
COMMENT ON COLUMN obs.deleted_log.created_at IS NULL;
COMMENT ON COLUMN obs.deleted_log.xid IS NULL;
COMMENT ON COLUMN train.sft_candidate.prompt_log_id IS NULL;
COMMENT ON COLUMN train.sft_candidate.prompt_created_at IS NULL;
COMMENT ON COLUMN train.sft_candidate.log_ids IS NULL;
COMMENT ON COLUMN train.sft_candidate.tenant_id IS NULL;
COMMENT ON COLUMN train.sft_candidate.route IS NULL;
COMMENT ON COLUMN train.sft_candidate.rating IS NULL;
COMMENT ON COLUMN train.sft_candidate.created_at IS NULL;
COMMENT ON COLUMN train.sft_candidate.example IS NULL;
COMMENT ON COLUMN train.sft_candidate.example_hash IS NULL;
COMMENT ON COLUMN train.sft_candidate.dup_check_off IS NULL;
COMMENT ON COLUMN train.kto_candidate.prompt_log_id IS NULL;
COMMENT ON COLUMN train.kto_candidate.prompt_created_at IS NULL;
COMMENT ON COLUMN train.kto_candidate.log_ids IS NULL;
COMMENT ON COLUMN train.kto_candidate.tenant_id IS NULL;
COMMENT ON COLUMN train.kto_candidate.route IS NULL;
COMMENT ON COLUMN train.kto_candidate.label IS NULL;
COMMENT ON COLUMN train.kto_candidate.rating IS NULL;
COMMENT ON COLUMN train.kto_candidate.created_at IS NULL;
COMMENT ON COLUMN train.kto_candidate.example IS NULL;
COMMENT ON COLUMN train.kto_candidate.example_hash IS NULL;
COMMENT ON COLUMN train.kto_candidate.dup_check_off IS NULL;
COMMENT ON COLUMN train.pair_candidate.source IS NULL;
COMMENT ON COLUMN train.pair_candidate.prompt_log_id IS NULL;
COMMENT ON COLUMN train.pair_candidate.prompt_created_at IS NULL;
COMMENT ON COLUMN train.pair_candidate.chosen_log_id IS NULL;
COMMENT ON COLUMN train.pair_candidate.chosen_created_at IS NULL;
COMMENT ON COLUMN train.pair_candidate.log_ids IS NULL;
COMMENT ON COLUMN train.pair_candidate.tenant_id IS NULL;
COMMENT ON COLUMN train.pair_candidate.route IS NULL;
COMMENT ON COLUMN train.pair_candidate.rating IS NULL;
COMMENT ON COLUMN train.pair_candidate.created_at IS NULL;
COMMENT ON COLUMN train.pair_candidate.example IS NULL;
COMMENT ON COLUMN train.pair_candidate.example_hash IS NULL;
COMMENT ON COLUMN train.pair_candidate.dup_check_off IS NULL;
COMMENT ON COLUMN train.candidate_view_refresh.view_name IS NULL;
COMMENT ON COLUMN train.candidate_view_refresh.refreshed_at IS NULL;
COMMENT ON COLUMN train.candidate_view_refresh.seen IS NULL;
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(UPGRADE_SQL)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(DOWNGRADE_SQL)
