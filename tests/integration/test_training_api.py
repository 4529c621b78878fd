"""/v1/training-runs over real HTTP: enqueue, validation, read, list, cancel, roles, tenants."""

from __future__ import annotations

import uuid

import httpx
import pytest

from app.core.auth import create_key
from app.main import create_app
from tests.support.factories import make_log, make_route, make_tenant
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
    assert run["hyperparameters"]["rank"] == 16 and run["hyperparameters"]["dropout"] == 0.0
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
        (
            {"hyperparameters": {"compile_layers": True, "use_liger_kernel": True}},
            422,
            "compile_layers and use_liger_kernel exclude each other",
        ),
        ({"method": "sft"}, 400, "holds dpo examples"),
        # Settings that reach the shared workers: a base the route is not on (a path, a hub
        # id), a priority that would put the run ahead of every tenant's, a run of 10^9 steps.
        ({"base_model": "/srv/cft/artefacts/beta"}, 422, "a run trains on its route's base"),
        ({"base_model": "meta-llama/Llama-3.1-70B"}, 422, "a run trains on its route's base"),
        ({"priority": 1000}, 422, "priority"),
        ({"hyperparameters": {"max_steps": 1_000_000_000}}, 422, "max_steps"),
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


def _edited_log(conn, tenant_id: int, route: str, i: int) -> None:  # type: ignore[no-untyped-def]
    make_log(
        conn,
        tenant_id=tenant_id,
        route=route,
        messages=[{"role": "user", "content": f"how do I reset port {i}?"}],
        completion="draft",
        fb_edited=True,
        edited_completion=f"Open the switch page and reset port {i}.",
    )


@pytest.mark.parametrize("method", ["sft", "dpo"])
def test_fresh_snapshot_is_frozen_and_queued_in_one_request(api, conn, method) -> None:  # type: ignore[no-untyped-def]
    tenant = make_tenant(conn)
    route = make_route(conn, tenant_id=tenant["id"])
    for i in range(3):
        _edited_log(conn, tenant["id"], route["name"], i)
    key = create_key(conn, tenant_id=tenant["id"], role="trainer")
    body = {
        "route": route["name"],
        "method": method,
        "snapshot": {"dedup_threshold": 0, "eval_pct": 0},
        "hyperparameters": {"max_steps": 5},
    }
    r = httpx.post(f"{api}/v1/training-runs", json=body, headers=_h(key))
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["status"] == "queued" and run["snapshot_id"]
    # The response fills defaults in; the row keeps what the caller set (the worker resolves
    # unset speed settings per device).
    assert run["hyperparameters"]["max_steps"] == 5 and run["hyperparameters"]["rank"] == 8
    stored = conn.execute(
        "SELECT params FROM train.training_run WHERE id = %s", (run["id"],)
    ).fetchone()
    assert stored["params"] == {"max_steps": 5}
    snap = conn.execute(
        "SELECT tenant_id, route, method, n_train, n_eval, params, created_by, set_hash"
        " FROM train.dataset_snapshot WHERE id = %s",
        (run["snapshot_id"],),
    ).fetchone()
    assert (snap["tenant_id"], snap["route"], snap["method"]) == (
        tenant["id"],
        route["name"],
        method,
    )
    assert snap["n_train"] == 3 and snap["n_eval"] == 0 and snap["set_hash"]
    prefix = conn.execute(
        "SELECT prefix FROM auth.api_key WHERE tenant_id = %s AND role = 'trainer'", (tenant["id"],)
    ).fetchone()["prefix"]
    assert snap["params"]["eval_pct"] == 0 and snap["created_by"] == f"key:{prefix}"


@pytest.mark.parametrize(
    ("patch", "status", "needle"),
    [
        ({}, 422, "exactly one of snapshot_id"),
        ({"snapshot_id": "SNAP", "snapshot": {}}, 422, "exactly one of snapshot_id"),
        ({"snapshot": {"dedup": 0.2}}, 422, "dedup"),
        ({"snapshot": {"eval_pct": 101}}, 422, "eval_pct"),
        (
            {"snapshot": {"since": "2001-01-01T00:00:00Z", "until": "2001-02-01T00:00:00Z"}},
            409,
            "no training examples",
        ),
    ],
)
def test_fresh_snapshot_requests_are_validated(api, conn, patch, status, needle) -> None:  # type: ignore[no-untyped-def]
    tenant, route, snap = setup_route(conn, "sft")
    _edited_log(conn, tenant["id"], route["name"], 1)
    key = create_key(conn, tenant_id=tenant["id"], role="trainer")
    if patch.get("snapshot_id") == "SNAP":
        patch = patch | {"snapshot_id": str(snap["id"])}
    before = conn.execute("SELECT count(*) AS n FROM train.dataset_snapshot").fetchone()["n"]
    body = {"route": route["name"], "method": "sft"} | patch
    r = httpx.post(f"{api}/v1/training-runs", json=body, headers=_h(key))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and {"type", "code"} <= set(err)
    # A refused request leaves no snapshot and no run behind.
    after = conn.execute("SELECT count(*) AS n FROM train.dataset_snapshot").fetchone()["n"]
    assert after == before
    runs = conn.execute("SELECT count(*) AS n FROM train.training_run").fetchone()["n"]
    assert runs == 0
