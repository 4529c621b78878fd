"""Database access: where the database is, the connection pool, per-tenant transactions."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg.sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from app.core import embedded, migrations
from app.core.config import Settings, get_settings
from app.core.errors import BadRequest, NotFound

Connection = psycopg.Connection[Any]
Pool = ConnectionPool[Any]


def database_url(settings: Settings | None = None, *, start: bool = True) -> str:
    """The libpq URL of the database; starts the embedded server when none is configured."""
    settings = settings or get_settings()
    if settings.database_url:
        return settings.database_url
    if start:
        return embedded.start(settings.pgdata)
    st = embedded.status(settings.pgdata)
    if st.url is None:
        raise RuntimeError(f"the embedded database at {settings.pgdata} is not running (cft db up)")
    return st.url


# The API process's login: not a superuser, a member of cft_owner (sql/state/core/roles.sql).
API_ROLE = "cft_api"


def api_database_url(url: str, settings: Settings | None = None) -> str:
    """The URL the API process logs in with: CFT_API_DATABASE_URL, else `url` as cft_api.

    A request transaction runs as cft_app (row-level security); RESET ROLE inside one returns
    to cft_api, which owns cft's schema through cft_owner but is no superuser: no server files,
    no programs, no other databases' roles.
    """
    settings = settings or get_settings()
    if settings.api_database_url:
        return settings.api_database_url
    params = conninfo_to_dict(url)
    params.pop("password", None)
    params["user"] = API_ROLE
    password = settings.api_db_password.get_secret_value()
    if password:
        params["password"] = password
    return make_conninfo("", **params)


def owning_tenant(
    conn: Connection,
    *,
    table: str,
    column: str,
    value: str,
    tenant: str | None,
    missing: str,
    shared: str,
    code: str,
) -> int:
    """The tenant whose `table` row has `column` = value, for commands that see every tenant
    (names are unique per tenant only): the tenant given (its name or id), else the only one
    with such a row. NotFound (`missing`, and `code`) when there is none; BadRequest when
    several tenants have one (`shared` names it) and none was given."""
    schema, name = table.split(".")
    query = psycopg.sql.SQL(
        "SELECT x.tenant_id FROM {table} x JOIN tenant t ON t.id = x.tenant_id"
        " WHERE x.{column} = %(value)s"
        "   AND (%(tenant)s::text IS NULL OR t.name = %(tenant)s OR t.id::text = %(tenant)s)"
        " ORDER BY x.tenant_id"
    ).format(table=psycopg.sql.Identifier(schema, name), column=psycopg.sql.Identifier(column))
    rows = (
        conn.cursor(row_factory=dict_row)
        .execute(query, {"value": value, "tenant": tenant})
        .fetchall()
    )
    if not rows:
        whose = f" for tenant {tenant!r}" if tenant else ""
        raise NotFound(f"{missing}{whose}", code=code)
    if len(rows) > 1:
        raise BadRequest(
            f"{len(rows)} tenants have {shared}: name one with --tenant", code="tenant_required"
        )
    return int(rows[0]["tenant_id"])


def connect(url: str | None = None, *, autocommit: bool = False) -> Connection:
    """A new connection returning rows as dicts."""
    return psycopg.connect(url or database_url(), autocommit=autocommit, row_factory=dict_row)


def make_pool(url: str, *, size: int, name: str = "cft-api") -> Pool:
    """A connection pool whose connections return dict rows."""
    return ConnectionPool(
        url,
        min_size=1,
        max_size=size,
        kwargs={"row_factory": dict_row, "application_name": name},
        open=True,
        timeout=10,
        # A connection that died with the server (restart, failover) is replaced when taken,
        # rather than failing the next request.
        check=ConnectionPool.check_connection,
    )


def as_tenant(conn: Connection, tenant_id: int) -> None:
    """Scope the current transaction to one tenant: row-level security does the rest."""
    # One round trip for both statements (the simple query protocol: the id is an int).
    conn.execute(
        f"SET LOCAL ROLE cft_app; SELECT set_config('cft.tenant_id', '{int(tenant_id)}', true)"
    )


def as_key(conn: Connection, key_id: int) -> None:
    """Name the API key the current transaction acts for (eval results' author, in SQL)."""
    conn.execute("SELECT set_config('cft.key_id', %s, true)", (str(int(key_id)),))


@contextmanager
def tenant_transaction(
    pool: Pool,
    tenant_id: int,
) -> Iterator[Connection]:
    """One transaction on behalf of one tenant; commits on success, rolls back on error."""
    with pool.connection() as conn, conn.transaction():
        as_tenant(conn, tenant_id)
        yield conn


def migrate(url: str | None = None) -> migrations.Outcome:
    """Bring the database's schema to sql/ (app/core/migrations.py)."""
    return migrations.run(url or database_url())


def server_versions(conn: Connection) -> dict[str, str]:
    """PostgreSQL and pgvector versions of the connected server."""
    row = conn.execute(
        "SELECT current_setting('server_version') AS postgres,"
        " (SELECT extversion FROM pg_extension WHERE extname = 'vector') AS pgvector"
    ).fetchone()
    assert row is not None
    return {"postgres": row["postgres"], "pgvector": row["pgvector"] or "not installed"}
