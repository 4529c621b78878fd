-- Who wrote an eval result (or ran a judge calibration), derived by the database from the
-- session, never taken from the writer:
--   * a session logged in as the schema owner (the API, the workers, migrations) may say for
--     whom it acts, transaction- or session-locally: cft.key_id (the API, for the request's
--     authenticated key: app.core.db.as_key) or cft.evaluator (the evaluator worker, for its
--     whole connection). Any other session's settings are ignored: a cft_app or cft_release
--     login can set any cft.* placeholder, so only the owner's can be believed.
--   * otherwise the SQL role writing: 'owner' (the owner or a superuser), 'release'
--     (cft_release), 'app' (cft_app), 'dashboard' (cft_dashboard), 'other'.
-- author_role is what train.promotion_policy.trusted_authors names.

-- Owner rights: the role and prefix of a live key, for the owner's sessions only (no one else may
-- learn about keys through it).
CREATE OR REPLACE FUNCTION train.key_author(p_key_id bigint)
RETURNS TABLE (role text, prefix text, tenant_id int)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
  SELECT k.role, k.prefix, k.tenant_id FROM auth.api_key k
   WHERE k.id = p_key_id AND k.revoked_at IS NULL
     AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = 'train.eval_result'::regclass
                    AND pg_has_role(session_user, c.relowner, 'USAGE'))
$$;
REVOKE EXECUTE ON FUNCTION train.key_author(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION train.key_author(bigint) TO cft_app, cft_release;

-- The author of what the current session writes now (see above).
CREATE OR REPLACE FUNCTION train.current_author()
RETURNS TABLE (author_kind text, author_role text, author_key_id bigint, author text,
               key_tenant_id int)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  v_owner     oid := (SELECT c.relowner FROM pg_class c WHERE c.oid = 'train.eval_result'::regclass);
  v_trusted   boolean;
  v_key       text := nullif(current_setting('cft.key_id', true), '');
  v_evaluator text := nullif(current_setting('cft.evaluator', true), '');
  k           record;
BEGIN
  v_trusted := pg_has_role(session_user, v_owner, 'USAGE');
  IF v_trusted AND v_key IS NOT NULL THEN
    SELECT * INTO k FROM train.key_author(v_key::bigint);
    IF NOT FOUND THEN
      RAISE insufficient_privilege USING
        MESSAGE = format('cft.key_id %s names no live API key', v_key);
    END IF;
    RETURN QUERY SELECT 'key'::text, k.role, v_key::bigint,
      format('key %s (%s, role %s)', v_key, k.prefix, k.role), k.tenant_id;
  ELSIF v_trusted AND v_evaluator IS NOT NULL THEN
    RETURN QUERY SELECT 'evaluator'::text, 'evaluator'::text, NULL::bigint,
      'evaluator ' || v_evaluator, NULL::int;
  ELSE
    RETURN QUERY SELECT 'sql'::text,
      CASE WHEN pg_has_role(current_user, v_owner, 'USAGE') THEN 'owner'
           WHEN pg_has_role(current_user, 'cft_release', 'USAGE') THEN 'release'
           WHEN pg_has_role(current_user, 'cft_app', 'USAGE') THEN 'app'
           WHEN pg_has_role(current_user, 'cft_dashboard', 'USAGE') THEN 'dashboard'
           ELSE 'other' END,
      NULL::bigint,
      'sql role ' || current_user::text
        || CASE WHEN session_user <> current_user THEN ' (session ' || session_user::text || ')'
                ELSE '' END,
      NULL::int;
  END IF;
END
$$;

-- Every result written makes the writing session its author and now its time, whatever the
-- statement says about those columns.
CREATE OR REPLACE FUNCTION train.eval_result_author() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  a record;
BEGIN
  SELECT * INTO a FROM train.current_author();
  IF a.author_kind = 'key' AND a.key_tenant_id IS DISTINCT FROM
       (SELECT s.tenant_id FROM serve.adapter s WHERE s.id = NEW.adapter_id) THEN
    RAISE insufficient_privilege USING
      MESSAGE = format('key %s may not write results of adapter %s', a.author_key_id, NEW.adapter_id);
  END IF;
  NEW.author_kind := a.author_kind;
  NEW.author_role := a.author_role;
  NEW.author_key_id := a.author_key_id;
  NEW.author := a.author;
  NEW.judged_at := clock_timestamp();
  RETURN NEW;
END
$$;
CREATE OR REPLACE TRIGGER eval_result_author BEFORE INSERT ON train.eval_result
  FOR EACH ROW EXECUTE FUNCTION train.eval_result_author();

-- Results are facts: no UPDATE, DELETE or TRUNCATE, whoever asks (a correction is a new row).
-- The one way out is offboarding the adapter's tenant (auth.offboard_tenant sets
-- cft.offboarding_tenant for its transaction; only roles that may DELETE results, the owner,
-- get here).
CREATE OR REPLACE FUNCTION train.eval_result_immutable() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  IF TG_OP = 'DELETE' AND (SELECT a.tenant_id::text FROM serve.adapter a WHERE a.id = OLD.adapter_id)
                          = current_setting('cft.offboarding_tenant', true) THEN
    RETURN OLD;
  END IF;
  RAISE EXCEPTION 'eval results are facts: % refused (record a correction as a new result;'
    ' the newest per author counts)', TG_OP
    USING ERRCODE = 'object_not_in_prerequisite_state';
END
$$;
CREATE OR REPLACE TRIGGER eval_result_immutable BEFORE UPDATE OR DELETE ON train.eval_result
  FOR EACH ROW EXECUTE FUNCTION train.eval_result_immutable();
CREATE OR REPLACE TRIGGER eval_result_no_truncate BEFORE TRUNCATE ON train.eval_result
  FOR EACH STATEMENT EXECUTE FUNCTION train.eval_result_immutable();

-- The release role records results too (its own or an external harness's): shown and audited;
-- they count only where a rule names release in trusted_authors.
GRANT INSERT ON train.eval_result TO cft_release;
DROP POLICY IF EXISTS release_write ON train.eval_result;
CREATE POLICY release_write ON train.eval_result FOR INSERT TO cft_release WITH CHECK (true);
