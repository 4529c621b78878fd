"""Routes over REST: create, read, list, isolation, errors."""

from __future__ import annotations

import httpx
import pytest

from app.core.auth import create_key
from app.main import create_app
from tests.support.factories import make_tenant
from tests.support.servers import serve_app


@pytest.fixture
def api(db_url, conn):
    t1, t2 = make_tenant(conn), make_tenant(conn)
    keys = {
        "trainer": create_key(conn, tenant_id=t1["id"], role="trainer"),
        "reader": create_key(conn, tenant_id=t1["id"], role="reader"),
        "ingest": create_key(conn, tenant_id=t1["id"], role="ingest"),
        "other": create_key(conn, tenant_id=t2["id"], role="trainer"),
    }
    with serve_app(create_app(db_url=db_url)) as base:
        yield base, keys


def h(key):
    return {"Authorization": f"Bearer {key}"}


def test_create_read_list_and_isolation(api):
    base, keys = api
    r = httpx.post(f"{base}/v1/routes", json={"name": "support-es"}, headers=h(keys["trainer"]))
    assert r.status_code == 201, r.text
    assert r.json()["base_model"] == "smollm2-135m-instruct"
    assert httpx.get(f"{base}/v1/routes/support-es", headers=h(keys["reader"])).status_code == 200
    assert [
        x["name"] for x in httpx.get(f"{base}/v1/routes", headers=h(keys["reader"])).json()
    ] == ["support-es"]
    assert httpx.get(f"{base}/v1/routes/support-es", headers=h(keys["other"])).status_code == 404
    assert httpx.get(f"{base}/v1/routes", headers=h(keys["other"])).json() == []
    # Names are unique per tenant: the other tenant gets a route of its own of that name ...
    mine = httpx.post(f"{base}/v1/routes", json={"name": "support-es"}, headers=h(keys["other"]))
    assert mine.status_code == 201, mine.text
    assert mine.json()["tenant_id"] != r.json()["tenant_id"]
    # ... and a second one of the same tenant is a 409.
    dup = httpx.post(f"{base}/v1/routes", json={"name": "support-es"}, headers=h(keys["trainer"]))
    assert dup.status_code == 409 and "already exists" in dup.json()["error"]["message"]


@pytest.mark.parametrize(
    "body", [{"name": ""}, {"name": "bad name"}, {"name": "x", "extra": 1}, {"base_model": "m"}]
)
def test_bad_input_is_422(api, body):
    base, keys = api
    r = httpx.post(f"{base}/v1/routes", json=body, headers=h(keys["trainer"]))
    assert r.status_code == 422
    assert r.json()["error"]["message"]


def test_a_route_is_created_only_on_a_served_base_model(api, conn):
    base, keys = api
    # Another tenant's adapter name, a hub id, a path: none is a base this platform serves.
    for name in ("beta-prod-adapter", "meta-llama/Llama-3.1-8B", "/srv/cft/artefacts/beta"):
        r = httpx.post(
            f"{base}/v1/routes",
            json={"name": "evil", "base_model": name},
            headers=h(keys["trainer"]),
        )
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["code"] == "base_model_not_served" and err["param"] == "base_model"
        assert "smollm2-135m-instruct" in err["message"]  # it names what may be chosen
    assert conn.execute("SELECT count(*) AS n FROM serve.route").fetchone()["n"] == 0
    ok = httpx.post(
        f"{base}/v1/routes",
        json={"name": "fine", "base_model": "smollm2-135m-instruct"},
        headers=h(keys["trainer"]),
    )
    assert ok.status_code == 201, ok.text


def test_ingest_key_cannot_create_routes(api):
    base, keys = api
    r = httpx.post(f"{base}/v1/routes", json={"name": "r1"}, headers=h(keys["ingest"]))
    assert r.status_code == 403
