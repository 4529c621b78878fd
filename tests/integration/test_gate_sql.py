"""The promotion gate in PostgreSQL: can_promote, the trigger on serve.adapter, override, rollback."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.support.factories import make_adapter, make_route, make_tenant


def policy(conn, route, suite, metric, direction, tolerance=0.02, required=True):
    """A rule of route (a route row), or a global one (route None)."""
    conn.execute(
        "INSERT INTO train.promotion_policy"
        " (tenant_id, route, suite_id, metric, direction, tolerance, required)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (
            route and route["tenant_id"],
            route and route["name"],
            suite,
            metric,
            direction,
            tolerance,
            required,
        ),
    )


def result(conn, adapter, suite, metric, score, judge=None):
    conn.execute(
        "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score, judge_model)"
        " VALUES (%s, %s, %s, %s, %s)",
        (adapter, suite, metric, score, judge),
    )


def can(conn, cand, cur):
    return conn.execute("SELECT serve.can_promote(%s, %s) AS ok", (cand, cur)).fetchone()["ok"]


def reasons(conn, cand, cur):
    rows = conn.execute("SELECT * FROM serve.promotion_blockers(%s, %s)", (cand, cur)).fetchall()
    return [r["reason"] for r in rows]


def status(conn, adapter_id):
    return conn.execute("SELECT status FROM serve.adapter WHERE id = %s", (adapter_id,)).fetchone()[
        "status"
    ]


def prods(conn, route):
    rows = conn.execute(
        "SELECT id FROM serve.adapter WHERE route = %s AND status = 'prod'", (route,)
    ).fetchall()
    return [r["id"] for r in rows]


def promote(conn, adapter_id):
    conn.execute(
        "UPDATE serve.adapter SET status = 'prod', traffic_pct = 100 WHERE id = %s", (adapter_id,)
    )


@pytest.fixture
def world(conn):
    """A route with a policy (accuracy higher, loss lower), a prod and a candidate."""
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    policy(conn, r, "tasks", "accuracy", "higher")
    policy(conn, r, "heldout", "loss", "lower")
    prod = make_adapter(conn, route=r, status="prod", traffic_pct=100)
    result(conn, prod["id"], "tasks", "accuracy", 0.80)
    result(conn, prod["id"], "heldout", "loss", 1.50)
    cand = make_adapter(conn, route=r)
    return {"tenant": t, "route": r, "prod": prod["id"], "cand": cand["id"]}


def test_candidate_with_no_results_is_refused(conn, world):
    assert can(conn, world["cand"], world["prod"]) is False
    assert "candidate has no eval results" in reasons(conn, world["cand"], world["prod"])


def test_missing_required_metric_is_refused(conn, world):
    result(conn, world["cand"], "tasks", "accuracy", 0.95)
    assert can(conn, world["cand"], world["prod"]) is False
    rows = conn.execute(
        "SELECT * FROM serve.promotion_blockers(%s, %s)", (world["cand"], world["prod"])
    ).fetchall()
    assert [(r["suite_id"], r["metric"]) for r in rows] == [("heldout", "loss")]
    assert "required" in rows[0]["reason"]


def test_results_only_for_a_non_required_suite_are_refused(conn, world):
    result(conn, world["cand"], "vibes", "score", 0.99)
    assert can(conn, world["cand"], world["prod"]) is False
    why = reasons(conn, world["cand"], world["prod"])
    assert len(why) == 3 and sum("required" in w for w in why) == 2
    assert any(w.startswith("nothing compared") for w in why)


@pytest.fixture
def bare(conn):
    """A route with a prod and a candidate and no policy at all (the global rules removed)."""
    conn.execute("DELETE FROM train.promotion_policy WHERE route IS NULL")
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    prod = make_adapter(conn, route=r, status="prod", traffic_pct=100)
    cand = make_adapter(conn, route=r)
    return {"route": r, "prod": prod["id"], "cand": cand["id"]}


def test_unpolicied_suite_is_compared_by_the_default_rule(conn, bare):
    # Results far worse than the prod's, on a suite no rule names.
    result(conn, bare["prod"], "house-style", "pass_rate", 0.90)
    result(conn, bare["cand"], "house-style", "pass_rate", 0.10)
    rows = conn.execute(
        "SELECT * FROM serve.promotion_blockers(%s, %s)", (bare["cand"], bare["prod"])
    ).fetchall()
    assert [(r["suite_id"], r["metric"], r["direction"]) for r in rows] == [
        ("house-style", "pass_rate", "higher")
    ]
    assert "default rule" in rows[0]["reason"] and float(rows[0]["threshold"]) == 0.882
    with pytest.raises(psycopg.errors.CheckViolation, match="default rule"):
        promote(conn, bare["cand"])
    # Within the default 2 %: compared and passed.
    result(conn, bare["cand"], "house-style", "pass_rate", 0.89)  # a correction: the newest counts
    assert can(conn, bare["cand"], bare["prod"]) is True
    promote(conn, bare["cand"])
    assert prods(conn, bare["route"]["name"]) == [bare["cand"]]


def test_gate_refuses_when_nothing_was_compared(conn, bare):
    # The prod was never scored on the candidate's suite: nothing is compared.
    result(conn, bare["cand"], "house-style", "pass_rate", 0.99)
    assert reasons(conn, bare["cand"], bare["prod"]) == [
        f"nothing compared: no metric of {bare['cand']} was compared with the current prod"
        f" {bare['prod']} (evaluate both on a common suite)"
    ]
    with pytest.raises(psycopg.errors.CheckViolation, match="nothing compared"):
        promote(conn, bare["cand"])
    # A suite the policy says to ignore is not compared either.
    result(conn, bare["prod"], "house-style", "pass_rate", 0.50)
    assert can(conn, bare["cand"], bare["prod"]) is True
    policy(conn, bare["route"], "house-style", "pass_rate", "ignore", required=False)
    assert [w[:16] for w in reasons(conn, bare["cand"], bare["prod"])] == ["nothing compared"]


def test_first_adapter_of_a_route_needs_results_but_no_comparison(conn, bare):
    conn.execute(
        "UPDATE serve.adapter SET status = 'retired', traffic_pct = 0 WHERE id = %s",
        (bare["prod"],),
    )
    assert reasons(conn, bare["cand"], None) == ["candidate has no eval results"]
    result(conn, bare["cand"], "house-style", "pass_rate", 0.20)
    assert can(conn, bare["cand"], None) is True


def test_improving_candidate_passes(conn, world):
    result(conn, world["cand"], "tasks", "accuracy", 0.85)
    result(conn, world["cand"], "heldout", "loss", 1.40)
    assert can(conn, world["cand"], world["prod"]) is True
    assert reasons(conn, world["cand"], world["prod"]) == []


@pytest.mark.parametrize(
    ("accuracy", "loss", "ok"),
    [
        (0.785, 1.50, True),  # 0.8 * 0.98 = 0.784: within tolerance
        (0.783, 1.50, False),  # higher-is-better regression
        (0.80, 1.529, True),  # 1.5 * 1.02 = 1.53: within tolerance
        (0.80, 1.531, False),  # lower-is-better regression
        (0.99, 1.60, False),  # better on one, worse on the other
    ],
)
def test_regression_in_each_direction(conn, world, accuracy, loss, ok):
    result(conn, world["cand"], "tasks", "accuracy", accuracy)
    result(conn, world["cand"], "heldout", "loss", loss)
    assert can(conn, world["cand"], world["prod"]) is ok
    if not ok:
        rows = conn.execute(
            "SELECT * FROM serve.promotion_blockers(%s, %s)", (world["cand"], world["prod"])
        ).fetchall()
        assert len(rows) == 1 and rows[0]["reason"].startswith("regression")
        assert rows[0]["threshold"] is not None and rows[0]["current_score"] is not None


def test_tolerance_is_relative_to_the_absolute_score_and_sane_at_zero(conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    policy(conn, r, "reward", "margin", "higher", tolerance=0.1)
    prod = make_adapter(conn, route=r, status="prod", traffic_pct=100)["id"]
    a, b, c = (make_adapter(conn, route=r)["id"] for _ in range(3))
    result(conn, prod, "reward", "margin", -10)
    result(conn, a, "reward", "margin", -10.9)  # within 10 % of |-10|
    result(conn, b, "reward", "margin", -11.1)  # beyond (an absolute p * 0.98 would allow it)
    result(conn, c, "reward", "margin", -9)
    assert (can(conn, a, prod), can(conn, b, prod), can(conn, c, prod)) == (True, False, True)
    result(conn, prod, "reward", "margin", 0)
    assert can(conn, a, prod) is False  # at 0 no regression is tolerated
    result(conn, a, "reward", "margin", 0)
    assert can(conn, a, prod) is True


@pytest.mark.parametrize("score", [None, "NaN", "Infinity"])
def test_failed_candidate_scores_are_refused(conn, world, score):
    result(conn, world["cand"], "tasks", "accuracy", score)
    result(conn, world["cand"], "heldout", "loss", 1.0)
    assert can(conn, world["cand"], world["prod"]) is False
    assert "not a finite number" in reasons(conn, world["cand"], world["prod"])[0]


def test_incomparable_results_are_refused(conn, world):
    result(conn, world["cand"], "tasks", "accuracy", 0.9, judge="judge-b")
    result(conn, world["cand"], "heldout", "loss", 1.0)
    prod_accuracy = conn.execute(
        "SELECT score FROM train.eval_result_counted WHERE adapter_id = %s AND metric = 'accuracy'",
        (world["prod"],),
    ).fetchone()["score"]
    result(conn, world["prod"], "tasks", "accuracy", prod_accuracy, judge="judge-a")
    assert "judged by different models" in reasons(conn, world["cand"], world["prod"])[0]
    # The current adapter lacks a required metric: nothing to compare like for like.
    result(conn, world["cand"], "tasks", "accuracy", 0.9, judge="judge-a")
    lacking = make_adapter(conn, route=world["route"])["id"]
    result(conn, lacking, "tasks", "accuracy", prod_accuracy, judge="judge-a")
    assert "current adapter has no result" in reasons(conn, world["cand"], lacking)[0]


def test_missing_adapters_other_route_and_other_base_are_refused(conn, world):
    result(conn, world["cand"], "tasks", "accuracy", 0.9)
    result(conn, world["cand"], "heldout", "loss", 1.0)
    assert can(conn, "nope", world["prod"]) is False
    assert can(conn, world["cand"], "nope") is False
    assert can(conn, world["cand"], world["cand"]) is False
    other = make_route(conn, tenant_id=world["tenant"]["id"])
    elsewhere = make_adapter(conn, route=other, status="prod", traffic_pct=100)["id"]
    assert "route" in reasons(conn, world["cand"], elsewhere)[0]
    # Another base is refused where the adapter is registered; another revision of the same
    # base is registered, and the gate finds it not comparable.
    with pytest.raises(psycopg.errors.CheckViolation, match="but route"), conn.transaction():
        make_adapter(conn, route=world["route"], base_model="other-base")
    rebased = make_adapter(conn, route=world["route"], base_revision="other-rev")["id"]
    result(conn, rebased, "tasks", "accuracy", 0.9)
    result(conn, rebased, "heldout", "loss", 1.0)
    assert "not comparable" in reasons(conn, rebased, world["prod"])[0]


def test_no_policy_compares_by_default_and_a_route_row_overrides_the_global_one(conn):
    # Start without the default global policy.
    conn.execute("DELETE FROM train.promotion_policy WHERE route IS NULL")
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    prod = make_adapter(conn, route=r, status="prod", traffic_pct=100)["id"]
    cand = make_adapter(conn, route=r)["id"]
    result(conn, prod, "s", "m", 1.0)
    result(conn, cand, "s", "m", 0.5)
    assert "default rule" in reasons(conn, cand, prod)[0]
    policy(conn, None, "s", "m", "higher")
    assert can(conn, cand, prod) is False
    policy(conn, r, "s", "m", "lower")
    assert can(conn, cand, prod) is True


def test_first_prod_still_needs_the_required_metrics(conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    policy(conn, r, "heldout", "loss", "lower")
    cand = make_adapter(conn, route=r)["id"]
    result(conn, cand, "other", "x", 1)
    assert can(conn, cand, None) is False
    with pytest.raises(psycopg.errors.CheckViolation, match="promotion gate refused"):
        promote(conn, cand)
    result(conn, cand, "heldout", "loss", 2.0)
    promote(conn, cand)
    row = conn.execute("SELECT * FROM serve.adapter WHERE id = %s", (cand,)).fetchone()
    assert row["status"] == "prod" and row["promoted_at"] is not None
    assert row["previous_prod_id"] is None


def test_raw_sql_promotion_of_a_refused_candidate_raises_and_changes_nothing(conn, world):
    result(conn, world["cand"], "tasks", "accuracy", 0.5)
    result(conn, world["cand"], "heldout", "loss", 1.0)
    events = conn.execute("SELECT count(*) AS n FROM serve.adapter_event").fetchone()["n"]
    with pytest.raises(psycopg.errors.CheckViolation) as err:
        promote(conn, world["cand"])
    assert "tasks/accuracy: regression" in str(err.value)
    assert err.value.diag.constraint_name == "adapter_promotion_gate"
    assert status(conn, world["cand"]) == "candidate"
    assert prods(conn, world["route"]["name"]) == [world["prod"]]
    assert conn.execute("SELECT count(*) AS n FROM serve.adapter_event").fetchone()["n"] == events


def test_passing_promotion_demotes_old_prod_in_the_same_transaction(db_url, conn, world):
    result(conn, world["cand"], "tasks", "accuracy", 0.9)
    result(conn, world["cand"], "heldout", "loss", 1.2)
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN cft_adapter")
        with conn.transaction():
            conn.execute("SET LOCAL cft.reason = 'beats v1 on tasks'")
            promote(conn, world["cand"])
            # Inside the transaction, before commit: already exactly one prod.
            assert prods(conn, world["route"]["name"]) == [world["cand"]]
            assert status(conn, world["prod"]) == "retired"
        # PostgreSQL folds identical notifications of one transaction into one.
        got = [n.payload for n in listener.notifies(timeout=2, stop_after=2)]
    assert got == [world["route"]["name"]]
    row = conn.execute("SELECT * FROM serve.adapter WHERE id = %s", (world["cand"],)).fetchone()
    assert row["promoted_at"] is not None and row["previous_prod_id"] == world["prod"]
    ev = conn.execute(
        "SELECT * FROM serve.adapter_event WHERE op = 'UPDATE' ORDER BY id"
    ).fetchall()
    assert [(e["adapter_id"], e["old_status"], e["new_status"]) for e in ev] == [
        (world["prod"], "prod", "retired"),
        (world["cand"], "candidate", "prod"),
    ]
    assert all(e["reason"] == "beats v1 on tasks" and not e["override"] for e in ev)
    assert ev[1]["detail"]["gate"] == "promotion" and ev[1]["detail"]["against"] == world["prod"]


def test_concurrent_promotions_leave_exactly_one_prod(db_url, conn, world):
    a = world["cand"]
    b = make_adapter(conn, route=world["route"])["id"]
    for adapter, acc in ((a, 0.85), (b, 0.90)):
        result(conn, adapter, "tasks", "accuracy", acc)
        result(conn, adapter, "heldout", "loss", 1.4)
    c1 = psycopg.connect(db_url, row_factory=dict_row)
    c2 = psycopg.connect(db_url, row_factory=dict_row)
    errors: list[Exception] = []
    try:
        promote(c1, a)  # holds the route lock until commit

        def second() -> None:
            try:
                promote(c2, b)
                c2.commit()
            except Exception as exc:
                errors.append(exc)
                c2.rollback()

        th = threading.Thread(target=second)
        th.start()
        time.sleep(0.3)
        assert th.is_alive(), "the second promotion should wait for the route lock"
        c1.commit()
        th.join(10)
    finally:
        c1.close()
        c2.close()
    assert errors == []
    # The second one was judged against the first (not the stale prod) and replaced it.
    assert prods(conn, world["route"]["name"]) == [b]
    assert status(conn, a) == "retired" and status(conn, world["prod"]) == "retired"
    prev = conn.execute("SELECT previous_prod_id FROM serve.adapter WHERE id = %s", (b,)).fetchone()
    assert prev["previous_prod_id"] == a


def test_concurrent_promotion_that_loses_against_the_new_prod_is_refused(db_url, conn, world):
    a = world["cand"]
    b = make_adapter(conn, route=world["route"])["id"]
    result(conn, a, "tasks", "accuracy", 0.95)
    result(conn, a, "heldout", "loss", 1.4)
    result(conn, b, "tasks", "accuracy", 0.81)  # beats the old prod, not a
    result(conn, b, "heldout", "loss", 1.4)
    with psycopg.connect(db_url) as c1, psycopg.connect(db_url) as c2:
        promote(c1, a)
        out: list[Exception] = []
        th = threading.Thread(target=lambda: _try(lambda: promote(c2, b), out))
        th.start()
        time.sleep(0.2)
        c1.commit()
        th.join(10)
        c2.rollback()
    assert len(out) == 1 and isinstance(out[0], psycopg.errors.CheckViolation)
    assert prods(conn, world["route"]["name"]) == [a]


def _try(fn, out):
    try:
        fn()
    except Exception as exc:
        out.append(exc)


def test_override_needs_role_and_reason_and_is_audited(conn, world):
    result(conn, world["cand"], "tasks", "accuracy", 0.1)
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="cft_release"),
        conn.transaction(),
    ):
        conn.execute("SET LOCAL cft.override = 'on'")
        conn.execute("SET LOCAL cft.reason = 'hotfix'")
        promote(conn, world["cand"])  # the superuser itself, not acting as cft_release
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="reason"), conn.transaction():
        conn.execute("SET LOCAL ROLE cft_release")
        conn.execute("SET LOCAL cft.override = 'on'")
        promote(conn, world["cand"])
    with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
        conn.execute("SET LOCAL ROLE cft_app")
        conn.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(world["tenant"]["id"]),))
        conn.execute("SET LOCAL cft.override = 'on'")
        conn.execute("SET LOCAL cft.reason = 'hotfix'")
        promote(conn, world["cand"])
    assert status(conn, world["cand"]) == "candidate"
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cft_release")
        conn.execute("SET LOCAL cft.override = 'on'")
        conn.execute("SET LOCAL cft.reason = 'security hotfix, evals pending'")
        promote(conn, world["cand"])
    assert prods(conn, world["route"]["name"]) == [world["cand"]]
    ev = conn.execute(
        "SELECT * FROM serve.adapter_event WHERE adapter_id = %s ORDER BY id DESC LIMIT 1",
        (world["cand"],),
    ).fetchone()
    assert ev["override"] is True and ev["reason"] == "security hotfix, evals pending"
    assert ev["actor"] == "postgres as cft_release"
    overridden = {(b["suite_id"], b["metric"]) for b in ev["detail"]["overridden"]}
    assert overridden == {("tasks", "accuracy"), ("heldout", "loss")}


def test_canary_start_requires_eval_results(conn, world):
    with pytest.raises(psycopg.errors.CheckViolation, match="canary gate refused"):
        conn.execute(
            "UPDATE serve.adapter SET status='canary', traffic_pct=5 WHERE id=%s", (world["cand"],)
        )
    result(conn, world["cand"], "tasks", "accuracy", 0.5)  # a regression is fine for a canary
    result(conn, world["cand"], "heldout", "loss", 9.0)
    conn.execute(
        "UPDATE serve.adapter SET status='canary', traffic_pct=5 WHERE id=%s", (world["cand"],)
    )
    assert status(conn, world["cand"]) == "canary"


def test_only_the_owner_may_insert_a_prod_or_canary(conn, world):
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="may not be created as canary"),
        conn.transaction(),
    ):
        conn.execute("SET LOCAL ROLE cft_app")
        conn.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(world["tenant"]["id"]),))
        make_adapter(conn, route=world["route"], id="sneaky", status="canary", traffic_pct=50)


def _promoted_world(conn, world):
    result(conn, world["cand"], "tasks", "accuracy", 0.9)
    result(conn, world["cand"], "heldout", "loss", 1.2)
    promote(conn, world["cand"])


def test_rollback_function_restores_the_previous_prod(conn, world):
    _promoted_world(conn, world)
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cft_release")
        got = conn.execute(
            "SELECT serve.rollback(%s, %s, 'complaints up') AS id",
            (world["route"]["tenant_id"], world["route"]["name"]),
        ).fetchone()
    assert got["id"] == world["prod"]
    assert prods(conn, world["route"]["name"]) == [world["prod"]]
    assert status(conn, world["cand"]) == "retired"
    ev = conn.execute(
        "SELECT * FROM serve.adapter_event WHERE op = 'UPDATE' ORDER BY id DESC LIMIT 2"
    ).fetchall()
    assert [(e["adapter_id"], e["new_status"]) for e in ev] == [
        (world["prod"], "prod"),
        (world["cand"], "retired"),
    ]
    assert ev[0]["detail"] == {"gate": "rollback", "rolled_back": world["cand"]}
    assert all(e["reason"] == "complaints up" for e in ev)
    # The restored prod has nothing before it: a second rollback fails and changes nothing.
    with pytest.raises(psycopg.errors.CheckViolation, match="no previous prod"):
        conn.execute(
            "SELECT serve.rollback(%s, %s, 'again')",
            (world["route"]["tenant_id"], world["route"]["name"]),
        )
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute(
            "SELECT serve.rollback(%s, %s, '  ')",
            (world["route"]["tenant_id"], world["route"]["name"]),
        )
    assert prods(conn, world["route"]["name"]) == [world["prod"]]


def test_retiring_prod_by_raw_sql_restores_the_previous_prod(conn, world):
    _promoted_world(conn, world)
    # Naming no share takes the retired adapter out of traffic.
    conn.execute("UPDATE serve.adapter SET status='retired' WHERE id=%s", (world["cand"],))
    assert prods(conn, world["route"]["name"]) == [world["prod"]]
    row = conn.execute("SELECT traffic_pct FROM serve.adapter WHERE id = %s", (world["cand"],))
    assert row.fetchone()["traffic_pct"] == 0
    # A tainted previous prod is not restored: the route is left without prod.
    conn.execute("UPDATE serve.adapter SET status='candidate' WHERE id=%s", (world["cand"],))
    promote(conn, world["cand"])
    conn.execute("UPDATE serve.adapter SET tainted_at = now() WHERE id=%s", (world["prod"],))
    conn.execute(
        "UPDATE serve.adapter SET status='retired', traffic_pct=0 WHERE id=%s", (world["cand"],)
    )
    assert prods(conn, world["route"]["name"]) == []


def test_release_role_promotes_with_column_privileges_only(conn, world):
    _ = result(conn, world["cand"], "tasks", "accuracy", 0.9)
    result(conn, world["cand"], "heldout", "loss", 1.2)
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cft_release")
        promote(conn, world["cand"])
    assert prods(conn, world["route"]["name"]) == [world["cand"]]


def test_cli_can_promote_exit_codes_and_reasons(db_url, conn, world):
    import os
    import subprocess
    import sys

    env = os.environ | {"CFT_DATABASE_URL": db_url}

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "cft.cli", *args], env=env, capture_output=True, text=True
        )

    result(conn, world["cand"], "tasks", "accuracy", 0.5)
    refused = cli("can-promote", world["cand"], world["prod"])
    assert refused.returncode == 1, refused.stderr
    assert "tasks/accuracy (higher is better): regression" in refused.stdout
    assert "heldout/loss" in refused.stdout
    result(conn, world["cand"], "tasks", "accuracy", 0.9)
    result(conn, world["cand"], "heldout", "loss", 1.0)
    allowed = cli("can-promote", world["cand"])  # CURRENT defaults to the route's prod
    assert allowed.returncode == 0 and "allowed" in allowed.stdout


def test_canary_ceiling_holds_for_a_raw_sql_update(conn, world):
    result(conn, world["cand"], "tasks", "accuracy", 0.85)
    result(conn, world["cand"], "heldout", "loss", 1.40)
    canary = "UPDATE serve.adapter SET status = 'canary', traffic_pct = %s WHERE id = %s"
    # Every user on a canary, no override.
    with pytest.raises(psycopg.errors.CheckViolation, match=r"above its ceiling of 50\.00 %"):
        conn.execute(canary, (100, world["cand"]))
    conn.execute(canary, (50, world["cand"]))
    with pytest.raises(psycopg.errors.CheckViolation, match="ceiling"):
        conn.execute("UPDATE serve.adapter SET traffic_pct = 60 WHERE id = %s", (world["cand"],))
    # A reasonless override is no override.
    with pytest.raises(psycopg.errors.CheckViolation, match="ceiling"), conn.transaction():
        conn.execute("SET LOCAL ROLE cft_release")
        conn.execute("SET LOCAL cft.override = 'on'")
        conn.execute("UPDATE serve.adapter SET traffic_pct = 90 WHERE id = %s", (world["cand"],))
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cft_release")
        conn.execute("SET LOCAL cft.override = 'on'")
        conn.execute("SET LOCAL cft.reason = 'load test of the new adapter'")
        conn.execute("UPDATE serve.adapter SET traffic_pct = 90 WHERE id = %s", (world["cand"],))
    event = conn.execute(
        "SELECT override, reason, new_traffic_pct FROM serve.adapter_event"
        " WHERE adapter_id = %s ORDER BY id DESC LIMIT 1",
        (world["cand"],),
    ).fetchone()
    assert event["override"] is True and event["reason"] == "load test of the new adapter"
    assert float(event["new_traffic_pct"]) == 90
    # The route's own ceiling, raised in SQL.
    conn.execute(
        "UPDATE serve.route SET max_canary_pct = 95 WHERE name = %s", (world["route"]["name"],)
    )
    conn.execute("UPDATE serve.adapter SET traffic_pct = 95 WHERE id = %s", (world["cand"],))


def test_a_route_keeps_its_base_while_its_adapters_live(conn, world):
    with pytest.raises(psycopg.errors.CheckViolation, match="cannot become"), conn.transaction():
        conn.execute(
            "UPDATE serve.route SET base_model = 'other-base' WHERE name = %s",
            (world["route"]["name"],),
        )
    conn.execute(
        "UPDATE serve.adapter SET status = 'retired', traffic_pct = 0 WHERE route = %s",
        (world["route"]["name"],),
    )
    conn.execute(
        "UPDATE serve.route SET base_model = 'other-base' WHERE name = %s",
        (world["route"]["name"],),
    )
