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
COMMENT ON COLUMN serve.adapter.promoted_at IS 'When it last became prod (set by the gate).';
COMMENT ON COLUMN serve.adapter.tainted_at IS
  'When a user it was trained on was forgotten: a tainted adapter is neither promoted nor restored '
  'by a rollback, and a tainted prod fires the loop''s forget trigger. NULL: clean.';
COMMENT ON COLUMN serve.adapter.tainted_reason IS
  'Why it is tainted (the forget request that tainted it).';
COMMENT ON COLUMN serve.adapter.created_at IS 'When it was registered.';
COMMENT ON COLUMN serve.adapter.updated_at IS 'Last change of the row (kept by trigger).';
COMMENT ON COLUMN serve.adapter.previous_prod_id IS
  'The prod adapter this one replaced when it was promoted; a rollback restores it.';
COMMENT ON COLUMN serve.adapter.source IS
  'Where it came from: trained (by cft''s trainer, from a training run) or imported (trained '
  'elsewhere and registered by POST /v1/adapters or cft adapter import, after the same checks).';
COMMENT ON COLUMN serve.adapter.import_detail IS
  'An imported adapter''s record: origin (the upload or folder), imported_by (the API key or '
  'cli), declared_base (base_model_name_or_path of its adapter_config.json), peft_version and '
  'the metadata the caller sent. NULL for a trained adapter.';
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
