"""/v1/training-runs over real HTTP: enqueue, validation, read, list, cancel, roles, tenants."""

from __future__ import annotations

import uuid

import httpx
import pytest

from app.core.auth import create_key
from app.main import create_app
from tests.support.factories import make_route, make_tenant
from tests.support.servers import serve_app
from tests.support.training import make_snapshot, setup_route


@pytest.fixture
def api(db_url):  # type: ignore[no-untyped-def]
    with serve_app(create_app(db_url=db_url)) as base:
        yield base


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_training_run_lifecycle_over_http(api, conn) -> None:  # type: ignore[no-untyped-def]
    tenant, route, snap = setup_route(conn, "dpo")
    trainer = create_key(conn, tenant_id=tenant["id"], role="trainer")
    reader = create_key(conn, tenant_id=tenant["id"], role="reader")
    body = {
        "route": route["name"],
        "method": "simpo",
        "snapshot_id": str(snap["id"]),
        "hyperparameters": {"rank": 16, "alpha": 32, "epochs": 1},
    }

    r = httpx.post(f"{api}/v1/training-runs", json=body, headers=_h(reader))
    assert r.status_code == 403

    r = httpx.post(f"{api}/v1/training-runs", json=body, headers=_h(trainer))
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["status"] == "queued" and run["base_model"] == "smollm2-135m-instruct"
    assert run["hyperparameters"]["rank"] == 16 and run["hyperparameters"]["dropout"] == 0.05
    assert run["hyperparameters"]["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]

    got = httpx.get(f"{api}/v1/training-runs/{run['id']}", headers=_h(reader)).json()
    assert got["id"] == run["id"] and got["progress"] == {}
    listed = httpx.get(
        f"{api}/v1/training-runs",
        params={"status": "queued", "route": route["name"]},
        headers=_h(reader),
    ).json()
    assert [x["id"] for x in listed["data"]] == [run["id"]]
    assert (
        httpx.get(
            f"{api}/v1/training-runs", params={"status": "running"}, headers=_h(reader)
        ).json()["data"]
        == []
    )

    r = httpx.post(f"{api}/v1/training-runs/{run['id']}/cancel", headers=_h(trainer))
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    r = httpx.post(f"{api}/v1/training-runs/{run['id']}/cancel", headers=_h(trainer))
    assert r.status_code == 409 and r.json()["error"]["code"] == "training_run_finished"

    # Another tenant sees nothing of it.
    other = make_tenant(conn)
    okey = create_key(conn, tenant_id=other["id"], role="trainer")
    assert httpx.get(f"{api}/v1/training-runs/{run['id']}", headers=_h(okey)).status_code == 404
    r = httpx.post(f"{api}/v1/training-runs", json=body, headers=_h(okey))
    assert r.status_code == 404 and r.json()["error"]["code"] == "route_not_found"


@pytest.mark.parametrize(
    ("patch", "status", "needle"),
    [
        ({"method": "ppo"}, 422, "method"),
        ({"hyperparameters": {"rank": 0}}, 422, "rank"),
        ({"hyperparameters": {"learning_rate": -1}}, 422, "learning_rate"),
        ({"hyperparameters": {"lora_rank": 8}}, 422, "lora_rank"),
        ({"hyperparameters": {"target_modules": ["q_proj; drop"]}}, 422, "target_modules"),
        ({"hyperparameters": {"packing": True}}, 422, "packing is for sft only"),
        ({"hyperparameters": {"padding_free": True}}, 422, "DPOTrainer disables it"),
        ({"method": "sft"}, 400, "holds dpo examples"),
        ({"snapshot_id": str(uuid.uuid4())}, 404, "does not exist"),
    ],
)
def test_invalid_requests_get_clear_errors(api, conn, patch, status, needle) -> None:  # type: ignore[no-untyped-def]
    tenant, route, snap = setup_route(conn, "dpo")
    key = create_key(conn, tenant_id=tenant["id"], role="trainer")
    body = {"route": route["name"], "method": "dpo", "snapshot_id": str(snap["id"])} | patch
    r = httpx.post(f"{api}/v1/training-runs", json=body, headers=_h(key))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and {"type", "code"} <= set(err)


def test_snapshot_of_another_route_tenant_is_not_found(api, conn) -> None:  # type: ignore[no-untyped-def]
    t1 = make_tenant(conn)
    t2 = make_tenant(conn)
    r1 = make_route(conn, tenant_id=t1["id"])
    r2 = make_route(conn, tenant_id=t2["id"])
    snap2 = make_snapshot(conn, tenant_id=t2["id"], route=r2["name"], method="sft")
    key = create_key(conn, tenant_id=t1["id"], role="trainer")
    body = {"route": r1["name"], "method": "sft", "snapshot_id": str(snap2["id"])}
    r = httpx.post(f"{api}/v1/training-runs", json=body, headers=_h(key))
    assert r.status_code == 404 and r.json()["error"]["code"] == "snapshot_not_found"
