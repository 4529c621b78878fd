-- One definition of each example shape (TRL's formats: conversational `messages` for SFT,
-- prompt/completion/label for KTO, prompt/chosen/rejected for the pair methods), shared by the
-- candidate views (views/dataset_candidates_v2.sql hashes them at refresh) and the snapshot
-- (functions/dataset_snapshot_v4.sql stores them): the stored example and the view's
-- example_hash come from the same expression. The same expressions as create_snapshot_v1..v3.
-- STABLE like jsonb_build_object, so the planner inlines them (no call per row).
CREATE OR REPLACE FUNCTION train.sft_example_v1(p_prompt jsonb, p_completion text)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT jsonb_build_object('messages', p_prompt || jsonb_build_array(
           jsonb_build_object('role', 'assistant', 'content', p_completion)))
$$;

CREATE OR REPLACE FUNCTION train.kto_example_v1(p_prompt jsonb, p_completion text, p_label boolean)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT jsonb_build_object('prompt', p_prompt,
           'completion', jsonb_build_array(
             jsonb_build_object('role', 'assistant', 'content', p_completion)),
           'label', p_label)
$$;

CREATE OR REPLACE FUNCTION train.pair_example_v1(p_prompt jsonb, p_chosen text, p_rejected text)
RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT jsonb_build_object('prompt', p_prompt,
           'chosen', jsonb_build_array(
             jsonb_build_object('role', 'assistant', 'content', p_chosen)),
           'rejected', jsonb_build_array(
             jsonb_build_object('role', 'assistant', 'content', p_rejected)))
$$;
