-- The sufficient statistics of one sample of traffic.
CREATE TYPE obs.arm_sample AS (
  adapter_id      text,
  since           timestamptz,
  until           timestamptz,
  first_at        timestamptz,
  last_at         timestamptz,
  n               bigint,
  n_feedback      bigint,
  feedback_mean   float8,
  feedback_var    float8,
  n_thumbs_up     bigint,
  n_thumbs_down   bigint,
  n_regen         bigint,
  n_edited        bigint,
  n_bad           bigint,
  n_tokens        bigint,
  tokens_out_avg  float8,
  tokens_out_var  float8,
  n_ttft          bigint,
  ttft_p95        float8,
  ttft_threshold  float8,
  n_ttft_over     bigint
);
