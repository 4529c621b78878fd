"""Dashboard login and logout: the reader key goes into an HttpOnly, SameSite=Strict cookie."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from app.core.auth import lookup
from app.dashboard.layout import COOKIE, READER_ROLES, PoolDep, login_page

router = APIRouter(include_in_schema=False)


@router.post("/dashboard/login")
async def login(request: Request, pool: PoolDep) -> Response:
    """Check the posted key and keep it in an HttpOnly cookie."""
    form = parse_qs((await request.body()).decode(errors="replace"))
    token = (form.get("key") or [""])[0].strip()
    if not token:
        return login_page("enter a key", 400)
    with pool.connection() as conn:
        key = lookup(conn, token)
    if key is None:
        return login_page("invalid or revoked key", 401)
    if key.role not in READER_ROLES:
        return login_page(f"a key with role {key.role} cannot read the dashboard", 403)
    response = RedirectResponse("/dashboard", status_code=303)
    response.set_cookie(
        COOKIE,
        token,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/dashboard",
        max_age=12 * 3600,
    )
    return response


@router.post("/dashboard/logout")
def logout() -> Response:
    """Forget the key."""
    response = RedirectResponse("/dashboard", status_code=303)
    response.delete_cookie(COOKIE, path="/dashboard")
    return response
