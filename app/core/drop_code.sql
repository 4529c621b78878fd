-- Remove the code of sql/ from a database before `cft migrate` applies it again (and before any
-- state migration runs), so that the code left is exactly what sql/ says: a function whose
-- signature or return type changed, a view whose columns changed, or an object deleted from
-- sql/ are all handled the same way. In p_schemas, leaving the objects of extensions alone:
--   * policies and triggers;
--   * column defaults that call a function of these schemas (a code file sets them again);
--   * views, materialised views and functions, each dropped once nothing depends on it any more.
--     Never CASCADE: if a table, an index or a constraint depends on one of them, the DROP fails
--     and so does the migration, instead of losing data;
--   * on what stays (schemas, tables, sequences, types): the privileges of PUBLIC and of cft's
--     roles (sql/state/core/roles.sql), row-level security and comments.
-- Runs inside the migration's transaction: nobody sees the database without its code.
CREATE FUNCTION pg_temp.drop_code(p_schemas text[]) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
  v_roles   constant text := 'cft_app, cft_release, cft_dashboard';
  v_dropped int := 0;
  v_left    int;
  v_moved   boolean;
  v_last    text;
  r         record;
BEGIN
  FOR r IN SELECT p.polname, p.polrelid::regclass AS rel
             FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
            WHERE c.relnamespace::regnamespace::text = ANY (p_schemas) LOOP
    EXECUTE format('DROP POLICY %I ON %s', r.polname, r.rel);
  END LOOP;
  -- A trigger cloned onto a partition (tgparentid) goes with its parent's.
  FOR r IN SELECT t.tgname, t.tgrelid::regclass AS rel
             FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
            WHERE c.relnamespace::regnamespace::text = ANY (p_schemas)
              AND NOT t.tgisinternal AND t.tgparentid = 0 LOOP
    EXECUTE format('DROP TRIGGER %I ON %s', r.tgname, r.rel);
  END LOOP;
  FOR r IN SELECT DISTINCT d.adrelid::regclass AS rel, a.attname
             FROM pg_attrdef d
             JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
             JOIN pg_depend dep ON dep.classid = 'pg_attrdef'::regclass AND dep.objid = d.oid
                               AND dep.refclassid = 'pg_proc'::regclass
             JOIN pg_proc p ON p.oid = dep.refobjid
            WHERE p.pronamespace::regnamespace::text = ANY (p_schemas) LOOP
    EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP DEFAULT', r.rel, r.attname);
  END LOOP;

  LOOP
    v_left := 0;
    v_moved := false;
    FOR r IN SELECT 1 AS pass,
                    CASE c.relkind WHEN 'v' THEN 'VIEW' ELSE 'MATERIALIZED VIEW' END AS kind,
                    c.oid::regclass::text AS name
               FROM pg_class c
              WHERE c.relkind IN ('v', 'm') AND c.relnamespace::regnamespace::text = ANY (p_schemas)
                AND NOT EXISTS (SELECT 1 FROM pg_depend e WHERE e.classid = 'pg_class'::regclass
                                   AND e.objid = c.oid AND e.deptype = 'e')
             UNION ALL
             SELECT 2, CASE p.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE'
                                      ELSE 'FUNCTION' END,
                    p.oid::regprocedure::text
               FROM pg_proc p
              WHERE p.pronamespace::regnamespace::text = ANY (p_schemas)
                AND NOT EXISTS (SELECT 1 FROM pg_depend e WHERE e.classid = 'pg_proc'::regclass
                                   AND e.objid = p.oid AND e.deptype = 'e')
              ORDER BY 1, 3 LOOP
      BEGIN
        EXECUTE format('DROP %s %s', r.kind, r.name);
        v_dropped := v_dropped + 1;
        v_moved := true;
      EXCEPTION WHEN dependent_objects_still_exist THEN
        v_left := v_left + 1;
        v_last := format('DROP %s %s', r.kind, r.name);
      END;
    END LOOP;
    EXIT WHEN v_left = 0;
    IF NOT v_moved THEN
      -- Something that is not code depends on what is left: let PostgreSQL name it.
      EXECUTE v_last;
    END IF;
  END LOOP;

  -- Only where a privilege was granted (a NULL ACL is the owner's default: left NULL).
  FOR r IN SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END AS kind,
                  c.oid::regclass AS rel
             FROM pg_class c
            WHERE c.relnamespace::regnamespace::text = ANY (p_schemas)
              AND c.relkind IN ('r', 'p', 'S', 'f') AND c.relacl IS NOT NULL LOOP
    EXECUTE format('REVOKE ALL ON %s %s FROM PUBLIC, %s', r.kind, r.rel, v_roles);
  END LOOP;
  FOR r IN SELECT a.attrelid::regclass AS rel, a.attname
             FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
            WHERE c.relnamespace::regnamespace::text = ANY (p_schemas)
              AND c.relkind IN ('r', 'p', 'f') AND a.attacl IS NOT NULL LOOP
    EXECUTE format('REVOKE ALL (%I) ON %s FROM PUBLIC, %s', r.attname, r.rel, v_roles);
  END LOOP;
  FOR r IN SELECT n.nspname FROM pg_namespace n
            WHERE n.nspname = ANY (p_schemas) AND n.nspacl IS NOT NULL LOOP
    EXECUTE format('REVOKE ALL ON SCHEMA %I FROM %s', r.nspname, v_roles);
  END LOOP;
  FOR r IN SELECT c.oid::regclass AS rel
             FROM pg_class c
            WHERE c.relnamespace::regnamespace::text = ANY (p_schemas)
              AND (c.relrowsecurity OR c.relforcerowsecurity) LOOP
    EXECUTE format('ALTER TABLE %s NO FORCE ROW LEVEL SECURITY, DISABLE ROW LEVEL SECURITY', r.rel);
  END LOOP;
  -- Comments on what stays, found through pg_identify_object; the public schema keeps its own.
  FOR r IN SELECT o.type, o.identity
             FROM pg_description d
             CROSS JOIN LATERAL pg_identify_object(d.classoid, d.objoid, d.objsubid) o
            WHERE d.classoid IN ('pg_class'::regclass, 'pg_namespace'::regclass,
                                 'pg_type'::regclass, 'pg_constraint'::regclass)
              AND d.objoid >= 16384
              AND (o.schema = ANY (p_schemas)
                   OR (o.type = 'schema' AND o.identity = ANY (p_schemas)
                       AND o.identity <> 'public'))
              AND NOT EXISTS (SELECT 1 FROM pg_depend e WHERE e.classid = d.classoid
                                 AND e.objid = d.objoid AND e.deptype = 'e') LOOP
    EXECUTE format('COMMENT ON %s %s IS NULL',
                   CASE r.type WHEN 'table column' THEN 'COLUMN'
                               WHEN 'composite type column' THEN 'COLUMN'
                               WHEN 'composite type' THEN 'TYPE'
                               WHEN 'table constraint' THEN 'CONSTRAINT'
                               ELSE upper(r.type) END,
                   CASE r.type WHEN 'table constraint' THEN replace(r.identity, ' on ', ' ON ')
                               ELSE r.identity END);
  END LOOP;
  RETURN v_dropped;
END
$$;
