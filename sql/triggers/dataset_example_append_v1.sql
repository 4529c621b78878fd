-- train.dataset_example as an append-only table written in bulk. A snapshot writes all its
-- examples in one statement (train.create_snapshot_v5: ~384k at 1,000,000 log rows), and two
-- per-example costs of that statement go:
--   * the primary key (snapshot_id, example_hash): one btree entry per example, which had to
--     arrive in key order (so the writer sorted its wide rows first). Measured at 1M rows:
--     writing the examples took 1.2-1.5 s more with it than with a plain index on snapshot_id.
--     That index (one key per snapshot: deduplicated into posting lists, appended in heap
--     order) serves every reader (export, verify, forget, the cascade from a deleted draft).
--     The hashes of a snapshot are distinct by construction: one example per distinct
--     normalised prompt, and each example contains its prompt;
--   * the statement trigger's transition table (dataset_example_insert_checked, a copy of every
--     inserted row, ~0.25 s at 1M rows).
-- Every other insert is checked row by row with the rules of that trigger: the snapshot
-- exists and is locked FOR KEY SHARE, as the foreign key did; a sealed snapshot takes no new
-- examples. (The older writers, create_snapshot_v1..v4, pay that check per example; they
-- stay installed for comparison and downgrades.) No example twice in a snapshot is now the
-- writers' rule, not a constraint: a per-row probe for it would scan the snapshot's
-- examples so far (O(n^2) over a bulk insert) unless indexed, which is the key's cost again.
-- create_snapshot_v5 counts its distinct hashes in the pass that computes the set_hash and
-- refuses the snapshot if any repeats.
-- The writer names its own draft in the transaction-local setting cft.writing_snapshot (a
-- draft it inserted in the same transaction: it exists, is not sealed, and its hashes are
-- distinct); rows of that draft skip the per-row check. Only the owner may insert examples
-- (INSERT is revoked from cft_app, whose snapshots go through the SECURITY DEFINER writer),
-- so the setting lets no role skip a check it could not drop.

CREATE OR REPLACE FUNCTION train.dataset_example_insert_check_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
  PERFORM 1 FROM train.dataset_snapshot s WHERE s.id = NEW.snapshot_id FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'dataset example refers to snapshot %, which does not exist', NEW.snapshot_id
      USING ERRCODE = 'foreign_key_violation';
  END IF;
  -- now() is the transaction start: equal only in the transaction that created the snapshot.
  IF EXISTS (SELECT 1 FROM train.dataset_snapshot s
              WHERE s.id = NEW.snapshot_id AND s.set_hash IS NOT NULL AND s.created_at <> now()) THEN
    RAISE EXCEPTION 'snapshot is sealed: examples are added only while creating it'
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION train.dataset_example_insert_check_v1() FROM PUBLIC;

ALTER TABLE train.dataset_example DROP CONSTRAINT dataset_example_pkey;
CREATE INDEX dataset_example_snapshot_idx ON train.dataset_example (snapshot_id);

DROP TRIGGER dataset_example_insert_checked ON train.dataset_example;
CREATE TRIGGER dataset_example_insert_checked
  BEFORE INSERT ON train.dataset_example
  FOR EACH ROW
  WHEN (NEW.snapshot_id::text IS DISTINCT FROM current_setting('cft.writing_snapshot', true))
  EXECUTE FUNCTION train.dataset_example_insert_check_v1();

REVOKE INSERT ON train.dataset_example FROM cft_app;
