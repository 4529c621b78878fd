"""Dashboard login and logout, and the stylesheet every page links.

Login checks the posted key once and starts a server-side session (sessions.py): the cookie
holds the session token, never the key. Both forms carry a CSRF token."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response

from app.core.auth import lookup
from app.core.config import Settings
from app.core.errors import database_required
from app.dashboard import sessions
from app.dashboard.layout import (
    COOKIE_PATH,
    CSRF_COOKIE,
    OLD_KEY_COOKIE,
    SESSION_COOKIE,
    PoolDep,
    logged_out,
    login_page,
    message_page,
    reader,
    secure,
)
from app.dashboard.templating import render

router = APIRouter(include_in_schema=False)

CSRF_REFUSED = (
    "this form expired or was posted from another page (missing or wrong CSRF token):"
    " reload the page and try again"
)
ADMIN_REFUSED = (
    "an admin key cannot log in to the dashboard, which only reads: log in with a key of role"
    " reader (cft key create --tenant <name> --role reader)"
)
STYLESHEET = render("style.css")


async def form_fields(request: Request) -> dict[str, str]:
    """The fields of an application/x-www-form-urlencoded body (first value of each)."""
    form = parse_qs((await request.body()).decode(errors="replace"))
    return {k: v[0] for k, v in form.items() if v}


Form = Annotated[dict[str, str], Depends(form_fields)]


@router.get("/dashboard/style.css")
def stylesheet() -> Response:
    """The dashboard's stylesheet (the pages' policy allows no inline style)."""
    return Response(
        STYLESHEET, media_type="text/css", headers={"Cache-Control": "public, max-age=300"}
    )


@router.get("/dashboard/login")
def login_form(request: Request, pool: PoolDep) -> Response:
    """The login form, or the overview for a browser already logged in."""
    if reader(request, pool) is not None:
        return RedirectResponse("/dashboard", status_code=303)
    return login_page(request)


@router.post("/dashboard/login")
def login(request: Request, pool: PoolDep, form: Form) -> Response:
    """Check the form's CSRF token and the posted key; start a session for a reading key."""
    if not sessions.same(form.get("csrf"), request.cookies.get(CSRF_COOKIE)):
        return login_page(request, CSRF_REFUSED, 403)
    token = form.get("key", "").strip()
    if not token:
        return login_page(request, "enter a key", 400)
    settings: Settings = request.app.state.settings
    with database_required(), pool.connection() as conn:
        key = lookup(conn, token)
        if key is None:
            return login_page(request, "invalid or revoked key", 401)
        if key.role == "admin":
            return login_page(request, ADMIN_REFUSED, 403)
        if key.role not in sessions.READER_ROLES:
            roles = ", ".join(sorted(sessions.READER_ROLES))
            return login_page(
                request, f"a key with role {key.role} cannot read the dashboard: use {roles}", 403
            )
        ttl = timedelta(hours=settings.dashboard_session_hours)
        session = sessions.create(conn, key=key, ttl=ttl)
    response = RedirectResponse("/dashboard", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        session,
        httponly=True,
        samesite="strict",
        secure=secure(request),
        path=COOKIE_PATH,
        max_age=int(ttl.total_seconds()),
    )
    response.delete_cookie(CSRF_COOKIE, path=COOKIE_PATH)
    response.delete_cookie(OLD_KEY_COOKIE, path=COOKIE_PATH)
    return response


@router.post("/dashboard/logout")
def logout(request: Request, pool: PoolDep, form: Form) -> Response:
    """End the session (its row is deleted, the cookie too)."""
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        if not sessions.same(form.get("csrf"), sessions.session_csrf(token)):
            return message_page(request, "log out", CSRF_REFUSED, active=None, status=403)
        with database_required(), pool.connection() as conn:
            sessions.delete(conn, token)
    return logged_out(RedirectResponse("/dashboard", status_code=303))
