COMMENT ON TABLE obs.inference_log IS
  'Every inference and its feedback. Weekly partitions; obs.inference_log_default catches the rest.';
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
