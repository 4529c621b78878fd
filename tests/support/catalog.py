"""A database's schema as comparable data: what `sql/` and the migrations must agree on."""

from __future__ import annotations

from typing import Any

import psycopg

from app.core.migrations import SCHEMAS, TRACKING_TABLE

# Each query returns rows of text; a catalog is the set of rows per kind. Partitions of
# obs.inference_log are data (maintenance creates them by date), so they are left out.
QUERIES: dict[str, str] = {
    "columns": """
        SELECT c.table_schema || '.' || c.table_name, c.column_name, c.data_type,
               c.udt_name, c.is_nullable, coalesce(c.column_default, ''),
               -- the order among live columns (a dropped column leaves a gap in attnum)
               (row_number() OVER (PARTITION BY c.table_schema, c.table_name
                                   ORDER BY c.ordinal_position))::text
          FROM information_schema.columns c
         WHERE c.table_schema = ANY (%(schemas)s)
           AND c.table_name !~ '^inference_log_[0-9]{4}w[0-9]{2}$'""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
          FROM pg_constraint
         WHERE connamespace::regnamespace::text = ANY (%(schemas)s)
           AND conrelid::regclass::text !~ 'inference_log_[0-9]{4}w[0-9]{2}$'""",
    "indexes": """
        SELECT schemaname || '.' || indexname, indexdef FROM pg_indexes
         WHERE schemaname = ANY (%(schemas)s)
           AND tablename !~ '^inference_log_[0-9]{4}w[0-9]{2}$'""",
    "functions": """
        SELECT p.oid::regprocedure::text, pg_get_function_result(p.oid), p.prokind::text,
               p.prosecdef::text, p.provolatile::text, coalesce(p.proconfig::text, ''),
               md5(p.prosrc), coalesce(p.proacl::text, '')
          FROM pg_proc p
         WHERE p.pronamespace::regnamespace::text = ANY (%(schemas)s)
           AND NOT EXISTS (SELECT 1 FROM pg_depend d
                            WHERE d.objid = p.oid AND d.deptype = 'e')""",
    "views": """
        SELECT c.oid::regclass::text, c.relkind::text, pg_get_viewdef(c.oid),
               coalesce(c.reloptions::text, '')
          FROM pg_class c
         WHERE c.relnamespace::regnamespace::text = ANY (%(schemas)s)
           AND c.relkind IN ('v', 'm')""",
    "triggers": """
        SELECT t.tgrelid::regclass::text, t.tgname, pg_get_triggerdef(t.oid)
          FROM pg_trigger t
         WHERE NOT t.tgisinternal
           AND t.tgrelid::regclass::text !~ 'inference_log_[0-9]{4}w[0-9]{2}$'
           AND t.tgrelid::regclass::text <> 'obs.inference_log_default'
           AND t.tgparentid = 0""",
    "policies": """
        SELECT schemaname || '.' || tablename, policyname, permissive, roles::text, cmd,
               coalesce(qual, ''), coalesce(with_check, '')
          FROM pg_policies WHERE schemaname = ANY (%(schemas)s)""",
    "relations": """
        SELECT c.oid::regclass::text, c.relkind::text, c.relrowsecurity::text,
               -- the owner's default privileges, written out or not, are the same
               coalesce(nullif(c.relacl, acldefault(CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END::"char",
                                                    c.relowner))::text, ''),
               coalesce(obj_description(c.oid, 'pg_class'), '')
          FROM pg_class c
         WHERE c.relnamespace::regnamespace::text = ANY (%(schemas)s)
           AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
           AND c.relname !~ '^inference_log_[0-9]{4}w[0-9]{2}$'""",
    "column_comments": """
        SELECT c.oid::regclass::text, a.attname, d.description
          FROM pg_description d
          JOIN pg_class c ON c.oid = d.objoid
          JOIN pg_attribute a ON a.attrelid = d.objoid AND a.attnum = d.objsubid
         WHERE d.classoid = 'pg_class'::regclass AND d.objsubid > 0
           AND c.relnamespace::regnamespace::text = ANY (%(schemas)s)
           AND c.relname !~ '^inference_log_[0-9]{4}w[0-9]{2}$'""",
    "column_grants": """
        SELECT table_schema || '.' || table_name, column_name, grantee, privilege_type
          FROM information_schema.column_privileges
         WHERE table_schema = ANY (%(schemas)s)
           AND grantee IN ('cft_app', 'cft_release', 'cft_dashboard')""",
    "schemas": """
        SELECT n.nspname, coalesce(nullif(n.nspacl, acldefault('n'::"char", n.nspowner))::text, ''),
               coalesce(obj_description(n.oid, 'pg_namespace'), '')
          FROM pg_namespace n WHERE n.nspname = ANY (%(schemas)s)""",
    "extensions": "SELECT extname FROM pg_extension",
}


def catalog(url: str) -> dict[str, set[tuple[Any, ...]]]:
    """The schema of the database at `url`, one set of rows per kind of object."""
    # migrate's record of what it applied is not part of the schema sql/ defines.
    own = TRACKING_TABLE.split(".")[-1]
    with psycopg.connect(url) as conn:
        return {
            kind: {
                tuple(row)
                for row in conn.execute(sql, {"schemas": list(SCHEMAS)})
                if own not in str(row)
            }
            for kind, sql in QUERIES.items()
        }


def differences(
    a: dict[str, set[tuple[Any, ...]]], b: dict[str, set[tuple[Any, ...]]]
) -> list[str]:
    """Readable lines for every row that only one of two catalogs has."""
    out: list[str] = []
    for kind in QUERIES:
        out += [f"{kind}: only in the first: {row}" for row in sorted(a[kind] - b[kind], key=str)]
        out += [f"{kind}: only in the second: {row}" for row in sorted(b[kind] - a[kind], key=str)]
    return out
