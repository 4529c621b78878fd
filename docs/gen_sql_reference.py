"""Write docs/reference/sql.md from the database's own COMMENT ON.

Applies sql/ (manifest order) to a fresh database on a throw-away embedded PostgreSQL and lists
every table, view, column, type and function of cft's schemas with its comment, read back from
pg_description. Run it after changing a comment or an object in sql/:

    .venv/bin/python docs/gen_sql_reference.py

tests/unit/test_sql_reference.py regenerates the page and fails when the committed one differs.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core import embedded  # noqa: E402
from app.core.config import Settings  # noqa: E402
from app.core.sqlfiles import apply_schema  # noqa: E402

OUTPUT = ROOT / "docs" / "reference" / "sql.md"
REFRESH = ".venv/bin/python docs/gen_sql_reference.py"
# The embedding column's dimension is a placeholder in sql/; the page shows the default.
EMBEDDING_DIM = int(Settings.model_fields["embedding_dim"].default)
SCHEMA_FILTER = "n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'"
# Objects that belong to an extension (pgvector's types, operators, functions) are not cft's.
NOT_EXTENSION = (
    "NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = {cat}::regclass"
    " AND d.objid = {oid} AND d.deptype = 'e')"
)

SCHEMA_COMMENTS_SQL = """
SELECT nspname, obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = ANY(%s)
"""

RELATIONS_SQL = f"""
SELECT n.nspname, c.relname, c.relkind::text AS relkind, c.oid,
       obj_description(c.oid, 'pg_class') AS comment
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE {SCHEMA_FILTER}
   AND c.relkind IN ('r', 'p', 'v', 'm')
   AND NOT c.relispartition
   AND {NOT_EXTENSION.format(cat="'pg_class'", oid="c.oid")}
 ORDER BY n.nspname, c.relname
"""

COLUMNS_SQL = """
SELECT a.attrelid AS oid, a.attname, format_type(a.atttypid, a.atttypmod) AS type,
       a.attnotnull, col_description(a.attrelid, a.attnum) AS comment
  FROM pg_attribute a
 WHERE a.attrelid = ANY(%s) AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attrelid, a.attnum
"""

TYPES_SQL = f"""
SELECT n.nspname, t.typname, t.typtype::text AS typtype,
       CASE t.typtype
         WHEN 'e' THEN (SELECT string_agg(quote_literal(e.enumlabel), ', ' ORDER BY e.enumsortorder)
                          FROM pg_enum e WHERE e.enumtypid = t.oid)
         WHEN 'd' THEN format_type(t.typbasetype, t.typtypmod)
         WHEN 'c' THEN (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod),
                                          ', ' ORDER BY a.attnum)
                          FROM pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0
                           AND NOT a.attisdropped)
       END AS definition,
       obj_description(t.oid, 'pg_type') AS comment
  FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
 WHERE {SCHEMA_FILTER}
   AND (t.typtype IN ('e', 'd')
        OR (t.typtype = 'c' AND (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c'))
   AND {NOT_EXTENSION.format(cat="'pg_type'", oid="t.oid")}
 ORDER BY n.nspname, t.typname
"""

FUNCTIONS_SQL = f"""
SELECT n.nspname, p.proname, p.prokind::text AS prokind,
       pg_get_function_identity_arguments(p.oid) AS args,
       pg_get_function_result(p.oid) AS result,
       p.prosecdef, obj_description(p.oid, 'pg_proc') AS comment
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE {SCHEMA_FILTER}
   AND {NOT_EXTENSION.format(cat="'pg_proc'", oid="p.oid")}
 ORDER BY n.nspname, p.proname, pg_get_function_identity_arguments(p.oid)
"""

KINDS = {"r": "table", "p": "partitioned table", "v": "view", "m": "materialised view"}
TYPE_KINDS = {"e": "enum", "d": "domain", "c": "composite type"}


def _text(value: str | None) -> str:
    """A comment as one line of Markdown table cell: no raw HTML, no stray emphasis or pipes."""
    if not value:
        return ""
    one = " ".join(value.split())
    return one.replace("&", "&amp;").replace("<", "&lt;").replace("|", "\\|").replace("*", "\\*")


def _code(value: str) -> str:
    """Inline code that survives a table cell."""
    return "`" + value.replace("|", "\\|") + "`"


def _qualified(schema: str, name: str) -> str:
    return name if schema == "public" else f"{schema}.{name}"


def render(conn: psycopg.Connection[Any]) -> str:
    """The reference page for the database behind conn (every cft schema, from the catalog)."""
    relations = conn.execute(RELATIONS_SQL).fetchall()
    columns: dict[int, list[tuple[Any, ...]]] = {}
    for oid, *rest in conn.execute(COLUMNS_SQL, ([r[3] for r in relations],)).fetchall():
        columns.setdefault(oid, []).append(tuple(rest))
    types = conn.execute(TYPES_SQL).fetchall()
    functions = conn.execute(FUNCTIONS_SQL).fetchall()
    names = {r[0] for r in relations} | {t[0] for t in types} | {f[0] for f in functions}
    comments = dict(conn.execute(SCHEMA_COMMENTS_SQL, (sorted(names),)).fetchall())
    schemas = [(s, comments.get(s)) for s in sorted(names, key=lambda s: (s != "public", s))]

    out = [
        "# SQL reference",
        "",
        "Every table, view, column, type and function of cft's schemas, with the comment the",
        "database itself holds (`COMMENT ON`, read from `pg_description`). Generated from a fresh",
        "apply of `sql/` by `docs/gen_sql_reference.py`: do not edit this page; change the comment",
        f"in `sql/` and run `{REFRESH}`. Objects of the `vector` extension are left out;",
        "an empty description means the object has no comment yet.",
        "",
        "Schemas: "
        + ", ".join(f"[`{s}`](#schema-{s})" for s, _ in schemas)
        + ". The page [The database](../database.md) explains how they fit together.",
        "",
    ]
    for schema, comment in schemas:
        out += [f"## Schema `{schema}` {{ #schema-{schema} }}", ""]
        if comment:
            out += [_text(comment), ""]
        for nsp, name, relkind, oid, rel_comment in relations:
            if nsp != schema:
                continue
            qname = _qualified(nsp, name)
            out += [
                f"### `{qname}`",
                "",
                f"*{KINDS[relkind]}*" + (". " + _text(rel_comment) if rel_comment else ""),
                "",
            ]
            out += ["| column | type | description |", "|---|---|---|"]
            for attname, typ, notnull, col_comment in columns.get(oid, []):
                typ_cell = _code(typ) + (" not null" if notnull and relkind in "rp" else "")
                out.append(f"| `{attname}` | {typ_cell} | {_text(col_comment)} |")
            out.append("")
        own_types = [t for t in types if t[0] == schema]
        if own_types:
            out += [
                f"### Types in `{schema}`",
                "",
                "| type | kind | definition | description |",
                "|---|---|---|---|",
            ]
            for nsp, name, typtype, definition, type_comment in own_types:
                kind, shown = TYPE_KINDS[typtype], _code(definition or "")
                out.append(
                    f"| `{_qualified(nsp, name)}` | {kind} | {shown} | {_text(type_comment)} |"
                )
            out.append("")
        own_functions = [f for f in functions if f[0] == schema]
        if own_functions:
            out += [
                f"### Functions in `{schema}`",
                "",
                "| function | returns | description |",
                "|---|---|---|",
            ]
            for nsp, name, prokind, args, result, secdef, fn_comment in own_functions:
                notes = []
                if prokind == "p":
                    notes.append("procedure")
                if prokind == "a":
                    notes.append("aggregate")
                if secdef:
                    notes.append("security definer")
                note = f"*{', '.join(notes)}.* " if notes else ""
                out.append(
                    f"| {_code(f'{_qualified(nsp, name)}({args})')} | {_code(result or 'void')} "
                    f"| {(note + _text(fn_comment)).strip()} |"
                )
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _with_database(url: str, dbname: str) -> str:
    base, _, query = url.partition("?")
    return f"{base.rsplit('/', 1)[0]}/{dbname}" + (f"?{query}" if query else "")


def render_fresh(server_url: str, dbname: str = "cft_sql_reference") -> str:
    """Apply sql/ to a new database on server_url, render the page, drop the database."""
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{dbname}"')
    try:
        with psycopg.connect(_with_database(server_url, dbname), autocommit=True) as conn:
            apply_schema(conn, embedding_dim=EMBEDDING_DIM)
            return render(conn)
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def main() -> None:
    """Start a throw-away embedded server, render the page into docs/reference/sql.md."""
    pgdata = Path(tempfile.mkdtemp(prefix="cft-sqlref-")) / "pg"
    url = embedded.start(pgdata)
    try:
        OUTPUT.write_text(render_fresh(url))
    finally:
        embedded.stop(pgdata, mode="immediate")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
