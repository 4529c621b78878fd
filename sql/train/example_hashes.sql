-- The hashes and the split rule of dataset examples, and one definition of each example shape
-- (TRL's formats: conversational `messages` for SFT, prompt/completion/label for KTO,
-- prompt/chosen/rejected for the pair methods), shared by the candidate views
-- (train/candidate_views.sql builds and hashes them at refresh) and the snapshot checks.

-- Hash of a prompt for exact dedup: roles and contents, content lower-cased with whitespace
-- collapsed. sha256 (256-bit), not hashtext (32-bit, collides at this scale).
CREATE OR REPLACE FUNCTION train.prompt_hash(p_messages jsonb) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT sha256(convert_to(coalesce(string_agg(
           coalesce(m->>'role', '') || ':'
           || lower(regexp_replace(btrim(coalesce(m->>'content', '')), '\s+', ' ', 'g')),
           E'\n' ORDER BY o), ''), 'UTF8'))
    FROM jsonb_array_elements(CASE jsonb_typeof(p_messages) WHEN 'array' THEN p_messages
                                   ELSE jsonb_build_array(p_messages) END)
         WITH ORDINALITY AS e(m, o)
$$;

-- Hash of an example: sha256 of its canonical jsonb text (jsonb orders keys deterministically).
CREATE OR REPLACE FUNCTION train.example_hash(p_example jsonb) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT sha256(convert_to(p_example::text, 'UTF8'))
$$;

-- Bucket 0..99 of an example hash (first 32 bits, unsigned): the train/eval split rule.
CREATE OR REPLACE FUNCTION train.split_bucket(p_hash bytea) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT (((get_byte(p_hash, 0)::bigint << 24) | (get_byte(p_hash, 1) << 16)
          | (get_byte(p_hash, 2) << 8) | get_byte(p_hash, 3)) % 100)::int
$$;

-- STABLE like jsonb_build_object, so the planner inlines them (no call per row).

CREATE OR REPLACE FUNCTION train.sft_example(p_prompt jsonb, p_completion text)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT jsonb_build_object('messages', p_prompt || jsonb_build_array(
           jsonb_build_object('role', 'assistant', 'content', p_completion)))
$$;

CREATE OR REPLACE FUNCTION train.kto_example(p_prompt jsonb, p_completion text, p_label boolean)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT jsonb_build_object('prompt', p_prompt,
           'completion', jsonb_build_array(
             jsonb_build_object('role', 'assistant', 'content', p_completion)),
           'label', p_label)
$$;

CREATE OR REPLACE FUNCTION train.pair_example(p_prompt jsonb, p_chosen text, p_rejected text)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT jsonb_build_object('prompt', p_prompt,
           'chosen', jsonb_build_array(
             jsonb_build_object('role', 'assistant', 'content', p_chosen)),
           'rejected', jsonb_build_array(
             jsonb_build_object('role', 'assistant', 'content', p_rejected)))
$$;

GRANT EXECUTE ON FUNCTION train.prompt_hash(jsonb), train.example_hash(jsonb),
  train.split_bucket(bytea) TO cft_app, cft_release, cft_dashboard;
