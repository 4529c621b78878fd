"""Dashboard sessions over real HTTP: the cookie holds a session token, never the API key; forms
need their CSRF token; no page may be framed; a revoked key's session, an expired one and a
logged-out one stop working; an admin key is refused with a hint to use a reader key."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import routing

from app.core.auth import create_key
from app.main import create_app
from app.tenants import service as tenants
from tests.support.dashboard import csrf_of, login, logout
from tests.support.factories import make_adapter, make_route, make_tenant
from tests.support.servers import serve_app

SESSION = "cft_dashboard_session"
CSRF = "cft_dashboard_csrf"


@pytest.fixture
def world(conn: Any, db_url: str) -> Iterator[dict[str, Any]]:
    tenant = make_tenant(conn)
    route = make_route(conn, tenant_id=tenant["id"], name="sessions-route")
    make_adapter(conn, route=route, id="sessions-route-v1", status="prod", traffic_pct=100)
    keys = {
        role: create_key(conn, tenant_id=tenant["id"], role=role)
        for role in ("reader", "trainer", "release", "admin", "ingest")
    }
    with serve_app(create_app(db_url=db_url)) as base:
        yield {"base": base, "conn": conn, "keys": keys}


def _client(w: dict[str, Any]) -> httpx.Client:
    return httpx.Client(base_url=w["base"], timeout=30)


def _sessions(conn: Any) -> list[dict[str, Any]]:
    return conn.execute(  # type: ignore[no-any-return]
        "SELECT s.*, k.prefix FROM auth.dashboard_session s"
        " JOIN auth.api_key k ON k.id = s.api_key_id"
    ).fetchall()


def _logged_in(http: httpx.Client) -> bool:
    """Whether the dashboard shows its data (not the login form) to this client."""
    page = http.get("/dashboard", follow_redirects=False)
    assert page.status_code == 200, page.text[:300]
    return "sessions-route-v1" in page.text and 'name="key"' not in page.text


def test_login_sets_a_session_cookie_never_the_key(world: dict[str, Any]) -> None:
    key = world["keys"]["reader"]
    with _client(world) as http:
        resp = login(http, key)
        assert resp.status_code == 303 and resp.headers["location"] == "/dashboard"
        set_cookies = resp.headers.get_list("set-cookie")
        assert set_cookies and not [c for c in set_cookies if key in c], set_cookies
        (session,) = [c for c in set_cookies if c.startswith(SESSION + "=")]
        token = session.split(";")[0].split("=", 1)[1]
        assert token and token != key
        flags = session.lower()
        assert "httponly" in flags and "samesite=strict" in flags and "path=/dashboard" in flags
        assert "secure" not in flags  # plain http here; over https it is Secure (below)
        assert _logged_in(http)
    # Only the token's sha256 is stored; neither the key nor its hash is in the session table.
    (row,) = _sessions(world["conn"])
    assert bytes(row["token_hash"]) == hashlib.sha256(token.encode()).digest()
    assert bytes(row["token_hash"]) != hashlib.sha256(key.encode()).digest()
    assert row["prefix"] == key[:12]
    assert row["expires_at"] - row["created_at"] == timedelta(hours=12)
    # Behind a TLS proxy (X-Forwarded-Proto from a trusted address) the cookie is Secure.
    with _client(world) as http:
        https = {"X-Forwarded-Proto": "https"}
        form = http.get("/dashboard/login", headers=https)
        (csrf,) = [c for c in form.headers.get_list("set-cookie") if c.startswith(CSRF + "=")]
        assert "secure" in csrf.lower()
        resp = http.post(
            "/dashboard/login",
            data={"key": key, "csrf": csrf_of(form.text)},
            headers=https | {"Cookie": csrf.split(";")[0]},
        )
        assert resp.status_code == 303, resp.text[:300]
        (session,) = [c for c in resp.headers.get_list("set-cookie") if c.startswith(SESSION)]
        assert "secure" in session.lower()


def test_a_login_without_the_forms_csrf_token_is_refused(world: dict[str, Any]) -> None:
    key = world["keys"]["reader"]
    with _client(world) as http:
        # No token, no cookie: a post from another site's page.
        resp = http.post("/dashboard/login", data={"key": key})
        assert resp.status_code == 403 and "CSRF token" in resp.text, resp.text[:500]
        form = http.get("/dashboard/login")
        token = csrf_of(form.text)
        assert http.cookies.get(CSRF, path="/dashboard") == token
        # The cookie is there but the posted token is wrong or missing.
        for data in ({"key": key, "csrf": token + "x"}, {"key": key}, {"key": key, "csrf": ""}):
            resp = http.post("/dashboard/login", data=data)
            assert resp.status_code == 403 and "CSRF token" in resp.text, data
    with _client(world) as http:
        # The right token without its cookie (a SameSite=Strict cookie is not sent cross-site).
        resp = http.post("/dashboard/login", data={"key": key, "csrf": token})
        assert resp.status_code == 403 and "CSRF token" in resp.text
        assert not [c for c in resp.headers.get_list("set-cookie") if c.startswith(SESSION)]
    assert _sessions(world["conn"]) == []
    # With the form's token and its cookie, the same key logs in.
    with _client(world) as http:
        assert login(http, key).status_code == 303 and _logged_in(http)
        # Logging out needs the page's token too.
        assert http.post("/dashboard/logout", data={}).status_code == 403
        assert http.post("/dashboard/logout", data={"csrf": token}).status_code == 403
        assert _logged_in(http) and len(_sessions(world["conn"])) == 1


def test_every_dashboard_response_forbids_framing(world: dict[str, Any]) -> None:
    def check(resp: httpx.Response, label: str) -> None:
        assert resp.headers.get("x-frame-options") == "DENY", label
        csp = resp.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp, (label, csp)
        assert "script-src" not in csp and "unsafe-inline" not in csp, (label, csp)

    with _client(world) as http:
        check(http.get("/dashboard"), "login form")
        check(http.get("/dashboard/style.css"), "stylesheet")
        check(http.post("/dashboard/login", data={"key": "x"}), "refused login")
        resp = login(http, world["keys"]["reader"])
        check(resp, "login redirect")
        for path in (
            "/dashboard",
            "/dashboard/runs",
            "/dashboard/evals",
            "/dashboard/snapshots",
            "/dashboard/calls",
            "/dashboard/lineage",
            "/dashboard/lineage/sessions-route-v1",
            "/dashboard/lineage/no-such-adapter",
            "/dashboard/calls?before=yesterday",
            "/dashboard/experiments/none?window=forever",
        ):
            check(http.get(path), path)
        check(logout(http), "logout")
        # Not the API's business: the headers are the dashboard's.
        assert "x-frame-options" not in http.get("/healthz").headers


def test_a_revoked_keys_session_stops_working(world: dict[str, Any]) -> None:
    key = world["keys"]["trainer"]
    with _client(world) as http:
        assert login(http, key).status_code == 303 and _logged_in(http)
        tenants.revoke_key(world["conn"], key[:12])
        assert not _logged_in(http)
        assert 'name="key"' in http.get("/dashboard/runs").text
    # The revocation deleted the key's sessions, not only stopped them.
    assert _sessions(world["conn"]) == []


def test_an_expired_session_stops_working(world: dict[str, Any]) -> None:
    with _client(world) as http:
        assert login(http, world["keys"]["release"]).status_code == 303 and _logged_in(http)
        world["conn"].execute(
            "UPDATE auth.dashboard_session SET created_at = now() - interval '13 hours',"
            " expires_at = now() - interval '1 hour'"
        )
        assert not _logged_in(http)
        # The next login clears expired sessions away.
        assert login(http, world["keys"]["reader"]).status_code == 303
    assert [r["prefix"] for r in _sessions(world["conn"])] == [world["keys"]["reader"][:12]]


def test_logout_ends_the_session(world: dict[str, Any]) -> None:
    with _client(world) as http:
        assert login(http, world["keys"]["reader"]).status_code == 303
        token = http.cookies.get(SESSION, path="/dashboard")
        assert token and _logged_in(http)
        resp = logout(http)
        assert resp.status_code == 303
        (gone,) = [c for c in resp.headers.get_list("set-cookie") if c.startswith(SESSION)]
        assert "max-age=0" in gone.lower() or "expires=" in gone.lower()
        assert not _logged_in(http)
    assert _sessions(world["conn"]) == []
    # The old cookie, replayed, is a session no more.
    with _client(world) as http:
        http.cookies.set(SESSION, token, path="/dashboard")
        assert not _logged_in(http)


def test_an_admin_key_is_refused_with_a_hint_to_use_a_reader_key(world: dict[str, Any]) -> None:
    with _client(world) as http:
        resp = login(http, world["keys"]["admin"])
        assert resp.status_code == 403
        assert "admin key cannot log in" in resp.text and "--role reader" in resp.text
        assert not [c for c in resp.headers.get_list("set-cookie") if c.startswith(SESSION)]
        resp = login(http, world["keys"]["ingest"])
        assert resp.status_code == 403 and "role ingest cannot read" in resp.text
        assert login(http, "cft_" + "x" * 43).status_code == 401
    assert _sessions(world["conn"]) == []


def test_no_dashboard_handler_blocks_the_event_loop(db_url: str) -> None:
    """Handlers that query the database are plain functions: FastAPI runs them in its threads."""
    app = create_app(db_url=db_url, engine_urls=[])
    endpoints = {
        f"{sorted(rc.methods or ())} {rc.path}": rc.original_route.endpoint  # type: ignore[attr-defined]
        for rc in routing.iter_route_contexts(app.routes)
        if rc.path.startswith("/dashboard")
    }
    assert "['POST'] /dashboard/login" in endpoints and "['POST'] /dashboard/logout" in endpoints
    coroutines = [name for name, f in endpoints.items() if inspect.iscoroutinefunction(f)]
    assert coroutines == []
