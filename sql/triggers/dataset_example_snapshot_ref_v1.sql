-- train.dataset_example -> train.dataset_snapshot, checked once per statement instead of once
-- per row. The declared FOREIGN KEY ran one RI query per inserted example (a third of the time
-- a snapshot spent writing its examples); these triggers give the same guarantees:
--   * examples inserted: every distinct snapshot_id of the statement (one, when a snapshot is
--     built) must exist; the snapshot rows are locked FOR KEY SHARE, as the RI check locks them,
--     so a concurrent DELETE of that draft waits for this transaction, or this check fails.
--     The same pass applies the sealed-snapshot rule of dataset_example_insert_frozen (examples
--     only in the transaction that created the snapshot), which this trigger replaces: one scan
--     of the inserted rows instead of two, and no index probe per row;
--   * an example's snapshot_id changed: the new snapshot must exist (locked the same way);
--   * a snapshot deleted: its examples are deleted with it (ON DELETE CASCADE, as before; a
--     sealed snapshot still cannot be deleted at all, see dataset_snapshot_immutable_v1.sql);
--   * a snapshot's id changed while it has examples: refused (NO ACTION, as before).
-- TRUNCATE of either table is refused by the immutability triggers. Errors use SQLSTATE 23503
-- (foreign_key_violation), like the constraint did.

CREATE OR REPLACE FUNCTION train.dataset_example_snapshot_ref_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  v_ids     uuid[];
  v_missing uuid;
BEGIN
  IF TG_LEVEL = 'ROW' THEN  -- UPDATE OF snapshot_id (the WHEN clause: it changed)
    PERFORM 1 FROM train.dataset_snapshot s WHERE s.id = NEW.snapshot_id FOR KEY SHARE;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'dataset example refers to snapshot %, which does not exist', NEW.snapshot_id
        USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NEW;
  END IF;
  SELECT array_agg(d.snapshot_id) INTO v_ids FROM (SELECT DISTINCT snapshot_id FROM new_rows) d;
  PERFORM 1 FROM train.dataset_snapshot s WHERE s.id = ANY (v_ids) FOR KEY SHARE;
  SELECT i INTO v_missing
    FROM unnest(v_ids) i
   WHERE NOT EXISTS (SELECT 1 FROM train.dataset_snapshot s WHERE s.id = i)
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'dataset example refers to snapshot %, which does not exist', v_missing
      USING ERRCODE = 'foreign_key_violation';
  END IF;
  -- now() is the transaction start: equal only in the transaction that created the snapshot.
  IF EXISTS (SELECT 1 FROM train.dataset_snapshot s
              WHERE s.id = ANY (v_ids) AND s.set_hash IS NOT NULL AND s.created_at <> now()) THEN
    RAISE EXCEPTION 'snapshot is sealed: examples are added only while creating it'
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION train.dataset_snapshot_example_ref_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN  -- statement level: cascade to the deleted drafts' examples
    DELETE FROM train.dataset_example e USING old_rows o WHERE e.snapshot_id = o.id;
    RETURN NULL;
  END IF;
  -- UPDATE OF id (the WHEN clause: it changed)
  IF EXISTS (SELECT 1 FROM train.dataset_example e WHERE e.snapshot_id = OLD.id) THEN
    RAISE EXCEPTION 'snapshot % still has examples: its id cannot change', OLD.id
      USING ERRCODE = 'foreign_key_violation';
  END IF;
  RETURN NEW;
END
$$;

ALTER TABLE train.dataset_example DROP CONSTRAINT dataset_example_snapshot_id_fkey;

DROP TRIGGER dataset_example_insert_frozen ON train.dataset_example;
CREATE TRIGGER dataset_example_insert_checked
  AFTER INSERT ON train.dataset_example REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION train.dataset_example_snapshot_ref_v1();
CREATE TRIGGER dataset_example_snapshot_moved
  BEFORE UPDATE OF snapshot_id ON train.dataset_example
  FOR EACH ROW WHEN (NEW.snapshot_id IS DISTINCT FROM OLD.snapshot_id)
  EXECUTE FUNCTION train.dataset_example_snapshot_ref_v1();
CREATE TRIGGER dataset_snapshot_cascade_examples
  AFTER DELETE ON train.dataset_snapshot REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION train.dataset_snapshot_example_ref_v1();
CREATE TRIGGER dataset_snapshot_id_referenced
  BEFORE UPDATE OF id ON train.dataset_snapshot
  FOR EACH ROW WHEN (NEW.id IS DISTINCT FROM OLD.id)
  EXECUTE FUNCTION train.dataset_snapshot_example_ref_v1();

REVOKE ALL ON FUNCTION train.dataset_example_snapshot_ref_v1() FROM PUBLIC;
REVOKE ALL ON FUNCTION train.dataset_snapshot_example_ref_v1() FROM PUBLIC;
