"""The adapters API over real HTTP: reads, canary, promote and rollback through the database gate."""

from __future__ import annotations

import httpx
import psycopg
import pytest

from app.core.auth import create_key
from app.main import create_app
from tests.support.factories import make_adapter, make_route, make_tenant
from tests.support.servers import serve_app


@pytest.fixture
def api(db_url):
    with serve_app(create_app(db_url=db_url)) as base:
        yield base


def _result(conn, adapter, suite, metric, score):
    conn.execute(
        "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score) VALUES (%s, %s, %s, %s)",
        (adapter, suite, metric, score),
    )


@pytest.fixture
def world(conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    # These rules trust the release role's results too (by default only the evaluator's count):
    # the tests record scores over REST with a release key.
    for suite, metric, direction in (("tasks", "accuracy", "higher"), ("heldout", "loss", "lower")):
        conn.execute(
            "INSERT INTO train.promotion_policy (tenant_id, route, suite_id, metric, direction,"
            " trusted_authors) VALUES (%s, %s, %s, %s, %s, '{evaluator,release,owner}')",
            (t["id"], r["name"], suite, metric, direction),
        )
    prod = make_adapter(conn, route=r, status="prod", traffic_pct=100)["id"]
    _result(conn, prod, "tasks", "accuracy", 0.8)
    _result(conn, prod, "heldout", "loss", 1.5)
    cand = make_adapter(conn, route=r)["id"]
    keys = {
        role: {"Authorization": f"Bearer {create_key(conn, tenant_id=t['id'], role=role)}"}
        for role in ("release", "reader", "trainer", "admin")
    }
    return {"tenant": t, "route": r["name"], "prod": prod, "cand": cand, "keys": keys}


def _post(api, path, key, body=None):
    return httpx.post(f"{api}{path}", headers=key, json=body, timeout=10)


def _record(api, world, adapter, accuracy, loss, role="release"):
    """Record scores over REST, as a release key unless told (a trainer's satisfy nothing)."""
    body = {
        "results": [
            {"suite_id": "tasks", "metric": "accuracy", "score": accuracy},
            {"suite_id": "heldout", "metric": "loss", "score": loss},
        ]
    }
    return _post(api, f"/v1/adapters/{adapter}/eval-results", world["keys"][role], body)


def _prods(conn, route):
    return [
        r["id"]
        for r in conn.execute(
            "SELECT id FROM serve.adapter WHERE route = %s AND status = 'prod'", (route,)
        )
    ]


@pytest.mark.parametrize(
    ("results", "needle"),
    [
        ([], "no eval results"),
        ([("tasks", "accuracy", 0.9)], "heldout/loss: candidate has no result"),
        ([("tasks", "accuracy", 0.7), ("heldout", "loss", 1.0)], "tasks/accuracy: regression"),
        ([("tasks", "accuracy", 0.9), ("heldout", "loss", 2.0)], "heldout/loss: regression"),
        ([("vibes", "score", 1.0)], "candidate has no result for this required metric"),
    ],
)
def test_refused_promotion_is_409_with_reasons_and_changes_nothing(
    api, conn, world, results, needle
):
    for suite, metric, score in results:
        _result(conn, world["cand"], suite, metric, score)
    resp = _post(api, f"/v1/adapters/{world['cand']}/promote", world["keys"]["release"])
    assert resp.status_code == 409, resp.text
    err = resp.json()["error"]
    assert needle in err["message"] and err["code"] == "adapter_promotion_gate"
    assert err["type"] == "conflict_error"
    assert _prods(conn, world["route"]) == [world["prod"]]
    check = httpx.get(
        f"{api}/v1/adapters/{world['cand']}/promotion-check", headers=world["keys"]["reader"]
    ).json()
    assert check["allowed"] is False and check["current"] == world["prod"]
    assert any(needle.split(": ")[-1] in b["reason"] for b in check["blockers"])


def test_promote_improving_candidate_then_rollback(api, conn, world):
    assert _record(api, world, world["cand"], 0.9, 1.2).status_code == 200
    ok = _post(
        api, f"/v1/adapters/{world['cand']}/promote", world["keys"]["release"], {"reason": "better"}
    )
    assert ok.status_code == 200, ok.text
    assert ok.json()["status"] == "prod" and ok.json()["previous_prod_id"] == world["prod"]
    assert _prods(conn, world["route"]) == [world["cand"]]

    detail = httpx.get(f"{api}/v1/adapters/{world['cand']}", headers=world["keys"]["reader"]).json()
    assert {(r["suite_id"], r["score"]) for r in detail["eval_results"]} == {
        ("tasks", 0.9),
        ("heldout", 1.2),
    }
    last = detail["events"][-1]
    assert (last["old_status"], last["new_status"], last["reason"]) == (
        "candidate",
        "prod",
        "better",
    )
    assert last["application_name"].startswith("cft-api key=cft_")
    assert last["actor"].endswith("as cft_app")

    back = _post(
        api, f"/v1/adapters/{world['cand']}/rollback", world["keys"]["release"], {"reason": "oops"}
    )
    assert back.status_code == 200, back.text
    assert back.json()["id"] == world["prod"] and back.json()["status"] == "prod"
    assert _prods(conn, world["route"]) == [world["prod"]]
    again = _post(api, f"/v1/adapters/{world['prod']}/rollback", world["keys"]["release"])
    assert again.status_code == 409 and "no previous prod" in again.json()["error"]["message"]


def test_canary_needs_eval_results(api, conn, world):
    path = f"/v1/adapters/{world['cand']}/canary"
    resp = _post(api, path, world["keys"]["release"], {"traffic_pct": 5})
    assert resp.status_code == 409 and "canary gate refused" in resp.json()["error"]["message"]
    _record(api, world, world["cand"], 0.5, 3.0)
    resp = _post(api, path, world["keys"]["release"], {"traffic_pct": 5})
    assert resp.status_code == 200 and resp.json()["traffic_pct"] == 5.0
    assert _post(api, path, world["keys"]["release"], {"traffic_pct": 0}).status_code == 422


def test_roles_and_tenants(api, conn, world):
    keys = world["keys"]
    assert _post(api, f"/v1/adapters/{world['cand']}/promote", keys["reader"]).status_code == 403
    assert _post(api, f"/v1/adapters/{world['cand']}/promote", keys["trainer"]).status_code == 403
    assert _record(api, world, world["cand"], 1, 1, role="reader").status_code == 403
    listing = httpx.get(
        f"{api}/v1/adapters", params={"route": world["route"]}, headers=keys["reader"]
    )
    assert {a["id"] for a in listing.json()["data"]} == {world["prod"], world["cand"]}
    # Another tenant sees nothing of these and cannot promote them.
    other = make_tenant(conn)
    okey = {"Authorization": f"Bearer {create_key(conn, tenant_id=other['id'], role='release')}"}
    assert httpx.get(f"{api}/v1/adapters", headers=okey).json()["data"] == []
    assert httpx.get(f"{api}/v1/adapters/{world['cand']}", headers=okey).status_code == 404
    assert _post(api, f"/v1/adapters/{world['cand']}/promote", okey).status_code == 404


def test_policy_get_and_put(api, conn, world):
    conn.execute("DELETE FROM train.promotion_policy WHERE route IS NULL")  # the default rule
    keys = world["keys"]
    got = httpx.get(
        f"{api}/v1/promotion-policy", params={"route": world["route"]}, headers=keys["reader"]
    )
    assert {(r["suite_id"], r["direction"]) for r in got.json()["data"]} == {
        ("tasks", "higher"),
        ("heldout", "lower"),
    }
    body = {
        "route": world["route"],
        "rules": [
            {"suite_id": "tasks", "metric": "accuracy", "direction": "higher", "tolerance": 0.5}
        ],
    }
    assert (
        httpx.put(f"{api}/v1/promotion-policy", headers=keys["release"], json=body).status_code
        == 403
    )
    put = httpx.put(f"{api}/v1/promotion-policy", headers=keys["admin"], json=body)
    assert put.status_code == 200, put.text
    assert [r["tolerance"] for r in put.json()["data"]] == [0.5]
    # The gate follows the data: loss is no longer required, accuracy may drop by half.
    _result(conn, world["cand"], "tasks", "accuracy", 0.5)
    assert _post(api, f"/v1/adapters/{world['cand']}/promote", keys["release"]).status_code == 200


def test_global_rules_survive_a_tenant_policy_replace(conn, world):
    conn.execute("DELETE FROM train.promotion_policy WHERE route IS NULL")  # the default rule
    conn.execute(
        "INSERT INTO train.promotion_policy (route, suite_id, metric, direction)"
        " VALUES (NULL, 'safety', 'pass_rate', 'higher')"
    )
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cft_app")
        conn.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(world["tenant"]["id"]),))
        conn.execute("DELETE FROM train.promotion_policy")
    left = conn.execute("SELECT route FROM train.promotion_policy").fetchall()
    assert left == [{"route": None}]


def test_concurrent_rest_promotions_leave_one_prod(api, conn, world):
    import concurrent.futures as cf

    b = make_adapter(
        conn,
        route={
            "name": world["route"],
            "tenant_id": world["tenant"]["id"],
            "base_model": "smollm2-135m-instruct",
        },
    )["id"]
    _record(api, world, world["cand"], 0.85, 1.4)
    _record(api, world, b, 0.86, 1.4)
    with cf.ThreadPoolExecutor(2) as ex:
        codes = list(
            ex.map(
                lambda a: (
                    _post(api, f"/v1/adapters/{a}/promote", world["keys"]["release"]).status_code
                ),
                [world["cand"], b],
            )
        )
    assert 200 in codes and set(codes) <= {200, 409}
    assert len(_prods(conn, world["route"])) == 1


def test_raw_update_as_release_role_is_gated_too(conn, world):
    with pytest.raises(psycopg.errors.CheckViolation), conn.transaction():
        conn.execute("SET LOCAL ROLE cft_release")
        conn.execute(
            "UPDATE serve.adapter SET status='prod', traffic_pct=100 WHERE id=%s", (world["cand"],)
        )
