"""Every eval result has an author, set by the database, and only trusted authors certify.

Through REST (a trainer key's results are stored, shown, and satisfy no required rule; a release
key's do), as SQL roles (owner, cft_release, cft_app), as the evaluator, and as a cft_app login
that tries to forge the author with settings and column values.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from app.core.auth import create_key
from app.main import create_app
from tests.support.factories import make_adapter, make_route, make_tenant
from tests.support.servers import serve_app

RULES = (("tasks", "accuracy", "higher"), ("heldout", "loss", "lower"))


@pytest.fixture
def api(db_url: str) -> Iterator[str]:
    with serve_app(create_app(db_url=db_url)) as base:
        yield base


def _as_evaluator(conn: Any, adapter: str, suite: str, metric: str, score: float) -> None:
    with conn.transaction():
        conn.execute("SELECT set_config('cft.evaluator', 'cft-evaluator/test w1', true)")
        conn.execute(
            "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
            " VALUES (%s, %s, %s, %s)",
            (adapter, suite, metric, score),
        )


@pytest.fixture
def world(conn: Any) -> dict[str, Any]:
    """A route with two required rules, a prod scored by the evaluator, a candidate, keys."""
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    for suite, metric, direction in RULES:
        conn.execute(
            "INSERT INTO train.promotion_policy (tenant_id, route, suite_id, metric, direction)"
            " VALUES (%s, %s, %s, %s, %s)",
            (t["id"], r["name"], suite, metric, direction),
        )
    prod = make_adapter(conn, route=r, status="prod", traffic_pct=100)["id"]
    _as_evaluator(conn, prod, "tasks", "accuracy", 0.8)
    _as_evaluator(conn, prod, "heldout", "loss", 1.5)
    cand = make_adapter(conn, route=r)["id"]
    keys: dict[str, str] = {}
    ids: dict[str, int] = {}
    for role in ("trainer", "release", "reader", "admin"):
        keys[role] = create_key(conn, tenant_id=t["id"], role=role)
        ids[role] = conn.execute(
            "SELECT id FROM auth.api_key WHERE tenant_id = %s AND role = %s", (t["id"], role)
        ).fetchone()["id"]
    return {"tenant": t, "route": r["name"], "prod": prod, "cand": cand, "keys": keys, "ids": ids}


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _post_results(api: str, key: str, adapter: str, accuracy: float, loss: float) -> httpx.Response:
    body = {
        "results": [
            {"suite_id": "tasks", "metric": "accuracy", "score": accuracy},
            {"suite_id": "heldout", "metric": "loss", "score": loss},
        ]
    }
    return httpx.post(
        f"{api}/v1/adapters/{adapter}/eval-results", headers=_h(key), json=body, timeout=10
    )


def _blockers(conn: Any, cand: str, cur: str | None) -> list[dict[str, Any]]:
    return list(
        conn.execute("SELECT * FROM serve.promotion_blockers(%s, %s)", (cand, cur)).fetchall()
    )


def _authors(conn: Any, adapter: str) -> set[tuple[str, str]]:
    rows = conn.execute(
        "SELECT author_kind, author_role FROM train.eval_result WHERE adapter_id = %s", (adapter,)
    ).fetchall()
    return {(r["author_kind"], r["author_role"]) for r in rows}


def test_trainer_results_are_kept_and_shown_but_do_not_satisfy_required_rules(
    api: str, conn: Any, world: dict[str, Any]
) -> None:
    keys, ids = world["keys"], world["ids"]
    resp = _post_results(api, keys["trainer"], world["cand"], 0.95, 1.0)
    assert resp.status_code == 200, resp.text
    prefix = keys["trainer"][:12]
    label = f"key {ids['trainer']} ({prefix}, role trainer)"
    # The REST response shows who wrote each result.
    assert {
        (r["suite_id"], r["author_kind"], r["author_role"], r["author_key_id"], r["author"])
        for r in resp.json()
    } == {
        ("heldout", "key", "trainer", ids["trainer"], label),
        ("tasks", "key", "trainer", ids["trainer"], label),
    }
    # The gate names the author, on both required rules, and refuses.
    check = httpx.get(
        f"{api}/v1/adapters/{world['cand']}/promotion-check", headers=_h(keys["reader"])
    ).json()
    assert check["allowed"] is False
    ruled = [b for b in check["blockers"] if b["suite_id"]]
    assert {(b["suite_id"], b["candidate_author"]) for b in ruled} == {
        ("heldout", label),
        ("tasks", label),
    }
    assert all(
        b["reason"].startswith(f"candidate result is by {label}, whom this rule does not trust")
        and "(trusted: evaluator, owner)" in b["reason"]
        for b in ruled
    ), ruled
    # And untrusted results compare nothing.
    assert [b["reason"][:16] for b in check["blockers"] if not b["suite_id"]] == [
        "nothing compared"
    ]
    promote = httpx.post(
        f"{api}/v1/adapters/{world['cand']}/promote", headers=_h(keys["release"]), timeout=10
    )
    assert promote.status_code == 409 and label in promote.json()["error"]["message"]
    # Nor does a trainer's result open the canary gate.
    canary = httpx.post(
        f"{api}/v1/adapters/{world['cand']}/canary",
        headers=_h(keys["release"]),
        json={"traffic_pct": 5},
        timeout=10,
    )
    assert canary.status_code == 409 and "does not trust" in canary.json()["error"]["message"]

    # The same scores from a release key are shown but, by default, satisfy nothing either (the
    # role that promotes does not certify its own promotion); a rule that names release trusts
    # them, and the promotion goes.
    resp = _post_results(api, keys["release"], world["cand"], 0.95, 1.0)
    assert {(r["author_role"], r["author_key_id"]) for r in resp.json()} == {
        ("trainer", ids["trainer"]),
        ("release", ids["release"]),
    }
    assert _blockers(conn, world["cand"], world["prod"]) != []
    conn.execute(
        "UPDATE train.promotion_policy SET trusted_authors = '{evaluator,release,owner}'"
        " WHERE route = %s",
        (world["route"],),
    )
    assert _blockers(conn, world["cand"], world["prod"]) == []
    promote = httpx.post(
        f"{api}/v1/adapters/{world['cand']}/promote", headers=_h(keys["release"]), timeout=10
    )
    assert promote.status_code == 200, promote.text
    detail = httpx.get(f"{api}/v1/adapters/{world['cand']}", headers=_h(keys["reader"])).json()
    assert {r["author_role"] for r in detail["eval_results"]} == {"trainer", "release"}


def test_a_trainer_cannot_launder_or_undercut_trusted_results(
    api: str, conn: Any, world: dict[str, Any]
) -> None:
    keys = world["keys"]
    _as_evaluator(conn, world["cand"], "tasks", "accuracy", 0.5)
    _as_evaluator(conn, world["cand"], "heldout", "loss", 1.4)
    assert [b["suite_id"] for b in _blockers(conn, world["cand"], world["prod"])] == ["tasks"]
    # A newer, better score from the trainer is kept beside the evaluator's (worse) one, which
    # still counts: still refused.
    assert _post_results(api, keys["trainer"], world["cand"], 0.99, 1.4).status_code == 200
    assert _authors(conn, world["cand"]) == {("key", "trainer"), ("evaluator", "evaluator")}
    assert [b["suite_id"] for b in _blockers(conn, world["cand"], world["prod"])] == ["tasks"]
    # The evaluator's correction (a new result) counts: the newest trusted one.
    _as_evaluator(conn, world["cand"], "tasks", "accuracy", 0.9)
    assert _blockers(conn, world["cand"], world["prod"]) == []
    # Lowering the prod's scores to make the candidate look better changes nothing either: the
    # prod's trusted results still count.
    assert _post_results(api, keys["trainer"], world["prod"], 0.1, 9.0).status_code == 200
    assert _blockers(conn, world["cand"], world["prod"]) == []
    counted = conn.execute(
        "SELECT metric, score, author_role FROM train.eval_result_counted"
        " WHERE adapter_id = %s ORDER BY metric",
        (world["prod"],),
    ).fetchall()
    assert [(r["metric"], float(r["score"]), r["author_role"]) for r in counted] == [
        ("accuracy", 0.8, "evaluator"),
        ("loss", 1.5, "evaluator"),
    ]


def test_results_are_facts_no_role_rewrites_them(conn: Any, world: dict[str, Any]) -> None:
    """Not even the owner updates, deletes or truncates a result; offboarding is the one way."""
    for sql in (
        "UPDATE train.eval_result SET score = 0.99 WHERE adapter_id = %(a)s",
        "DELETE FROM train.eval_result WHERE adapter_id = %(a)s",
        "TRUNCATE train.eval_result",
    ):
        with (
            pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="facts"),
            conn.transaction(),
        ):
            conn.execute(sql, {"a": world["prod"]})
    # judged_at is the database's, not the writer's: a back-dated result is written as now.
    with conn.transaction():
        conn.execute("SELECT set_config('cft.evaluator', 'cft-evaluator/test w1', true)")
        conn.execute(
            "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score, judged_at)"
            " VALUES (%s, 'tasks', 'accuracy', 0.7, '2000-01-01')",
            (world["prod"],),
        )
    newest = conn.execute(
        "SELECT score, judged_at > now() - interval '1 hour' AS fresh FROM train.eval_result_counted"
        " WHERE adapter_id = %s AND metric = 'accuracy'",
        (world["prod"],),
    ).fetchone()
    assert float(newest["score"]) == 0.7 and newest["fresh"]
    # The history stays: both of the evaluator's results on tasks/accuracy.
    assert (
        conn.execute(
            "SELECT count(*) AS n FROM train.eval_result WHERE adapter_id = %s AND metric = 'accuracy'",
            (world["prod"],),
        ).fetchone()["n"]
        == 2
    )


def test_policy_can_trust_trainers(api: str, conn: Any, world: dict[str, Any]) -> None:
    keys = world["keys"]
    body = {
        "route": world["route"],
        "rules": [
            {
                "suite_id": s,
                "metric": m,
                "direction": d,
                "trusted_authors": ["evaluator", "release", "owner", "trainer"],
            }
            for s, m, d in RULES
        ],
    }
    put = httpx.put(f"{api}/v1/promotion-policy", headers=_h(keys["admin"]), json=body, timeout=10)
    assert put.status_code == 200, put.text
    assert {tuple(r["trusted_authors"]) for r in put.json()["data"]} == {
        ("evaluator", "release", "owner", "trainer")
    }
    assert {r["min_judge_kappa"] for r in put.json()["data"]} == {0.6}  # the default
    assert _post_results(api, keys["trainer"], world["cand"], 0.9, 1.4).status_code == 200
    assert _blockers(conn, world["cand"], world["prod"]) == []
    # Left out, trusted_authors is the database default.
    got = httpx.get(
        f"{api}/v1/promotion-policy", params={"route": world["route"]}, headers=_h(keys["reader"])
    ).json()["data"]
    glob = [r for r in got if r["route"] is None]
    assert glob and all(r["trusted_authors"] == ["evaluator", "owner"] for r in glob)


def test_sql_roles_are_authors(conn: Any, world: dict[str, Any]) -> None:
    cand, tid = world["cand"], world["tenant"]["id"]
    # The owner (migrations, the operator at psql) is trusted.
    conn.execute(
        "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
        " VALUES (%s, 'tasks', 'accuracy', 0.9)",
        (cand,),
    )
    owner = conn.execute("SELECT current_user AS u").fetchone()["u"]
    row = conn.execute(
        "SELECT author_kind, author_role, author FROM train.eval_result WHERE adapter_id = %s",
        (cand,),
    ).fetchone()
    assert row == {"author_kind": "sql", "author_role": "owner", "author": f"sql role {owner}"}
    # cft_release records results too: shown and audited, but by default they do not satisfy a
    # required rule (the role that promotes does not certify its own promotion).
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cft_release")
        conn.execute(
            "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
            " VALUES (%s, 'heldout', 'loss', 1.4)",
            (cand,),
        )
    assert _authors(conn, cand) == {("sql", "owner"), ("sql", "release")}
    refused = _blockers(conn, cand, world["prod"])
    assert any("whom this rule does not trust" in (b["reason"] or "") for b in refused), refused
    # A rule that names release trusts it.
    conn.execute(
        "UPDATE train.promotion_policy SET trusted_authors = '{evaluator,release,owner}'"
        " WHERE route = %s",
        (world["route"],),
    )
    assert _blockers(conn, cand, world["prod"]) == []
    # cft_app without a key (what the API's role is, outside a request) is not trusted.
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cft_app")
        conn.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(tid),))
        conn.execute(
            "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
            " VALUES (%s, 'tasks', 'accuracy', 0.95), (%s, 'heldout', 'loss', 0.1)",
            (cand, cand),
        )
    app_author = f"sql role cft_app (session {owner})"
    rows = conn.execute(
        "SELECT DISTINCT author FROM train.eval_result_latest WHERE adapter_id = %s", (cand,)
    ).fetchall()
    assert {"author": app_author} in rows
    # Newer, but by an author no rule trusts: the trusted results still count.
    counted = {b["candidate_author"] for b in _blockers(conn, cand, world["prod"]) if b["suite_id"]}
    assert app_author not in counted


@pytest.fixture
def mallory(conn: Any, db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A login of its own that is a member of cft_app (roles are cluster-wide: dropped after)."""
    name = f"mallory_{uuid.uuid4().hex[:8]}"
    conn.execute(f'CREATE ROLE "{name}" LOGIN IN ROLE cft_app')
    try:
        with psycopg.connect(db_url, user=name, autocommit=True, row_factory=dict_row) as c:
            yield c
    finally:
        conn.execute(f'DROP OWNED BY "{name}"')
        conn.execute(f'DROP ROLE "{name}"')


def test_a_cft_app_login_cannot_forge_the_author(
    conn: Any, mallory: psycopg.Connection[Any], world: dict[str, Any]
) -> None:
    cand, tid = world["cand"], world["tenant"]["id"]
    name = mallory.execute("SELECT session_user AS u").fetchone()["u"]
    with mallory.transaction():
        mallory.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(tid),))
        # Every setting the API and the evaluator use, and the author columns themselves.
        mallory.execute(
            "SELECT set_config('cft.key_id', %s, true)", (str(world["ids"]["release"]),)
        )
        mallory.execute("SELECT set_config('cft.evaluator', 'cft-evaluator/0 forged', true)")
        mallory.execute("SET LOCAL application_name = 'cft-evaluator'")
        for suite, metric, score in (("tasks", "accuracy", 0.99), ("heldout", "loss", 0.1)):
            mallory.execute(
                "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score, author_kind,"
                " author_role, author_key_id, author)"
                " VALUES (%s, %s, %s, %s, 'evaluator', 'evaluator', NULL, 'evaluator')",
                (cand, suite, metric, score),
            )
        # Nor can it read keys through the trigger's helper.
        assert (
            mallory.execute(
                "SELECT * FROM train.key_author(%s)", (world["ids"]["release"],)
            ).fetchall()
            == []
        )
    # Nor rewrite the author afterwards: results are never updated.
    with pytest.raises(psycopg.Error), mallory.transaction():
        mallory.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(tid),))
        mallory.execute(
            "UPDATE train.eval_result SET author_role = 'release', author_kind = 'key'"
            " WHERE adapter_id = %s",
            (cand,),
        )
    rows = conn.execute(
        "SELECT author_kind, author_role, author_key_id, author FROM train.eval_result"
        " WHERE adapter_id = %s",
        (cand,),
    ).fetchall()
    assert rows == 2 * [
        {
            "author_kind": "sql",
            "author_role": "app",
            "author_key_id": None,
            "author": f"sql role {name}",
        }
    ]
    blockers = [b for b in _blockers(conn, cand, world["prod"]) if b["suite_id"]]
    assert {b["candidate_author"] for b in blockers} == {f"sql role {name}"}
    assert all("does not trust" in b["reason"] for b in blockers)
    with pytest.raises(psycopg.errors.CheckViolation, match=f"sql role {name}"):
        conn.execute(
            "UPDATE serve.adapter SET status = 'prod', traffic_pct = 100 WHERE id = %s", (cand,)
        )
    # SET ROLE cft_app from its own login changes nothing.
    with mallory.transaction():
        mallory.execute("SET LOCAL ROLE cft_app")
        mallory.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(tid),))
        mallory.execute("SELECT set_config('cft.evaluator', 'forged', true)")
        mallory.execute(
            "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
            " VALUES (%s, 'tasks', 'accuracy', 0.98)",
            (cand,),
        )
    assert _authors(conn, cand) == {("sql", "app")}


def test_a_key_of_another_tenant_cannot_author(conn: Any, world: dict[str, Any]) -> None:
    other = make_tenant(conn)
    create_key(conn, tenant_id=other["id"], role="release")
    kid = conn.execute(
        "SELECT id FROM auth.api_key WHERE tenant_id = %s", (other["id"],)
    ).fetchone()["id"]
    with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
        conn.execute("SELECT set_config('cft.key_id', %s, true)", (str(kid),))
        conn.execute(
            "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
            " VALUES (%s, 'tasks', 'accuracy', 0.9)",
            (world["cand"],),
        )
    conn.execute(
        "UPDATE auth.api_key SET revoked_at = now() WHERE id = %s", (world["ids"]["release"],)
    )
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="no live API key"),
        conn.transaction(),
    ):
        conn.execute("SELECT set_config('cft.key_id', %s, true)", (str(world["ids"]["release"]),))
        conn.execute(
            "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
            " VALUES (%s, 'tasks', 'accuracy', 0.9)",
            (world["cand"],),
        )


def test_a_release_login_cannot_certify_its_own_promotion(conn: Any, world: dict[str, Any]) -> None:
    """The audit's door: as cft_release, raise a refused candidate's scores and lower the prod's,
    then promote. Results are facts: the UPDATE is refused; new results written instead are the
    release role's, which satisfy no required rule by default: the gate still refuses, and the
    raw UPDATE promoting it fails."""
    cand, prod = world["cand"], world["prod"]
    conn.execute(
        "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score) VALUES"
        " (%s, 'tasks', 'accuracy', 0.1), (%s, 'heldout', 'loss', 9.0)",
        (cand, cand),
    )
    assert _blockers(conn, cand, prod)  # refused on its merits
    for sql in (
        "UPDATE train.eval_result SET score = 0.99 WHERE adapter_id = %s",
        "DELETE FROM train.eval_result WHERE adapter_id = %s",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
            conn.execute("SET LOCAL ROLE cft_release")
            conn.execute(sql, (prod,))
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cft_release")
        conn.execute(
            "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score) VALUES"
            " (%s, 'tasks', 'accuracy', 0.99), (%s, 'heldout', 'loss', 0.01),"
            " (%s, 'tasks', 'accuracy', 0.01), (%s, 'heldout', 'loss', 9.9)",
            (cand, cand, prod, prod),
        )
    # The release role's newer results are kept, but the trusted ones still count: refused on
    # the same merits, with the same scores.
    refused = _blockers(conn, cand, prod)
    assert sorted((b["metric"], float(b["candidate_score"])) for b in refused) == [
        ("accuracy", 0.1),
        ("loss", 9.0),
    ], refused
    with pytest.raises(psycopg.Error), conn.transaction():
        conn.execute("SET LOCAL ROLE cft_release")
        conn.execute("SELECT set_config('cft.reason', 'looks good', true)")
        conn.execute(
            "UPDATE serve.adapter SET status = 'prod', traffic_pct = 100 WHERE id = %s", (cand,)
        )
