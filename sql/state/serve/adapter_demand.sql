-- Adapters asked for by name (a fine-tuned model called on /v1/chat/completions): the
-- reconciler keeps each loaded until wanted_until, like the canaries and prods it always loads.
CREATE TABLE serve.adapter_demand (
  adapter_id   text PRIMARY KEY REFERENCES serve.adapter (id) ON DELETE CASCADE,
  wanted_until timestamptz NOT NULL,
  requested_at timestamptz NOT NULL DEFAULT now()
);
