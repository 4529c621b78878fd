"""User pseudonyms: HMAC-SHA256 of the product's user id with a server secret.

The raw id never reaches the database. The secret is CFT_USER_HASH_SECRET or, when that is
empty, a random one generated once into CFT_HOME/secret (mode 0600) and reused, so the same
user keeps the same pseudonym across restarts (and `forget user` can find their rows).
"""

from __future__ import annotations

import hmac
import os
import secrets
from functools import lru_cache
from pathlib import Path

from app.core.config import Settings, get_settings


def _load_or_create(path: Path) -> bytes:
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_hex(32).encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process won the race: use its secret
        return path.read_bytes().strip()
    with os.fdopen(fd, "wb") as f:
        f.write(value + b"\n")
    return value


@lru_cache(maxsize=8)
def _secret_for(configured: str, home: str) -> bytes:
    if configured:
        return configured.encode()
    return _load_or_create(Path(home) / "secret")


def user_secret(settings: Settings | None = None) -> bytes:
    """The HMAC key for user pseudonyms (configured, or generated once under CFT_HOME)."""
    settings = settings or get_settings()
    return _secret_for(settings.user_hash_secret.get_secret_value(), str(settings.home.resolve()))


def user_hash(user: str, secret: bytes) -> bytes:
    """The stored pseudonym of a user id."""
    return hmac.digest(secret, user.encode(), "sha256")
