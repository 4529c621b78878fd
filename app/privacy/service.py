"""Rules of forgetting a user: the work is done by auth.forget_user in SQL."""

from __future__ import annotations

from app.core.db import Connection
from app.core.errors import Unprocessable
from app.core.pseudonym import user_hash
from app.privacy.schemas import ForgetOut


def forget_user(conn: Connection, *, user: str, secret: bytes) -> ForgetOut:
    """Forget user in the tenant the transaction is scoped to; return the audit row."""
    if not user or "\x00" in user:
        raise Unprocessable("user must be a non-empty id without NUL characters", param="user")
    row = conn.execute("SELECT * FROM auth.forget_user(%s)", (user_hash(user, secret),)).fetchone()
    assert row is not None
    return ForgetOut.model_validate(row | {"user_hash": bytes(row["user_hash"]).hex()})
