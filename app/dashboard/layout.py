"""What every dashboard page shares: the page frame and nav, the reader-key cookie, formatting.

Login posts the key once; it comes back as an HttpOnly, SameSite=Strict cookie, so the page never
holds it in JavaScript. Every query runs as the key's tenant (row-level security)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from html import escape
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse

from app.core.auth import ApiKey, lookup
from app.core.db import Connection, Pool, tenant_transaction
from app.core.deps import get_pool
from app.core.errors import database_required

COOKIE = "cft_dashboard_key"
READER_ROLES = frozenset({"reader", "trainer", "release", "admin"})
PoolDep = Annotated[Pool, Depends(get_pool)]

STATUS_COLORS = {
    "training": "#8c959f",
    "candidate": "#9a6700",
    "canary": "#1f6feb",
    "prod": "#1a7f37",
    "retired": "#57606a",
    "failed": "#d1242f",
    # training runs
    "queued": "#8c959f",
    "running": "#1f6feb",
    "succeeded": "#1a7f37",
    "cancelled": "#57606a",
    # loop cycle states
    "triggered": "#8c959f",
    "snapshot": "#8c959f",
    "evaluating": "#9a6700",
    "deciding": "#1f6feb",
    "watching": "#1f6feb",
    "promoted": "#1a7f37",
    "rejected": "#57606a",
    "rolled_back": "#d1242f",
}

# (path, label): the nav of every page, in this order.
NAV = (
    ("/dashboard", "overview"),
    ("/dashboard/runs", "training runs"),
    ("/dashboard/evals", "evals"),
    ("/dashboard/snapshots", "snapshots"),
    ("/dashboard/calls", "logged calls"),
    ("/dashboard/lineage", "lineage"),
)

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
header{background:#24292f;color:#fff;padding:10px 20px;display:flex;gap:16px;align-items:center}
header a{color:#fff}header nav{display:flex;gap:14px}header nav a.active{font-weight:700;
text-decoration:none;border-bottom:2px solid #fff}main{padding:16px 20px;max-width:1400px}
section{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:12px 16px;
margin:0 0 16px}
h1{font-size:18px;margin:0}h2{font-size:16px;margin:0 0 8px}
table{border-collapse:collapse;width:100%}td,th{padding:4px 8px;border-bottom:1px solid #eaeef2;
text-align:left;font-variant-numeric:tabular-nums;vertical-align:top}th{background:#f6f8fa}
td.n,th.n{text-align:right}
.pill{padding:1px 8px;border-radius:10px;color:#fff;font-size:12px}
.charts{display:flex;flex-wrap:wrap;gap:12px}
svg.chart{background:#fff;border:1px solid #eaeef2}svg .grid{stroke:#eaeef2}
svg .tick,svg .legend{font-size:10px;fill:#57606a}svg .title{font-size:12px;font-weight:600}
.loop .grid2,.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(230px,1fr));
gap:2px 16px}
.loop .fired{color:#1a7f37;font-weight:600}.loop .blocking,.blocker{color:#d1242f}
.numbers,.muted{font-size:12px;color:#57606a}
.verdict{font-weight:600}.canary_better,.ok{color:#1a7f37}.canary_worse{color:#d1242f}
.bar{background:#1f6feb;height:12px;display:inline-block;vertical-align:middle}
pre.text{white-space:pre-wrap;word-break:break-word;margin:0;max-height:16em;overflow:auto;
font:12px/1.4 ui-monospace,monospace;background:#f6f8fa;padding:4px 6px;border-radius:4px}
form.filters{display:flex;flex-wrap:wrap;gap:8px;align-items:end}
form.filters label{display:flex;flex-direction:column;font-size:12px}
.pager{display:flex;gap:16px;margin-top:8px}
form.login{max-width:420px;margin:80px auto}form.login input{width:100%;padding:6px;margin:6px 0}
"""


def page(
    title: str,
    body: str,
    *,
    active: str | None = None,
    logged_in: bool = True,
    refresh_s: int | None = None,
    status: int = 200,
) -> HTMLResponse:
    """One HTML page: header with the nav (active = the nav path shown as current), body."""
    links = "".join(
        f'<a href="{href}"{" class=active" if href == active else ""}>{label}</a>'
        for href, label in NAV
    )
    nav = (
        f"<nav>{links}</nav>"
        '<form method="post" action="/dashboard/logout" style="margin-left:auto">'
        '<button type="submit">log out</button></form>'
        if logged_in
        else ""
    )
    meta = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    html = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">{meta}'
        f'<title>{escape(title)}</title><link rel="icon" href="data:,">'
        f"<style>{CSS}</style></head><body><header><h1>cft · {escape(title)}</h1>{nav}</header>"
        f"<main>{body}</main></body></html>"
    )
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})


def login_page(message: str = "", status: int = 200) -> HTMLResponse:
    """The login form (any page shows it to a caller without a valid cookie)."""
    note = f'<p role="alert">{escape(message)}</p>' if message else ""
    body = (
        '<form class="login" method="post" action="/dashboard/login"><h2>Dashboard login</h2>'
        f'{note}<label for="key">API key (role reader, release, trainer or admin)</label>'
        '<input id="key" name="key" type="password" autocomplete="off" required>'
        '<button type="submit">Log in</button></form>'
    )
    return page("login", body, logged_in=False, status=status)


def not_found(what: str, active: str | None = None) -> HTMLResponse:
    """A 404 page that names what was not found (another tenant's ids look the same)."""
    return page(
        "not found",
        f"<section><p>{escape(what)} not found</p></section>",
        active=active,
        status=404,
    )


def reader(request: Request, pool: Pool) -> ApiKey | None:
    """The key behind the dashboard cookie, if it is valid and may read."""
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    with database_required(), pool.connection() as conn:
        key = lookup(conn, token)
    return key if key and key.role in READER_ROLES else None


@contextmanager
def tenant(key: ApiKey, pool: Pool) -> Iterator[Connection]:
    """A read transaction as the key's tenant."""
    with database_required(), tenant_transaction(pool, key.tenant_id) as conn:
        yield conn


def pill(status: str | None) -> str:
    """A status as a coloured label."""
    status = status or "?"
    color = STATUS_COLORS.get(status, "#57606a")
    return f'<span class="pill" style="background:{color}">{escape(status)}</span>'


def num(v: Any, digits: int = 3) -> str:
    """A number for a table cell ("–" for none)."""
    if v is None:
        return "–"
    if isinstance(v, Decimal):
        v = float(v)
    if isinstance(v, float):
        if v != v:
            return "NaN"
        return f"{v:.{digits}g}" if abs(v) < 1e-3 and v != 0 else f"{v:.{digits}f}"
    return escape(str(v))


def when(t: datetime | None) -> str:
    """A timestamp to the second ("–" for none)."""
    return f"{t:%Y-%m-%d %H:%M:%S}" if t else "–"


def seconds(a: datetime | None, b: datetime | None) -> str:
    """The duration between two timestamps, as 1 h 02 min / 3 min 05 s / 12.3 s."""
    if a is None or b is None:
        return "–"
    s = (b - a).total_seconds()
    if s >= 3600:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
    if s >= 60:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{s:.1f} s"


def link(path: str, *parts: str, text: str | None = None, **query: Any) -> str:
    """An <a> to path/part/... (each part URL-encoded) with an optional query string."""
    href = path + "".join("/" + quote(str(p), safe="") for p in parts)
    q = {k: v for k, v in query.items() if v not in (None, "")}
    if q:
        href += "?" + urlencode(q)
    label = text if text is not None else (str(parts[-1]) if parts else path)
    return f'<a href="{escape(href)}">{escape(label)}</a>'


def options(values: list[str], selected: str | None, *, blank: str | None = "any") -> str:
    """<option>s for a filter select, the selected one marked (blank: the "no filter" one)."""
    out = [f'<option value="">{escape(blank)}</option>'] if blank is not None else []
    for v in values:
        sel = " selected" if v == selected else ""
        out.append(f'<option value="{escape(v)}"{sel}>{escape(v)}</option>')
    return "".join(out)
