"""Doors at the database level, tried as the attacker would: psql as cft_app scoped to tenant
alpha (and as cft_release), against tenant beta's route, adapter, audit and the global rules."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.factories import make_adapter, make_route, make_tenant


@pytest.fixture
def world(conn: Any) -> dict[str, Any]:
    alpha, beta = make_tenant(conn), make_tenant(conn)
    ra = make_route(conn, tenant_id=alpha["id"])
    rb = make_route(conn, tenant_id=beta["id"])
    prod = make_adapter(conn, route=rb, status="prod", traffic_pct=100)
    conn.execute(
        "INSERT INTO train.promotion_policy (route, suite_id, metric, direction)"
        " VALUES (NULL, 'house', 'pass_rate', 'higher') ON CONFLICT DO NOTHING"
    )
    return {"alpha": alpha, "ra": ra, "rb": rb, "prod": prod}


def as_alpha(conn: Any, world: dict[str, Any]) -> None:
    conn.execute("SET LOCAL ROLE cft_app")
    conn.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(world["alpha"]["id"]),))


def test_current_prod_tells_a_tenant_nothing_of_another_tenants_route(conn, world):
    with conn.transaction():
        as_alpha(conn, world)
        rb = (world["rb"]["tenant_id"], world["rb"]["name"])
        got = conn.execute("SELECT serve.current_prod(%s, %s) AS p", rb)
        assert got.fetchone()["p"] is None
        got = conn.execute("SELECT serve.previous_prod(%s) AS p", (world["prod"]["id"],))
        assert got.fetchone()["p"] is None
    with conn.transaction():  # the release role reads every tenant, as before
        conn.execute("SET LOCAL ROLE cft_release")
        rb = (world["rb"]["tenant_id"], world["rb"]["name"])
        got = conn.execute("SELECT serve.current_prod(%s, %s) AS p", rb)
        assert got.fetchone()["p"] == world["prod"]["id"]


@pytest.mark.parametrize("role", ["cft_app", "cft_release"])
def test_nobody_annotates_another_tenants_or_an_old_audit_event(conn, world, role):
    event = conn.execute(
        "SELECT id, detail FROM serve.adapter_event WHERE adapter_id = %s ORDER BY id DESC",
        (world["prod"]["id"],),
    ).fetchone()
    with conn.transaction():
        if role == "cft_app":
            as_alpha(conn, world)
        else:
            conn.execute("SET LOCAL ROLE cft_release")
        conn.execute(
            "SELECT serve.annotate_adapter_event(%s, '{\"forged\": true}')",
            (world["prod"]["id"],),
        )
    after = conn.execute(
        "SELECT detail FROM serve.adapter_event WHERE id = %s", (event["id"],)
    ).fetchone()
    assert after["detail"] == event["detail"]


def test_a_key_cannot_take_a_global_rule_for_its_route(conn, world):
    with conn.transaction():
        as_alpha(conn, world)
        n = conn.execute(
            "UPDATE train.promotion_policy SET route = %s WHERE route IS NULL",
            (world["ra"]["name"],),
        ).rowcount
        assert n == 0
        seen = conn.execute(
            "SELECT count(*) AS n FROM train.promotion_policy WHERE route IS NULL"
        ).fetchone()
        assert seen["n"] >= 1  # still read by every tenant
        # Its own route's rules it still writes.
        conn.execute(
            "INSERT INTO train.promotion_policy (tenant_id, route, suite_id, metric, direction)"
            " VALUES (%s, %s, 'house', 'pass_rate', 'higher')",
            (world["alpha"]["id"], world["ra"]["name"]),
        )
    assert (
        conn.execute(
            "SELECT count(*) AS n FROM train.promotion_policy WHERE route IS NULL AND suite_id = 'house'"
        ).fetchone()["n"]
        == 1
    )


def test_every_security_definer_function_searches_pg_temp_last(conn):
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text AS f, p.proconfig FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE p.prosecdef AND n.nspname IN ('public', 'obs', 'serve', 'train', 'auth', 'loop',"
        " 'stats')"
    ).fetchall()
    assert rows
    bad = []
    for r in rows:
        paths = [c for c in r["proconfig"] or [] if c.startswith("search_path=")]
        if not paths or not paths[0].replace(" ", "").endswith(",pg_temp"):
            bad.append((r["f"], paths))
    assert bad == []


def test_the_api_logs_in_as_a_role_that_is_no_superuser(db_url: str) -> None:
    """The API process's every connection is cft_api: RESET ROLE inside a request transaction
    (what an injection would try) leaves a role with the schema owner's rights, not a
    superuser's: no programs, no server files, no role changes."""
    import httpx
    import psycopg

    from app.core.db import api_database_url
    from app.main import create_app
    from tests.support.servers import serve_app

    with serve_app(create_app(db_url=db_url)) as base:
        assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
        with psycopg.connect(db_url) as admin:
            superuser = admin.execute("SELECT current_user").fetchone()[0]
            logins = admin.execute(
                "SELECT DISTINCT a.usename, r.rolsuper FROM pg_stat_activity a"
                "  JOIN pg_roles r ON r.oid = a.usesysid"
                " WHERE a.datname = current_database() AND a.application_name LIKE 'cft-%'"
            ).fetchall()
    assert logins and all(login == ("cft_api", False) for login in logins), logins

    with psycopg.connect(api_database_url(db_url)) as conn:
        conn.execute("SET LOCAL ROLE cft_app")
        conn.execute("RESET ROLE")
        assert conn.execute("SELECT current_setting('is_superuser')").fetchone() == ("off",)
        for attempt in (
            "COPY (SELECT 1) TO PROGRAM 'true'",
            "SELECT pg_read_file('/etc/hostname')",
            "ALTER ROLE cft_api SUPERUSER",
            f'SET ROLE "{superuser}"',
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
                conn.execute(attempt)
        # The owner's rights on cft's schema stay: the API reads every tenant's keys to
        # authenticate, and writes what requests ask.
        conn.execute("SELECT count(*) FROM auth.api_key").fetchone()
