-- Snapshots are immutable once sealed. A snapshot is sealed when its set_hash is set
-- (train.create_snapshot seals it in the transaction that creates it). A sealed snapshot's
-- frozen columns never change (only the taint marks, set when a user it was built from is
-- forgotten), it cannot be deleted (except by offboarding its tenant: auth.offboard_tenant),
-- and its examples can be neither changed nor removed (except by forgetting a user:
-- auth.forget_user deletes the examples built from their rows); new
-- examples are accepted only in the transaction that created it. An unsealed snapshot is a
-- draft: it may be filled, sealed or deleted.

CREATE OR REPLACE FUNCTION train.dataset_example_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  -- Forgetting a user (auth.forget_user sets this for its transaction; only the owner may
  -- DELETE examples at all) removes the examples built from their rows.
  IF TG_OP = 'DELETE' AND coalesce(current_setting('cft.forgetting', true), '') <> '' THEN
    RETURN OLD;
  END IF;
  IF TG_OP = 'TRUNCATE' OR EXISTS (SELECT 1 FROM train.dataset_snapshot s
                                    WHERE s.id = OLD.snapshot_id AND s.set_hash IS NOT NULL) THEN
    RAISE EXCEPTION 'examples of a sealed snapshot are immutable (% refused)', TG_OP
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END
$$;

CREATE OR REPLACE TRIGGER dataset_example_immutable
  BEFORE UPDATE OR DELETE ON train.dataset_example
  FOR EACH ROW EXECUTE FUNCTION train.dataset_example_immutable();
CREATE OR REPLACE TRIGGER dataset_example_no_truncate
  BEFORE TRUNCATE ON train.dataset_example
  FOR EACH STATEMENT EXECUTE FUNCTION train.dataset_example_immutable();

CREATE OR REPLACE FUNCTION train.dataset_snapshot_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    RAISE EXCEPTION 'dataset snapshots are immutable (TRUNCATE refused)'
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  IF OLD.set_hash IS NULL THEN  -- a draft
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
  END IF;
  -- Offboarding the tenant (auth.offboard_tenant sets this for its transaction; only roles
  -- that may DELETE snapshots, i.e. the owner, get here). Its examples go by the cascade,
  -- once the snapshot is gone.
  IF TG_OP = 'DELETE' AND OLD.tenant_id::text = current_setting('cft.offboarding_tenant', true) THEN
    RETURN OLD;
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

CREATE OR REPLACE TRIGGER dataset_snapshot_immutable
  BEFORE UPDATE OR DELETE ON train.dataset_snapshot
  FOR EACH ROW EXECUTE FUNCTION train.dataset_snapshot_immutable();
CREATE OR REPLACE TRIGGER dataset_snapshot_no_truncate
  BEFORE TRUNCATE ON train.dataset_snapshot
  FOR EACH STATEMENT EXECUTE FUNCTION train.dataset_snapshot_immutable();

-- train.dataset_example -> train.dataset_snapshot without a declared foreign key (a per-row RI
-- query was a third of the time a snapshot spent writing its examples); the triggers give its
-- guarantees: an example's snapshot exists (locked FOR KEY SHARE, as the RI check locks it, so a
-- concurrent DELETE of that draft waits), a moved example's new snapshot exists, a deleted
-- draft's examples go with it (a sealed snapshot cannot be deleted at all), and a snapshot's id
-- cannot change while it has examples. Errors use SQLSTATE 23503 (foreign_key_violation), like
-- the constraint did. TRUNCATE of either table is refused above.

CREATE OR REPLACE FUNCTION train.dataset_example_snapshot_ref() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN  -- UPDATE OF snapshot_id (the WHEN clause: it changed)
  PERFORM 1 FROM train.dataset_snapshot s WHERE s.id = NEW.snapshot_id FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'dataset example refers to snapshot %, which does not exist', NEW.snapshot_id
      USING ERRCODE = 'foreign_key_violation';
  END IF;
  RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION train.dataset_snapshot_example_ref() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
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

CREATE OR REPLACE TRIGGER dataset_example_snapshot_moved
  BEFORE UPDATE OF snapshot_id ON train.dataset_example
  FOR EACH ROW WHEN (NEW.snapshot_id IS DISTINCT FROM OLD.snapshot_id)
  EXECUTE FUNCTION train.dataset_example_snapshot_ref();
CREATE OR REPLACE TRIGGER dataset_snapshot_cascade_examples
  AFTER DELETE ON train.dataset_snapshot REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION train.dataset_snapshot_example_ref();
CREATE OR REPLACE TRIGGER dataset_snapshot_id_referenced
  BEFORE UPDATE OF id ON train.dataset_snapshot
  FOR EACH ROW WHEN (NEW.id IS DISTINCT FROM OLD.id)
  EXECUTE FUNCTION train.dataset_snapshot_example_ref();

REVOKE ALL ON FUNCTION train.dataset_example_snapshot_ref() FROM PUBLIC;
REVOKE ALL ON FUNCTION train.dataset_snapshot_example_ref() FROM PUBLIC;

-- Inserts. A snapshot writes all its examples in one statement (~384k at 1,000,000 log rows),
-- so two per-example costs are avoided: a primary key (one btree entry per example, in key
-- order: 1.2-1.5 s more at 1M rows than the plain index on snapshot_id) and a statement
-- trigger's transition table (a copy of every inserted row, ~0.25 s at 1M rows).
-- Every other insert is checked row by row: the snapshot exists and is locked FOR KEY SHARE,
-- as the foreign key did; a sealed snapshot takes no new examples. No example twice in a
-- snapshot is the writer's rule, not a constraint: a per-row probe for it would scan the
-- snapshot's examples so far (O(n^2) over a bulk insert) unless indexed, which is the key's
-- cost again. train.create_snapshot counts its distinct hashes in the pass that computes the
-- set_hash and refuses the snapshot if any repeats.
-- The writer names its own draft in the transaction-local setting cft.writing_snapshot (a
-- draft it inserted in the same transaction: it exists, is not sealed, and its hashes are
-- distinct); rows of that draft skip the per-row check. Only the owner may insert examples
-- (cft_app's snapshots go through the SECURITY DEFINER writer), so the setting lets no role
-- skip a check it could not drop.

CREATE OR REPLACE FUNCTION train.dataset_example_insert_check() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
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

CREATE OR REPLACE TRIGGER dataset_example_insert_checked
  BEFORE INSERT ON train.dataset_example
  FOR EACH ROW
  WHEN (NEW.snapshot_id::text IS DISTINCT FROM current_setting('cft.writing_snapshot', true))
  EXECUTE FUNCTION train.dataset_example_insert_check();
REVOKE ALL ON FUNCTION train.dataset_example_insert_check() FROM PUBLIC;
REVOKE INSERT ON train.dataset_example FROM cft_app;
