"""Dashboard sessions and their CSRF tokens.

A login stores a random session token's sha256 in auth.dashboard_session and gives the browser
the token (an HttpOnly, SameSite=Strict cookie); the API key is checked once and never leaves
the login request. A session acts as its key until it expires, its key is revoked (a trigger
deletes it, and a revoked key's session is not found anyway) or the user logs out.

Forms are posted with a CSRF token: the login form's is a random value also set as a cookie
(double submit: another site can neither read the cookie nor make the browser send it on its
post), a logged-in page's is derived from the session token, which only the browser holds.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from app.core.auth import ApiKey
from app.core.db import Connection

# The roles that may log in; admin keys are refused (they can write; the dashboard only reads).
READER_ROLES = frozenset({"reader", "trainer", "release"})

_CREATE = """
WITH expired AS (DELETE FROM auth.dashboard_session WHERE expires_at <= now())
INSERT INTO auth.dashboard_session (token_hash, api_key_id, expires_at)
VALUES (%s, %s, now() + %s)
"""
_FIND = """
SELECT k.id, k.tenant_id, k.role, k.prefix
  FROM auth.dashboard_session s JOIN auth.api_key k ON k.id = s.api_key_id
 WHERE s.token_hash = %s AND s.expires_at > now() AND k.revoked_at IS NULL
   AND k.tenant_id IS NOT NULL
"""


def token_hash(token: str) -> bytes:
    """The stored form of a session token."""
    return hashlib.sha256(token.encode()).digest()


def create(conn: Connection, *, key: ApiKey, ttl: timedelta) -> str:
    """Start a session for key (and drop expired ones); return its token, the cookie's value."""
    token = secrets.token_urlsafe(32)
    conn.execute(_CREATE, (token_hash(token), key.id, ttl))
    return token


def get(conn: Connection, token: str) -> ApiKey | None:
    """The key behind a live session token, or None (unknown, expired, key revoked)."""
    row = conn.execute(_FIND, (token_hash(token),)).fetchone()
    if row is None or row["role"] not in READER_ROLES:
        return None
    return ApiKey(id=row["id"], tenant_id=row["tenant_id"], role=row["role"], prefix=row["prefix"])


def delete(conn: Connection, token: str) -> None:
    """End a session (logging out)."""
    conn.execute("DELETE FROM auth.dashboard_session WHERE token_hash = %s", (token_hash(token),))


def new_csrf() -> str:
    """A random CSRF token for the login form (and its cookie)."""
    return secrets.token_urlsafe(32)


def session_csrf(token: str) -> str:
    """The CSRF token of a session's forms: bound to the session, unguessable without it."""
    return hmac.new(token.encode(), b"cft-dashboard-csrf", hashlib.sha256).hexdigest()


def same(sent: str | None, expected: str | None) -> bool:
    """Whether a posted CSRF token matches the expected one (constant time; both non-empty)."""
    if not sent or not expected:
        return False
    return hmac.compare_digest(sent.encode(), expected.encode())
