"""How the loop judges a canary, in SQL: the acceptance rate counts every kind of feedback, and
the guards judge the adapter, not the engine's cost of serving a LoRA."""

from __future__ import annotations

from typing import Any

from tests.support.factories import make_adapter, make_log, make_route, make_tenant
from tests.support.loop import set_policy, user


def _arm(conn: Any, t: Any, r: Any, adapter: str, variant: str, n: int, **feedback: Any) -> None:
    for i in range(n):
        extra = {k: (v(i) if callable(v) else v) for k, v in feedback.items()}
        make_log(conn, tenant_id=t["id"], route=r["name"], adapter_id=adapter,
                 experiment=r["name"], variant=variant, user_hash=user(f"{adapter}{variant}{i}"),
                 **extra)  # fmt: skip


def test_the_acceptance_rate_counts_edits_and_regenerations(conn):
    """Users who edit rather than rate: the thumbs-up rate sees nothing, the acceptance rate
    sees every answer that got any feedback."""
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    _arm(conn, t, r, "a", "A", 30, fb_edited=True, edited_completion="better")
    _arm(conn, t, r, "a", "A", 10, fb_regen=True)
    _arm(conn, t, r, "b", "B", 30, fb_explicit=1)
    _arm(conn, t, r, "b", "B", 10, fb_edited=True, edited_completion="better")
    rows = {
        x["metric"]: x
        for x in conn.execute(
            "SELECT * FROM obs.sequential_compare("
            " obs.sample_arm(%(t)s, 'a', now() - interval '1 hour', now() + interval '1 hour'),"
            " obs.sample_arm(%(t)s, 'b', now() - interval '1 hour', now() + interval '1 hour'))",
            {"t": t["id"]},
        )
    }
    acc = rows["acceptance_rate"]
    assert (acc["n_control"], acc["n_canary"]) == (40, 40)
    assert (acc["control_value"], acc["canary_value"]) == (0.0, 0.75)
    assert acc["higher_is_better"] and acc["significant"] and acc["canary_better"]
    assert rows["thumbs_up_rate"]["n_control"] == 0  # the edits and regenerations: no thumbs


def test_the_loop_decides_on_the_acceptance_rate_by_default(conn):
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    set_policy(conn, r)
    got = conn.execute(
        "SELECT (loop.decision_policy(%s, %s)).metric AS m", (t["id"], r["name"])
    ).fetchone()
    assert got["m"] == "acceptance_rate"


def test_the_ttft_guard_compares_two_adapters_never_an_adapter_with_the_base(conn):
    """Any LoRA costs the CPU engine ~18 % ttft p95 over the bare base: a useful first adapter
    is promoted over the base, and the guard still holds between two adapters."""
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    set_policy(conn, r, decision_min_n=20)
    base = r["base_model"]
    cand = make_adapter(conn, route=r, status="canary", traffic_pct=50)
    for i in range(60):  # both arms interleaved, as a live split gives them
        make_log(conn, tenant_id=t["id"], route=r["name"], adapter_id=base, experiment=r["name"],
                 variant="A", user_hash=user(f"a{i}"), fb_explicit=1 if i < 6 else -1,
                 ttft_ms=4000 + i)  # fmt: skip
        make_log(conn, tenant_id=t["id"], route=r["name"], adapter_id=cand["id"],
                 experiment=r["name"], variant="B", user_hash=user(f"b{i}"), fb_explicit=1,
                 ttft_ms=4720 + i)  # fmt: skip
    policy = "loop.decision_policy(%(t)s, %(r)s)"
    got = conn.execute(
        f"SELECT d.*, ({policy}).max_ttft_p95_increase AS ttft_margin"
        f" FROM serve.canary_decision(%(t)s, %(r)s, {policy}) d",
        {"t": t["id"], "r": r["name"]},
    ).fetchone()
    assert got["ttft_margin"] is None
    assert (got["decision"], got["code"]) == ("promote", "significantly_better"), got["reason"]
    # With a prod adapter as the control, both arms carry the LoRA's cost: the guard applies.
    make_adapter(conn, route=r, status="prod", traffic_pct=100)
    margin = conn.execute(
        f"SELECT ({policy}).max_ttft_p95_increase AS m", {"t": t["id"], "r": r["name"]}
    ).fetchone()
    assert margin["m"] == 0.1
