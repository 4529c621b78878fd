-- cft_owner owns cft's schemas and every object in them (the extension's objects aside), so
-- the API's login (cft_api, a member) has the owner's rights there and no superuser's anywhere.
-- Last of the code: objects made since (a migration's table, a partition) are taken over on the
-- next `cft migrate`, and every code file's function is re-created, then owned, here.
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN SELECT n.nspname FROM pg_namespace n
            WHERE n.nspname IN ('obs', 'serve', 'train', 'auth', 'stats', 'loop')
              AND n.nspowner <> 'cft_owner'::regrole LOOP
    EXECUTE format('ALTER SCHEMA %I OWNER TO cft_owner', r.nspname);
  END LOOP;
  -- Tables (their indexes, and the sequences of their identity and serial columns, follow),
  -- views, materialised views and free-standing sequences.
  FOR r IN SELECT c.oid::regclass AS rel, c.relkind FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname IN ('public', 'obs', 'serve', 'train', 'auth', 'stats', 'loop')
              AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
              AND c.relowner <> 'cft_owner'::regrole
              AND NOT EXISTS (SELECT 1 FROM pg_depend d
                               WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                                 AND (d.deptype = 'e'
                                      OR (c.relkind = 'S' AND d.deptype IN ('a', 'i')))) LOOP
    EXECUTE format('ALTER %s %s OWNER TO cft_owner',
      CASE r.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                     WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END,
      r.rel);
  END LOOP;
  FOR r IN SELECT p.oid::regprocedure AS fn, p.prokind FROM pg_proc p
             JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname IN ('public', 'obs', 'serve', 'train', 'auth', 'stats', 'loop')
              AND p.proowner <> 'cft_owner'::regrole
              AND NOT EXISTS (SELECT 1 FROM pg_depend d
                               WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                                 AND d.deptype = 'e') LOOP
    EXECUTE format('ALTER %s %s OWNER TO cft_owner',
      CASE r.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE' ELSE 'FUNCTION' END, r.fn);
  END LOOP;
  -- Free-standing types (composite, enum, domain); a table's row type and arrays follow.
  FOR r IN SELECT t.oid::regtype AS typ, t.typtype FROM pg_type t
             JOIN pg_namespace n ON n.oid = t.typnamespace
            WHERE n.nspname IN ('public', 'obs', 'serve', 'train', 'auth', 'stats', 'loop')
              AND t.typowner <> 'cft_owner'::regrole
              AND t.typelem = 0 AND t.typcategory <> 'A'
              AND (t.typrelid = 0
                   OR (SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid) = 'c')
              AND NOT EXISTS (SELECT 1 FROM pg_depend d
                               WHERE d.classid = 'pg_type'::regclass AND d.objid = t.oid
                                 AND d.deptype IN ('e', 'i', 'a')) LOOP
    EXECUTE format('ALTER %s %s OWNER TO cft_owner',
      CASE r.typtype WHEN 'd' THEN 'DOMAIN' ELSE 'TYPE' END, r.typ);
  END LOOP;
END
$$;
