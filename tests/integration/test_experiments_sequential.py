"""Always-valid decisions (docs/experiments.md): the mSPRT in SQL, guards, the watch after a
promotion, and an auto-policy that no longer promotes on an early peek."""

from __future__ import annotations

from typing import Any

import numpy as np

from bench import sequential as sim
from tests.support.factories import make_adapter, make_route, make_tenant
from tests.support.traffic import make_traffic


def _evals(conn: Any, *ids: str) -> None:
    for adapter_id in ids:
        conn.execute(
            # Scored without a judge: a judge-scored required metric needs a calibrated judge.
            "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
            " VALUES (%s, 'golden', 'accuracy', 0.8)",
            (adapter_id,),
        )


def _world(conn: Any, *, evals: bool = True) -> dict[str, Any]:
    tenant = make_tenant(conn)
    route = make_route(conn, tenant_id=tenant["id"])
    prod = make_adapter(conn, route=route, status="prod", traffic_pct=100)
    canary = make_adapter(conn, route=route, status="canary", traffic_pct=20)
    conn.execute(
        "INSERT INTO train.promotion_policy (tenant_id, route, suite_id, metric, direction,"
        " tolerance) VALUES (%s, %s, 'golden', 'accuracy', 'higher', 0.02)",
        (tenant["id"], route["name"]),
    )
    if evals:
        _evals(conn, prod["id"], canary["id"])
    conn.execute(
        "INSERT INTO serve.experiment_policy (route, tenant_id, enabled, metric, alpha, min_n)"
        " VALUES (%s, %s, true, 'thumbs_up_rate', 0.05, 500)",
        (route["name"], tenant["id"]),
    )
    return {
        "tenant": tenant["id"],
        "route": route["name"],
        "prod": prod["id"],
        "canary": canary["id"],
    }


def _traffic(conn: Any, w: dict[str, Any], adapter: str, variant: str, **kw: Any) -> None:
    make_traffic(
        conn,
        tenant_id=w["tenant"],
        route=w["route"],
        experiment=w["route"],
        variant=variant,
        adapter_id=adapter,
        **kw,
    )


def _exact(conn: Any, w: dict[str, Any], adapter: str, variant: str, *, n: int, up: int) -> None:
    """n rated rows, exactly `up` of them thumbs up, everything else identical."""
    conn.execute(
        """
        INSERT INTO obs.inference_log
          (request_id, tenant_id, route, adapter_id, experiment, variant, messages, completion,
           ttft_ms, tokens_in, tokens_out, fb_explicit, created_at)
        SELECT gen_random_uuid(), %(t)s, %(r)s, %(a)s, %(r)s, %(v)s, '[]'::jsonb, 'a', 200, 5, 20,
               CASE WHEN i <= %(up)s THEN 1 ELSE -1 END, now() - make_interval(secs => i)
          FROM generate_series(1, %(n)s) i
        """,
        {"t": w["tenant"], "r": w["route"], "a": adapter, "v": variant, "n": n, "up": up},
    )


def _status(conn: Any, adapter_id: str) -> str:
    row = conn.execute("SELECT status FROM serve.adapter WHERE id = %s", (adapter_id,)).fetchone()
    return str(row["status"])


def _autopolicy(conn: Any, w: dict[str, Any]) -> list[dict[str, Any]]:
    return conn.execute(  # type: ignore[no-any-return]
        "SELECT * FROM serve.experiment_autopolicy(%s, %s)", (w["tenant"], w["route"])
    ).fetchall()


def test_sql_msprt_agrees_with_the_simulation_formula(conn: Any) -> None:
    rng = np.random.default_rng(4)
    for _ in range(200):
        diff = float(rng.normal(0, 0.05))
        var = float(10 ** rng.uniform(-7, -2))
        tau = float(rng.choice([0.02, 0.05, 0.1, 0.3]))
        alpha = float(rng.choice([0.01, 0.05, 0.1]))
        row = conn.execute(
            "SELECT * FROM stats.msprt(%s, %s, %s, %s)", (diff, var, tau, alpha)
        ).fetchone()
        want = sim.msprt(np.array(diff), np.array(var), tau, alpha)
        for got, exp in zip(
            (row["log_lr"], row["p_value"], row["ci_low"], row["ci_high"]), want, strict=True
        ):
            assert abs(got - float(exp)) <= 1e-9 * max(1.0, abs(float(exp)))
        # The interval excludes 0 exactly when the test rejects.
        assert (row["p_value"] <= alpha) == (row["ci_low"] > 0 or row["ci_high"] < 0)
    for x, n in ((0, 1), (3, 10), (500, 1000), (999, 1000)):
        got = conn.execute("SELECT stats.rate_var(%s, %s) AS v", (x, n)).fetchone()["v"]
        assert abs(got - float(sim.rate_var(np.array(x), np.array(n)))) < 1e-15
    assert (
        conn.execute("SELECT (stats.msprt(0.1, 0, 0.05, 0.05)).p_value AS p").fetchone()["p"]
        is None
    )


def test_sequential_compare_matches_the_simulation_on_logged_rows(conn: Any) -> None:
    w = _world(conn)
    _exact(conn, w, w["prod"], "A", n=1000, up=500)
    _exact(conn, w, w["canary"], "B", n=1000, up=560)
    row = conn.execute(
        "SELECT x.* FROM obs.sequential_compare("
        " obs.sample_arm(%(t)s, %(p)s, now() - interval '1 day', now(), %(r)s, NULL, true),"
        " obs.sample_arm(%(t)s, %(c)s, now() - interval '1 day', now(), %(r)s, NULL, false)) x"
        " WHERE x.metric = 'thumbs_up_rate'",
        {"t": w["tenant"], "p": w["prod"], "c": w["canary"], "r": w["route"]},
    ).fetchone()
    x_c, x_k, n = np.array(500.0), np.array(560.0), np.array(1000.0)
    var = sim.rate_var(x_c, n) / n + sim.rate_var(x_k, n) / n
    _, p, lo, hi = sim.msprt(x_k / n - x_c / n, var, sim.TAU_RATE, 0.05)
    assert abs(row["diff"] - 0.06) < 1e-12 and abs(row["var_diff"] - float(var)) < 1e-15
    assert abs(row["p_value"] - float(p)) < 1e-12
    assert abs(row["ci_low"] - float(lo)) < 1e-12 and abs(row["ci_high"] - float(hi)) < 1e-12


def test_no_promotion_on_an_early_peek_the_fixed_test_calls_significant(conn: Any) -> None:
    w = _world(conn)
    _exact(conn, w, w["prod"], "A", n=1000, up=500)
    _exact(conn, w, w["canary"], "B", n=1000, up=560)
    fixed = conn.execute(
        "SELECT * FROM obs.experiment_compare(%s, now() - interval '1 day', now() + interval '1 s')"
        " WHERE metric = 'thumbs_up_rate'",
        (w["route"],),
    ).fetchone()
    assert fixed["significant"] and fixed["p_value"] < 0.01  # a peeker would promote now
    [d] = _autopolicy(conn, w)
    assert d["action"] == "hold" and d["code"] == "not_significant"
    assert d["numbers"]["primary"]["p_value"] > 0.05
    assert d["numbers"]["fixed_horizon"]["significant"] is True
    assert _status(conn, w["canary"]) == "canary"

    # The same effect, four times the data: now the always-valid test decides.
    _exact(conn, w, w["prod"], "A", n=3000, up=1500)
    _exact(conn, w, w["canary"], "B", n=3000, up=1680)
    [d] = _autopolicy(conn, w)
    assert d["action"] == "promote" and d["code"] == "promoted"
    assert d["numbers"]["primary"]["ci_low"] > 0
    assert _status(conn, w["canary"]) == "prod"


def test_a_guard_blocks_a_primary_metric_winner(conn: Any) -> None:
    w = _world(conn)
    _traffic(conn, w, w["prod"], "A", n=3000, p_up=0.5, p_regen=0.10, seed=0.3)
    _traffic(conn, w, w["canary"], "B", n=3000, p_up=0.6, p_regen=0.20, seed=0.4)
    conn.execute("UPDATE serve.experiment_policy SET rollback_enabled = false")
    [c] = conn.execute(
        "SELECT * FROM serve.canary_decision(%s, %s)", (w["tenant"], w["route"])
    ).fetchall()
    assert c["decision"] == "retire" and c["code"] == "guard_regen"
    assert c["numbers"]["primary"]["significant"] and c["numbers"]["primary"]["canary_better"]
    assert c["reason"].startswith("canary wins but guard regen broken: regen_rate")
    g = c["numbers"]["guards"]["guards"]["regen"]
    assert g["tripped"] and g["ci_low"] > g["margin"] == 0.02
    assert c["numbers"]["guards"]["tripped"] == ["regen"]

    [d] = _autopolicy(conn, w)  # rollback off: recorded, not acted on
    assert d["action"] == "hold" and d["code"] == "guard_regen"
    assert _status(conn, w["canary"]) == "canary"
    # NULL margin = guard off: the same winner would be promoted.
    conn.execute("UPDATE serve.experiment_policy SET guard_regen_margin = NULL")
    [c] = conn.execute(
        "SELECT * FROM serve.canary_decision(%s, %s)", (w["tenant"], w["route"])
    ).fetchall()
    assert c["decision"] == "promote" and "regen" not in c["numbers"]["guards"]["enabled"]

    conn.execute(
        "UPDATE serve.experiment_policy SET guard_regen_margin = 0.02, rollback_enabled = true"
    )
    [d] = _autopolicy(conn, w)
    assert d["action"] == "rollback" and d["code"] == "guard_regen"
    assert _status(conn, w["canary"]) == "retired" and _status(conn, w["prod"]) == "prod"


def test_error_and_answer_length_guards(conn: Any) -> None:
    w = _world(conn)
    _traffic(conn, w, w["prod"], "A", n=3000, p_up=0.5, seed=0.3)
    _traffic(conn, w, w["canary"], "B", n=3000, p_up=0.6, seed=0.4)
    conn.execute(
        "UPDATE obs.inference_log SET status = 'partial' WHERE adapter_id = %s AND random() < 0.08",
        (w["canary"],),
    )
    [c] = conn.execute(
        "SELECT * FROM serve.canary_decision(%s, %s)", (w["tenant"], w["route"])
    ).fetchall()
    assert c["code"] == "guard_error" and "guard error broken: error_rate" in c["reason"]
    conn.execute(
        "UPDATE obs.inference_log SET status = 'ok', tokens_out = tokens_out * 2 WHERE adapter_id = %s",
        (w["canary"],),
    )
    [c] = conn.execute(
        "SELECT * FROM serve.canary_decision(%s, %s)", (w["tenant"], w["route"])
    ).fetchall()
    assert c["code"] == "guard_tokens_out" and "+" in c["reason"]
    # Shorter answers break no guard (a length limit may be what users want): one-sided.
    conn.execute(
        "UPDATE obs.inference_log SET tokens_out = tokens_out / 4 WHERE adapter_id = %s",
        (w["canary"],),
    )
    [c] = conn.execute(
        "SELECT * FROM serve.canary_decision(%s, %s)", (w["tenant"], w["route"])
    ).fetchall()
    assert "tokens_out" not in c["numbers"]["guards"]["tripped"], c["reason"]
    conn.execute(
        "UPDATE obs.inference_log SET tokens_out = tokens_out * 2 WHERE adapter_id = %s",
        (w["canary"],),
    )
    conn.execute(
        "UPDATE obs.inference_log SET ttft_ms = ttft_ms * 2 WHERE adapter_id = %s", (w["canary"],)
    )
    [c] = conn.execute(
        "SELECT * FROM serve.canary_decision(%s, %s)", (w["tenant"], w["route"])
    ).fetchall()
    assert c["code"] == "guard_ttft_p95" and "prod p95 + 10 %" in c["reason"]
    conn.execute(
        "UPDATE obs.inference_log SET ttft_ms = ttft_ms / 2 WHERE adapter_id = %s", (w["canary"],)
    )
    [c] = conn.execute(
        "SELECT * FROM serve.canary_decision(%s, %s)", (w["tenant"], w["route"])
    ).fetchall()
    assert c["decision"] == "promote" and c["numbers"]["guards"]["tripped"] == []


def test_budget_retires_an_undecided_canary_and_defaults_apply_without_a_policy(conn: Any) -> None:
    w = _world(conn)
    _traffic(conn, w, w["prod"], "A", n=2000, p_up=0.5, seed=0.3)
    _traffic(conn, w, w["canary"], "B", n=2000, p_up=0.5, seed=0.4)
    [c] = conn.execute(
        "SELECT * FROM serve.canary_decision(%s, %s)", (w["tenant"], w["route"])
    ).fetchall()
    assert c["decision"] == "continue" and c["code"] == "not_significant"
    conn.execute("UPDATE serve.experiment_policy SET max_duration = interval '1 hour'")
    [d] = _autopolicy(conn, w)
    assert d["action"] == "rollback" and d["code"] == "budget_exhausted"
    assert "time budget of 01:00:00 reached undecided" in d["reason"]

    conn.execute("DELETE FROM serve.experiment_policy")
    pol = conn.execute(
        "SELECT * FROM serve.experiment_policy_of(%s, %s)", (w["tenant"], w["route"])
    ).fetchone()
    assert pol["enabled"] is False and pol["tenant_id"] == w["tenant"]
    assert pol["guard_regen_margin"] == 0.02 and pol["min_n"] == 1000 and pol["alpha"] == 0.05
    assert str(pol["watch_window"]) == "3 days, 0:00:00"


def _promoted_world(conn: Any, *, new_partial: float) -> dict[str, Any]:
    """prod P replaced by C 50 hours ago; P's traffic before, C's after (a share partial)."""
    w = _world(conn)
    conn.execute(
        "UPDATE serve.adapter SET status = 'prod', traffic_pct = 100 WHERE id = %s", (w["canary"],)
    )
    conn.execute(
        "UPDATE serve.adapter SET promoted_at = now() - interval '50 hours' WHERE id = %s",
        (w["canary"],),
    )
    _traffic(conn, w, w["prod"], "A", n=3000, p_up=0.5, seed=0.3)
    conn.execute(
        "UPDATE obs.inference_log SET created_at = created_at - interval '52 hours' WHERE adapter_id = %s",
        (w["prod"],),
    )
    _traffic(conn, w, w["canary"], "A", n=3000, p_up=0.5, seed=0.4)
    conn.execute(
        "UPDATE obs.inference_log SET status = 'partial' WHERE adapter_id = %s AND random() < %s",
        (w["canary"], new_partial),
    )
    return w


def test_a_new_prod_that_breaks_a_guard_is_rolled_back(conn: Any) -> None:
    w = _promoted_world(conn, new_partial=0.06)
    [wd] = conn.execute(
        "SELECT * FROM serve.watch_decision(%s, %s)", (w["tenant"], w["route"])
    ).fetchall()
    assert (wd["adapter_id"], wd["previous_id"]) == (w["canary"], w["prod"])
    assert wd["decision"] == "rollback" and wd["code"] == "guard_error"
    assert wd["numbers"]["restorable"] is True and wd["numbers"]["n_previous"] == 3000

    [d] = _autopolicy(conn, w)
    assert d["action"] == "rollback" and d["code"] == "watch_guard_error"
    assert (d["canary_id"], d["control_id"]) == (w["canary"], w["prod"])
    assert _status(conn, w["canary"]) == "retired" and _status(conn, w["prod"]) == "prod"
    reason = conn.execute(
        "SELECT reason FROM serve.adapter_event WHERE adapter_id = %s ORDER BY id DESC LIMIT 1",
        (w["canary"],),
    ).fetchone()["reason"]
    assert reason.startswith("auto-policy watch: new prod") and "guard error broken" in reason


def test_a_healthy_new_prod_is_kept(conn: Any) -> None:
    w = _promoted_world(conn, new_partial=0.0)
    [wd] = conn.execute(
        "SELECT * FROM serve.watch_decision(%s, %s)", (w["tenant"], w["route"])
    ).fetchall()
    assert wd["decision"] in ("continue", "keep") and wd["numbers"]["guards"]["tripped"] == []
    [wd] = conn.execute(
        "SELECT * FROM serve.watch_decision(%s, %s, interval '1 hour')", (w["tenant"], w["route"])
    ).fetchall()
    assert wd["decision"] == "keep" and wd["code"] in ("window_passed", "guards_hold")
    no_canary = conn.execute(
        "SELECT * FROM serve.canary_decision(%s, %s)", (w["tenant"], w["route"])
    ).fetchall()
    assert no_canary == []
    [d] = _autopolicy(conn, w)
    assert d["action"] == "hold" and d["code"].startswith("watch_")
    assert _status(conn, w["canary"]) == "prod"


def test_a_route_served_by_its_bare_base_is_decided_against_the_base(conn: Any) -> None:
    """No prod row yet: the base model's traffic (variant A, adapter_id = the route's base)
    is the control, so the first adapter of a route is decided by the always-valid rule too."""
    tenant = make_tenant(conn)
    route = make_route(conn, tenant_id=tenant["id"])
    canary = make_adapter(conn, route=route, status="canary", traffic_pct=20)
    w = {"tenant": tenant["id"], "route": route["name"], "canary": canary["id"]}
    _exact(conn, w, route["base_model"], "A", n=1200, up=360)
    _exact(conn, w, canary["id"], "B", n=1200, up=900)
    (d,) = conn.execute(
        "SELECT * FROM serve.canary_decision(%s, %s)", (tenant["id"], route["name"])
    ).fetchall()
    assert (d["control_id"], d["decision"]) == (route["base_model"], "promote"), d["reason"]
    assert d["code"] == "significantly_better"
    # Traffic of some other model as control is still refused.
    conn.execute("UPDATE obs.inference_log SET adapter_id = 'other' WHERE variant = 'A'")
    (d,) = conn.execute(
        "SELECT * FROM serve.canary_decision(%s, %s)", (tenant["id"], route["name"])
    ).fetchall()
    assert d["code"] == "control_not_prod"


def test_msprt_of_a_zero_variance_from_plpgsql_is_null_not_an_error(conn: Any) -> None:
    """In PL/pgSQL the arguments are known at plan time: ln(0) was constant-folded and raised
    (serve.canary_decision failed on a control arm with identical answer lengths)."""
    conn.execute(
        """DO $$ DECLARE v float8 := 0; d float8 := 0.5; r record; BEGIN
             SELECT * INTO r FROM stats.msprt(d, v, 0.05, 0.05);
             IF r.log_lr IS NOT NULL THEN RAISE EXCEPTION 'expected no test, got %', r; END IF;
           END $$"""
    )
    row = conn.execute("SELECT * FROM stats.msprt(0.5, 0.01, 0.05, 0.05)").fetchone()
    assert 0.09 < row["p_value"] < 0.095 and row["ci_low"] < 0 < row["ci_high"]


def test_another_tenants_experiment_of_the_same_name_stays_out_of_the_numbers(conn: Any) -> None:
    """Experiment names are unique per tenant only: another tenant logging three times the 'A'
    rows under this route's experiment name neither becomes the control of its fixed-horizon
    numbers nor enters its arms, while the name-only call (a dashboard's) still sees both."""
    w = _world(conn)
    _exact(conn, w, w["prod"], "A", n=1000, up=500)
    _exact(conn, w, w["canary"], "B", n=1000, up=560)
    other = make_tenant(conn)
    intruder = {"tenant": other["id"], "route": w["route"]}
    conn.execute(
        "INSERT INTO serve.route (name, tenant_id, base_model, experiment)"
        " VALUES ('other-route', %s, 'smollm2-135m-instruct', %s)",
        (other["id"], w["route"]),
    )
    _exact(conn, intruder, "intruder-prod", "A", n=3000, up=100)

    [c] = conn.execute(
        "SELECT * FROM serve.canary_decision(%s, %s)", (w["tenant"], w["route"])
    ).fetchall()
    fixed = c["numbers"]["fixed_horizon"]
    assert (fixed["control_adapter"], fixed["n_control"]) == (w["prod"], 1000)
    mine = conn.execute(
        "SELECT adapter_id, n FROM obs.experiment_arms(%s, now() - interval '1 day', now(),"
        " p_tenant_id => %s) ORDER BY adapter_id",
        (w["route"], w["tenant"]),
    ).fetchall()
    assert {(r["adapter_id"], r["n"]) for r in mine} == {(w["canary"], 1000), (w["prod"], 1000)}
    both = conn.execute(
        "SELECT count(*) AS n FROM obs.experiment_arms(%s, now() - interval '1 day', now())",
        (w["route"],),
    ).fetchone()
    assert both["n"] == 3
