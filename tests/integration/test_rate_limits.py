"""Abuse limits over REST and the router: 429 with Retry-After per key and per tenant, and
failed key checks remembered and limited per client address."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core import auth
from app.core.config import Settings
from app.main import create_app
from tests.support.factories import make_tenant
from tests.support.servers import serve_app


@pytest.fixture
def api(db_url: str, tmp_path: Path) -> Iterator[str]:
    settings = Settings(
        home=tmp_path,
        rate_limit_per_key=0.1,  # bursts of one, then one per 10 s: robust on a slow machine
        rate_limit_per_tenant=0.2,
        rate_limit_auth_failures=0.1,
    )
    with serve_app(create_app(settings, db_url=db_url, engine_urls=[])) as base:
        yield base


def h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_key_over_its_rate_gets_429_with_retry_after(api: str, conn: Any) -> None:
    t = make_tenant(conn)
    first, second = (auth.create_key(conn, tenant_id=t["id"], role="reader") for _ in range(2))
    assert httpx.get(f"{api}/v1/routes", headers=h(first)).status_code == 200
    r = httpx.get(f"{api}/v1/routes", headers=h(first))
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    assert "this API key" in r.json()["error"]["message"]
    # The tenant's budget is shared by its keys: a second key of it is held back too.
    r = httpx.get(f"{api}/v1/routes", headers=h(second))
    assert r.status_code == 429 and "this tenant" in r.json()["error"]["message"]
    # Another tenant is not held back.
    other = auth.create_key(conn, tenant_id=make_tenant(conn)["id"], role="reader")
    assert httpx.get(f"{api}/v1/routes", headers=h(other)).status_code == 200


def test_a_bad_key_is_remembered_and_bad_keys_are_limited_per_address(api: str, conn: Any) -> None:
    token = "cft_" + "x" * 43
    assert httpx.get(f"{api}/v1/routes", headers=h(token)).status_code == 401
    # Remembered: the key checks as bad without a lookup, even once a row with its hash exists.
    t = make_tenant(conn)
    conn.execute(
        "INSERT INTO auth.api_key (tenant_id, role, prefix, key_hash) VALUES (%s, 'reader', %s, %s)",
        (t["id"], token[:12], auth.hash_key(token)),
    )
    r = httpx.get(f"{api}/v1/routes", headers=h(token))
    assert r.status_code in (401, 429)
    # Failed checks from one address: past the rate, 429.
    codes = [
        httpx.get(f"{api}/v1/routes", headers=h(f"cft_bad{i:040d}")).status_code for i in range(4)
    ]
    assert 429 in codes and set(codes) <= {401, 429}
