"""Logging in to the dashboard as a browser does: the form's CSRF token, then the key."""

from __future__ import annotations

import re

import httpx

CSRF_FIELD = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    """The CSRF token of the (first) form on a page."""
    found = CSRF_FIELD.search(html)
    assert found, f"no CSRF field on the page: {html[:500]}"
    return found.group(1)


def login(http: httpx.Client, key: str) -> httpx.Response:
    """GET the login form (it sets the CSRF cookie), POST it with key; the 303 or the refusal."""
    form = http.get("/dashboard/login", follow_redirects=False)
    if form.status_code == 303:  # already logged in: log out first
        logout(http)
        form = http.get("/dashboard/login", follow_redirects=False)
    return http.post(
        "/dashboard/login",
        data={"key": key, "csrf": csrf_of(form.text)},
        follow_redirects=False,
    )


def logout(http: httpx.Client) -> httpx.Response:
    """Post a page's log-out form."""
    page = http.get("/dashboard", follow_redirects=False)
    return http.post("/dashboard/logout", data={"csrf": csrf_of(page.text)}, follow_redirects=False)
