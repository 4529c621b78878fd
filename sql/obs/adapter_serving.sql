-- What each adapter (and the bare base) served in the last 7 days: calls, errors, throughput
-- and time to first token, per route; the router's metrics stay few series at any number of
-- routes, and these numbers come from the log instead (the dashboard's serving panel).
CREATE OR REPLACE VIEW obs.adapter_serving_7d WITH (security_invoker = true) AS
SELECT l.tenant_id, l.route, l.adapter_id,
       (l.adapter_id = r.base_model) AS is_base,
       count(*) AS n,
       count(*) FILTER (WHERE l.status = 'error') AS n_error,
       round(count(*) / 10080.0, 4) AS calls_per_min,
       round(coalesce(sum(l.tokens_out), 0) / 10080.0, 2) AS tokens_out_per_min,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY l.ttft_ms) AS ttft_p50_ms,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY l.ttft_ms) AS ttft_p99_ms,
       max(l.created_at) AS last_at
  FROM obs.inference_log l
  LEFT JOIN serve.route r ON r.name = l.route AND r.tenant_id = l.tenant_id
 WHERE l.created_at > now() - interval '7 days'
 GROUP BY l.tenant_id, l.route, l.adapter_id, r.base_model;
COMMENT ON VIEW obs.adapter_serving_7d IS
  'Per route and adapter (or the base), what it served in the last 7 days.';
COMMENT ON COLUMN obs.adapter_serving_7d.tenant_id IS 'The tenant whose route it is.';
COMMENT ON COLUMN obs.adapter_serving_7d.route IS 'The route logged.';
COMMENT ON COLUMN obs.adapter_serving_7d.adapter_id IS
  'What answered: an adapter id, or the route''s base model.';
COMMENT ON COLUMN obs.adapter_serving_7d.is_base IS
  'True when the base model answered (no adapter): the LoRA vs base comparison.';
COMMENT ON COLUMN obs.adapter_serving_7d.n IS 'Calls logged in the last 7 days.';
COMMENT ON COLUMN obs.adapter_serving_7d.n_error IS 'Of them, calls with status error.';
COMMENT ON COLUMN obs.adapter_serving_7d.calls_per_min IS 'n per minute over the 7 days.';
COMMENT ON COLUMN obs.adapter_serving_7d.tokens_out_per_min IS
  'Completion tokens per minute over the 7 days (throughput).';
COMMENT ON COLUMN obs.adapter_serving_7d.ttft_p50_ms IS 'Median time to first token (ms).';
COMMENT ON COLUMN obs.adapter_serving_7d.ttft_p99_ms IS '99th percentile time to first token (ms).';
COMMENT ON COLUMN obs.adapter_serving_7d.last_at IS 'The last call logged.';

-- Per tenant, LoRA adapters against the bare base: the cost of serving with an adapter.
CREATE OR REPLACE VIEW obs.lora_vs_base_7d WITH (security_invoker = true) AS
SELECT l.tenant_id, (l.adapter_id = r.base_model) AS is_base,
       count(*) AS n,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY l.ttft_ms) AS ttft_p50_ms,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY l.ttft_ms) AS ttft_p99_ms
  FROM obs.inference_log l
  JOIN serve.route r ON r.name = l.route AND r.tenant_id = l.tenant_id
 WHERE l.created_at > now() - interval '7 days' AND l.status = 'ok'
 GROUP BY l.tenant_id, (l.adapter_id = r.base_model);
COMMENT ON VIEW obs.lora_vs_base_7d IS
  'Time to first token of answered calls in the last 7 days: by a LoRA adapter or the base.';
COMMENT ON COLUMN obs.lora_vs_base_7d.tenant_id IS 'The tenant.';
COMMENT ON COLUMN obs.lora_vs_base_7d.is_base IS 'True: the base answered; false: an adapter.';
COMMENT ON COLUMN obs.lora_vs_base_7d.n IS 'Answered calls.';
COMMENT ON COLUMN obs.lora_vs_base_7d.ttft_p50_ms IS 'Median time to first token (ms).';
COMMENT ON COLUMN obs.lora_vs_base_7d.ttft_p99_ms IS '99th percentile time to first token (ms).';

GRANT SELECT ON obs.adapter_serving_7d, obs.lora_vs_base_7d TO cft_app, cft_release, cft_dashboard;
