-- Snapshots are immutable once sealed. A snapshot is sealed when its set_hash is set
-- (train.create_snapshot_v1 seals in the same statement that creates it). A sealed snapshot's
-- frozen columns never change (only the taint marks, set when a user it was built from is
-- forgotten), it cannot be deleted, and its examples can be neither changed nor removed; new
-- examples are accepted only in the transaction that created it. An unsealed snapshot is a
-- draft: it may be filled, sealed or deleted.

CREATE OR REPLACE FUNCTION train.dataset_example_immutable_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    -- now() is the transaction start: equal only in the transaction that created the snapshot.
    IF EXISTS (SELECT 1 FROM new_rows n JOIN train.dataset_snapshot s ON s.id = n.snapshot_id
                WHERE s.set_hash IS NOT NULL AND s.created_at <> now()) THEN
      RAISE EXCEPTION 'snapshot is sealed: examples are added only while creating it'
        USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN NULL;
  END IF;
  IF TG_OP = 'TRUNCATE' OR EXISTS (SELECT 1 FROM train.dataset_snapshot s
                                    WHERE s.id = OLD.snapshot_id AND s.set_hash IS NOT NULL) THEN
    RAISE EXCEPTION 'examples of a sealed snapshot are immutable (% refused)', TG_OP
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END
$$;

CREATE TRIGGER dataset_example_insert_frozen
  AFTER INSERT ON train.dataset_example REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION train.dataset_example_immutable_v1();
CREATE TRIGGER dataset_example_immutable
  BEFORE UPDATE OR DELETE ON train.dataset_example
  FOR EACH ROW EXECUTE FUNCTION train.dataset_example_immutable_v1();
CREATE TRIGGER dataset_example_no_truncate
  BEFORE TRUNCATE ON train.dataset_example
  FOR EACH STATEMENT EXECUTE FUNCTION train.dataset_example_immutable_v1();

CREATE OR REPLACE FUNCTION train.dataset_snapshot_immutable_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    RAISE EXCEPTION 'dataset snapshots are immutable (TRUNCATE refused)'
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  IF OLD.set_hash IS NULL THEN  -- a draft
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
  END IF;
  IF TG_OP = 'UPDATE'
     AND (NEW.id, NEW.tenant_id, NEW.route, NEW.method, NEW.query_sql, NEW.params, NEW.counts,
          NEW.n_train, NEW.n_eval, NEW.set_hash, NEW.created_by, NEW.created_at)
         IS NOT DISTINCT FROM
         (OLD.id, OLD.tenant_id, OLD.route, OLD.method, OLD.query_sql, OLD.params, OLD.counts,
          OLD.n_train, OLD.n_eval, OLD.set_hash, OLD.created_by, OLD.created_at) THEN
    RETURN NEW;  -- only tainted_at / tainted_reason changed
  END IF;
  RAISE EXCEPTION 'sealed dataset snapshots are immutable (% refused; only tainted_at and tainted_reason may change)', TG_OP
    USING ERRCODE = 'object_not_in_prerequisite_state';
END
$$;

CREATE TRIGGER dataset_snapshot_immutable
  BEFORE UPDATE OR DELETE ON train.dataset_snapshot
  FOR EACH ROW EXECUTE FUNCTION train.dataset_snapshot_immutable_v1();
CREATE TRIGGER dataset_snapshot_no_truncate
  BEFORE TRUNCATE ON train.dataset_snapshot
  FOR EACH STATEMENT EXECUTE FUNCTION train.dataset_snapshot_immutable_v1();
