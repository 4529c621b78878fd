"""What every dashboard page shares: the session behind the cookie, the page response, the
login form and its CSRF cookie, the headers every dashboard response carries.

Login posts an API key once; the browser gets a session token (sessions.py), never the key.
Every query runs as the session key's tenant (row-level security)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.auth import ApiKey
from app.core.db import Connection, Pool, tenant_transaction
from app.core.deps import get_pool
from app.core.errors import database_required
from app.dashboard import sessions
from app.dashboard.templating import render

SESSION_COOKIE = "cft_dashboard_session"
CSRF_COOKIE = "cft_dashboard_csrf"
# Where the API key itself was kept before sessions: deleted at login so no browser keeps it.
OLD_KEY_COOKIE = "cft_dashboard_key"
COOKIE_PATH = "/dashboard"
PREFIX = "/dashboard"
PoolDep = Annotated[Pool, Depends(get_pool)]

# Sent with every response under /dashboard: no other site may frame a page (clickjacking),
# nothing is loaded but the dashboard's own stylesheet, forms post only here.
SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self';"
        " base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


class DashboardHeaders:
    """ASGI middleware: SECURITY_HEADERS on every response of a path under /dashboard."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the headers to a dashboard response's start."""
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == PREFIX or path.startswith(PREFIX + "/")):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k for k, _ in self._headers}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message["headers"] = kept + self._headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


def secure(request: Request) -> bool:
    """Whether cookies get the Secure flag (the request came over https)."""
    return request.url.scheme == "https"


def page(
    request: Request,
    template: str,
    *,
    title: str,
    active: str | None = None,
    refresh_s: int | None = None,
    status: int = 200,
    **context: Any,
) -> HTMLResponse:
    """One page of a logged-in reader: the template inside base.html's header and nav."""
    token = request.cookies.get(SESSION_COOKIE)
    html = render(
        template,
        title=title,
        active=active,
        refresh_s=refresh_s,
        csrf=sessions.session_csrf(token) if token else None,
        **context,
    )
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})


def login_page(request: Request, message: str = "", status: int = 200) -> HTMLResponse:
    """The login form (any page shows it to a caller without a live session) and its CSRF
    cookie (kept if the browser has one, so two open forms both work)."""
    csrf = request.cookies.get(CSRF_COOKIE) or sessions.new_csrf()
    html = render(
        "login.html",
        title="login",
        active=None,
        refresh_s=None,
        csrf=None,
        login_csrf=csrf,
        message=message,
        roles=sorted(sessions.READER_ROLES),
    )
    response = HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})
    response.set_cookie(
        CSRF_COOKIE,
        csrf,
        httponly=True,
        samesite="strict",
        secure=secure(request),
        path=COOKIE_PATH,
    )
    return response


def message_page(
    request: Request, title: str, message: str, *, active: str | None, status: int
) -> HTMLResponse:
    """A page that only says one thing (not found, a bad parameter)."""
    return page(request, "message.html", title=title, active=active, status=status, message=message)


def not_found(request: Request, what: str, active: str | None = None) -> HTMLResponse:
    """A 404 page that names what was not found (another tenant's ids look the same)."""
    return message_page(request, "not found", f"{what} not found", active=active, status=404)


def reader(request: Request, pool: Pool) -> ApiKey | None:
    """The key behind the session cookie, if the session is live and its key may read."""
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        return None
    with database_required(), pool.connection() as conn:
        return sessions.get(conn, token)


@contextmanager
def tenant(key: ApiKey, pool: Pool) -> Iterator[Connection]:
    """A read transaction as the key's tenant."""
    with database_required(), tenant_transaction(pool, key.tenant_id) as conn:
        yield conn


def logged_out(response: Response) -> Response:
    """response, with the session cookie deleted."""
    response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH)
    return response
