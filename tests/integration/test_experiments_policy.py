"""The live-traffic promotion policy acts only through the promotion gate, and audits itself."""

from __future__ import annotations

from typing import Any

from tests.support.factories import make_adapter, make_route, make_tenant
from tests.support.traffic import make_traffic


def _world(conn: Any, *, p_canary: float, evals: bool) -> dict[str, Any]:
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
        _record_evals(conn, prod["id"], canary["id"])
    for variant, adapter, p_up, seed in (("A", prod, 0.5, 0.3), ("B", canary, p_canary, 0.4)):
        make_traffic(
            conn,
            tenant_id=tenant["id"],
            route=route["name"],
            experiment=route["name"],
            variant=variant,
            adapter_id=adapter["id"],
            n=3000,
            p_up=p_up,
            seed=seed,
        )
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


def _record_evals(conn: Any, *ids: str) -> None:
    for adapter_id in ids:
        conn.execute(
            # Scored without a judge: a judge-scored required metric needs a calibrated judge.
            "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
            " VALUES (%s, 'golden', 'accuracy', 0.8)",
            (adapter_id,),
        )


def _run(conn: Any, w: dict[str, Any]) -> list[dict[str, Any]]:
    return conn.execute(  # type: ignore[no-any-return]
        "SELECT * FROM serve.experiment_autopolicy(%s, %s)", (w["tenant"], w["route"])
    ).fetchall()


def _status(conn: Any, adapter_id: str) -> str:
    return conn.execute("SELECT status FROM serve.adapter WHERE id = %s", (adapter_id,)).fetchone()[
        "status"
    ]  # type: ignore[no-any-return]


def test_winning_canary_without_eval_results_is_not_promoted(conn: Any) -> None:
    w = _world(conn, p_canary=0.6, evals=False)
    [d] = _run(conn, w)
    assert d["action"] == "blocked" and d["code"] == "gate_refused"
    assert "no eval results" in d["reason"]
    assert d["numbers"]["primary"]["significant"] is True
    assert _status(conn, w["canary"]) == "canary" and _status(conn, w["prod"]) == "prod"
    # The same verdict again is returned but not recorded twice.
    [again] = _run(conn, w)
    assert again["action"] == "blocked" and again["id"] is None
    n = conn.execute("SELECT count(*) AS n FROM serve.experiment_decision").fetchone()["n"]
    assert n == 1

    # With eval results the gate lets it through; the audit carries the numbers.
    _record_evals(conn, w["prod"], w["canary"])
    [d] = _run(conn, w)
    assert d["action"] == "promote" and d["id"] is not None
    assert _status(conn, w["canary"]) == "prod" and _status(conn, w["prod"]) == "retired"
    event = conn.execute(
        "SELECT reason, detail FROM serve.adapter_event WHERE adapter_id = %s"
        " AND new_status = 'prod' ORDER BY id DESC LIMIT 1",
        (w["canary"],),
    ).fetchone()
    assert event["reason"].startswith(
        "auto-policy: canary significantly better (always valid): thumbs_up_rate"
    )
    assert "p = " in event["reason"] and event["detail"]["gate"] == "promotion"
    nums = d["numbers"]["primary"]
    assert nums["p_value"] < 0.05 and nums["ci_low"] > 0 and nums["test"] == "msprt_rate"


def test_losing_canary_is_rolled_back_and_audited(conn: Any) -> None:
    w = _world(conn, p_canary=0.4, evals=True)
    [d] = _run(conn, w)
    assert d["action"] == "rollback" and d["code"] == "significantly_worse"
    assert _status(conn, w["canary"]) == "retired" and _status(conn, w["prod"]) == "prod"
    reason = conn.execute(
        "SELECT reason FROM serve.adapter_event WHERE adapter_id = %s ORDER BY id DESC LIMIT 1",
        (w["canary"],),
    ).fetchone()["reason"]
    assert reason.startswith("auto-policy: canary significantly worse")


def test_no_effect_holds_and_disabled_policy_does_nothing(conn: Any) -> None:
    w = _world(conn, p_canary=0.5, evals=True)
    [d] = _run(conn, w)
    assert d["action"] == "hold" and d["code"] == "not_significant"
    assert _status(conn, w["canary"]) == "canary"
    conn.execute("UPDATE serve.experiment_policy SET min_n = 100000")
    [d] = _run(conn, w)
    assert d["code"] == "insufficient_sample"
    conn.execute("UPDATE serve.experiment_policy SET enabled = false")
    assert _run(conn, w) == []


def test_worker_pass_applies_enabled_policies(db_url: str, conn: Any) -> None:
    from workers.experiments.worker import run_once

    w = _world(conn, p_canary=0.6, evals=True)
    assert run_once(db_url) == 1
    assert _status(conn, w["canary"]) == "prod"
