"""Experiment statistics in SQL agree with scipy.stats on the same rows."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy import stats

from tests.support.factories import make_adapter, make_route, make_tenant
from tests.support.traffic import make_traffic

EXP = "exp-ab"


def _setup(conn: Any, *, p_a: float, p_b: float, n: int = 4000) -> dict[str, Any]:
    tenant = make_tenant(conn)
    route = make_route(conn, tenant_id=tenant["id"], name="ab-route", experiment=EXP)
    prod = make_adapter(conn, route=route, id="ab-prod")
    canary = make_adapter(conn, route=route, id="ab-canary")
    make_traffic(
        conn,
        tenant_id=tenant["id"],
        route=route["name"],
        experiment=EXP,
        variant="A",
        adapter_id=prod["id"],
        n=n,
        p_up=p_a,
        seed=0.1,
        p_regen=0.10,
        ttft_ms=200,
    )
    make_traffic(
        conn,
        tenant_id=tenant["id"],
        route=route["name"],
        experiment=EXP,
        variant="B",
        adapter_id=canary["id"],
        n=n,
        p_up=p_b,
        seed=0.2,
        p_regen=0.13,
        ttft_ms=220,
    )
    return {"tenant": tenant, "route": route, "prod": prod, "canary": canary}


def _rows(conn: Any, adapter_id: str) -> dict[str, np.ndarray]:
    rows = conn.execute(
        "SELECT fb_explicit, fb_regen, fb_edited, ttft_ms FROM obs.inference_log"
        " WHERE experiment = %s AND adapter_id = %s",
        (EXP, adapter_id),
    ).fetchall()
    fb = np.array([r["fb_explicit"] for r in rows if r["fb_explicit"] is not None], dtype=float)
    return {
        "fb": fb,
        "regen": np.array([r["fb_regen"] for r in rows], dtype=float),
        "edit": np.array([r["fb_edited"] for r in rows], dtype=float),
        "ttft": np.array([r["ttft_ms"] for r in rows], dtype=float),
    }


def _compare(conn: Any, **kw: Any) -> dict[str, dict[str, Any]]:
    rows = conn.execute(
        "SELECT * FROM obs.experiment_compare(%s, now() - interval '30 days', now() + interval '1 minute')",
        (EXP,),
    ).fetchall()
    return {r["metric"]: r for r in rows}


def test_distribution_functions_match_scipy(conn: Any) -> None:
    worst = 0.0
    for t in (0.0, 0.3, 1.0, 1.96, 2.7, 5.0, 12.0):
        for df in (1.0, 2.0, 3.0, 4.5, 9.0, 29.7, 120.0, 2000.0, 54321.5):
            got = conn.execute("SELECT stats.t_pvalue(%s, %s) AS p", (t, df)).fetchone()["p"]
            worst = max(worst, abs(got - 2 * stats.t.sf(t, df)))
    assert worst < 1e-9
    for p in (0.6, 0.9, 0.975, 0.995):
        for df in (1.0, 2.0, 3.0, 7.3, 40.0, 5000.0):
            got = conn.execute("SELECT stats.t_ppf(%s, %s) AS q", (p, df)).fetchone()["q"]
            assert got == pytest.approx(stats.t.ppf(p, df), rel=1e-9)
    for p in (1e-9, 0.01, 0.3, 0.5, 0.8, 0.975, 0.999999):
        got = conn.execute("SELECT stats.norm_ppf(%s) AS q", (p,)).fetchone()["q"]
        assert got == pytest.approx(stats.norm.ppf(p), abs=1e-9)
    for z in (-4.0, -1.0, 0.0, 0.5, 3.0):
        got = conn.execute("SELECT stats.norm_cdf(%s) AS c", (z,)).fetchone()["c"]
        assert got == pytest.approx(stats.norm.cdf(z), abs=1e-12)
    got = conn.execute("SELECT stats.betainc(2.5, 3.5, 0.4) AS b").fetchone()["b"]
    assert got == pytest.approx(stats.beta.cdf(0.4, 2.5, 3.5), abs=1e-12)


def test_known_effect_agrees_with_scipy(conn: Any) -> None:
    s = _setup(conn, p_a=0.50, p_b=0.60)
    a, b = _rows(conn, s["prod"]["id"]), _rows(conn, s["canary"]["id"])
    cmp = _compare(conn)

    # Mean explicit feedback: Welch's t-test.
    fb = cmp["feedback_mean"]
    w = stats.ttest_ind(b["fb"], a["fb"], equal_var=False)
    ci = w.confidence_interval(0.95)
    assert fb["test"] == "welch_t"
    assert fb["n_control"] == len(a["fb"]) and fb["n_canary"] == len(b["fb"])
    assert fb["diff"] == pytest.approx(b["fb"].mean() - a["fb"].mean(), abs=1e-12)
    assert fb["statistic"] == pytest.approx(w.statistic, rel=1e-9)
    assert fb["df"] == pytest.approx(w.df, rel=1e-9)
    assert fb["p_value"] == pytest.approx(w.pvalue, rel=1e-6, abs=1e-12)
    assert fb["diff_ci_low"] == pytest.approx(ci.low, abs=1e-9)
    assert fb["diff_ci_high"] == pytest.approx(ci.high, abs=1e-9)
    # The true difference in mean feedback is 2 × 0.10 = 0.2: inside the interval, and significant.
    assert fb["diff_ci_low"] < 0.2 < fb["diff_ci_high"]
    assert fb["significant"] and fb["canary_better"]

    # Thumbs-up rate among rated rows: two-proportion z-test (pooled) = chi² without correction.
    tu = cmp["thumbs_up_rate"]
    x_a, n_a = int((a["fb"] == 1).sum()), len(a["fb"])
    x_b, n_b = int((b["fb"] == 1).sum()), len(b["fb"])
    chi2 = stats.chi2_contingency([[x_b, n_b - x_b], [x_a, n_a - x_a]], correction=False)
    assert tu["p_value"] == pytest.approx(chi2.pvalue, rel=1e-6, abs=1e-12)
    p1, p2 = x_a / n_a, x_b / n_b
    pooled = (x_a + x_b) / (n_a + n_b)
    z = (p2 - p1) / np.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    assert tu["statistic"] == pytest.approx(z, rel=1e-9)
    half = stats.norm.ppf(0.975) * np.sqrt(p1 * (1 - p1) / n_a + p2 * (1 - p2) / n_b)
    assert tu["diff_ci_low"] == pytest.approx(p2 - p1 - half, abs=1e-9)
    assert tu["diff_ci_high"] == pytest.approx(p2 - p1 + half, abs=1e-9)
    assert tu["diff_ci_low"] < 0.10 < tu["diff_ci_high"]

    # Regeneration rate (of all rows), lower is better: 10 % vs 13 %.
    rg = cmp["regen_rate"]
    xr = [
        [int(b["regen"].sum()), len(b["regen"]) - int(b["regen"].sum())],
        [int(a["regen"].sum()), len(a["regen"]) - int(a["regen"].sum())],
    ]
    assert rg["p_value"] == pytest.approx(
        stats.chi2_contingency(xr, correction=False).pvalue, rel=1e-6
    )
    assert rg["canary_better"] is False

    # Sample size for the thumbs-up rate at the observed control rate, mde 0.05.
    za, zb = stats.norm.ppf(0.975), stats.norm.ppf(0.8)
    q1, q2 = p1, p1 + 0.05
    n_req = (
        za * np.sqrt(2 * (q1 + q2) / 2 * (1 - (q1 + q2) / 2))
        + zb * np.sqrt(q1 * (1 - q1) + q2 * (1 - q2))
    ) ** 2 / 0.05**2
    assert tu["n_required_per_arm"] == int(np.ceil(n_req))
    n_mean = (za + zb) ** 2 * (a["fb"].var(ddof=1) + b["fb"].var(ddof=1)) / 0.1**2
    assert fb["n_required_per_arm"] == int(np.ceil(n_mean))
    assert fb["n_more_needed"] == max(0, int(np.ceil(n_mean)) - min(n_a, n_b))


def test_arms_agree_with_scipy(conn: Any) -> None:
    s = _setup(conn, p_a=0.5, p_b=0.6, n=1500)
    arms = {
        r["variant"]: r
        for r in conn.execute(
            "SELECT * FROM obs.experiment_arms(%s, now() - interval '30 days', now() + interval '1 minute')",
            (EXP,),
        ).fetchall()
    }
    assert set(arms) == {"A", "B"}
    for variant, adapter in (("A", s["prod"]["id"]), ("B", s["canary"]["id"])):
        arm, raw = arms[variant], _rows(conn, adapter)
        assert arm["adapter_id"] == adapter
        assert arm["n"] == len(raw["regen"])
        assert arm["n_feedback"] == len(raw["fb"])
        # The standard error divides by the rated rows, not by every row.
        assert arm["feedback_se"] == pytest.approx(stats.sem(raw["fb"]), rel=1e-9)
        lo, hi = stats.t.interval(
            0.95, len(raw["fb"]) - 1, loc=raw["fb"].mean(), scale=stats.sem(raw["fb"])
        )
        assert arm["feedback_ci_low"] == pytest.approx(lo, abs=1e-9)
        assert arm["feedback_ci_high"] == pytest.approx(hi, abs=1e-9)
        k = int((raw["fb"] == 1).sum())
        wil = stats.binomtest(k, len(raw["fb"])).proportion_ci(0.95, method="wilson")
        assert arm["thumbs_up_ci_low"] == pytest.approx(wil.low, abs=1e-9)
        assert arm["thumbs_up_ci_high"] == pytest.approx(wil.high, abs=1e-9)
        assert arm["regen_rate"] == pytest.approx(raw["regen"].mean())
        assert arm["edit_rate"] == pytest.approx(raw["edit"].mean())
        assert arm["ttft_p50"] == pytest.approx(np.percentile(raw["ttft"], 50))
        assert arm["ttft_p95"] == pytest.approx(np.percentile(raw["ttft"], 95))

    series = conn.execute(
        "SELECT * FROM obs.experiment_series(%s, now() - interval '30 days', now() + interval '1 minute', 'hour')",
        (EXP,),
    ).fetchall()
    assert sum(r["n"] for r in series if r["variant"] == "A") == arms["A"]["n"]
    assert len({r["bucket_at"] for r in series}) >= 48
    daily = conn.execute(
        "SELECT * FROM obs.experiment_series(%s, now() - interval '30 days', now() + interval '1 minute', 'day')",
        (EXP,),
    ).fetchall()
    assert sum(r["n"] for r in daily) == arms["A"]["n"] + arms["B"]["n"]


def test_no_effect_false_positive_rate_is_bounded(conn: Any) -> None:
    """100 A/A experiments: p-values roughly uniform, at most 12 % below α = 0.05."""
    tenant = make_tenant(conn)
    route = make_route(conn, tenant_id=tenant["id"])
    conn.execute("SELECT setseed(0.42)")
    conn.execute(
        """
        INSERT INTO obs.inference_log (request_id, tenant_id, route, adapter_id, experiment, variant,
                                       messages, fb_explicit, fb_regen)
        SELECT gen_random_uuid(), %(t)s, %(r)s, CASE WHEN i %% 2 = 0 THEN 'a' ELSE 'b' END,
               'aa-' || e, CASE WHEN i %% 2 = 0 THEN 'A' ELSE 'B' END, '[]'::jsonb,
               CASE WHEN random() < 0.55 THEN 1 ELSE -1 END, random() < 0.2
          FROM generate_series(0, 99) e, generate_series(1, 400) i
        """,
        {"t": tenant["id"], "r": route["name"]},
    )
    rows = conn.execute(
        "SELECT e, c.metric, c.p_value FROM generate_series(0, 99) e,"
        " obs.experiment_compare('aa-' || e, now() - interval '1 day', now() + interval '1 minute') c"
        " WHERE c.metric IN ('feedback_mean', 'regen_rate')"
    ).fetchall()
    for metric in ("feedback_mean", "regen_rate"):
        p = np.array([r["p_value"] for r in rows if r["metric"] == metric])
        assert len(p) == 100
        assert (p < 0.05).mean() <= 0.12
        assert stats.kstest(p, "uniform").pvalue > 0.001


def test_dashboard_role_reads_and_app_role_is_tenant_scoped(conn: Any) -> None:
    s = _setup(conn, p_a=0.5, p_b=0.5, n=200)
    other = make_tenant(conn)
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cft_dashboard")
        assert conn.execute("SELECT count(*) AS n FROM obs.experiment_arm_7d").fetchone()["n"] == 2
        assert conn.execute("SELECT count(*) AS n FROM obs.experiment").fetchone()["n"] == 1
        assert (
            conn.execute("SELECT count(*) AS n FROM obs.experiment_compare_7d").fetchone()["n"] == 6
        )
    # A third tenant names its experiment the same: the dashboard sees two experiments, each
    # with its own arms and comparisons, never one tenant's rows in the other's numbers.
    third = make_tenant(conn)
    route = make_route(conn, tenant_id=third["id"], experiment=EXP)
    for variant, adapter, p_up in (("A", "third-prod", 0.9), ("B", "third-canary", 0.1)):
        make_traffic(
            conn,
            tenant_id=third["id"],
            route=route["name"],
            experiment=EXP,
            variant=variant,
            adapter_id=adapter,
            n=50,
            p_up=p_up,
            seed=0.3,
        )
    with conn.transaction():
        conn.execute("SET LOCAL ROLE cft_dashboard")
        arms = conn.execute(
            "SELECT tenant_id, adapter_id, n FROM obs.experiment_arm_7d ORDER BY 1, 2"
        ).fetchall()
        assert [tuple(r.values()) for r in arms] == [
            (s["tenant"]["id"], "ab-canary", 200),
            (s["tenant"]["id"], "ab-prod", 200),
            (third["id"], "third-canary", 50),
            (third["id"], "third-prod", 50),
        ]
        cmp = conn.execute(
            "SELECT tenant_id, control_adapter, canary_adapter"
            " FROM obs.experiment_compare_7d WHERE metric = 'thumbs_up_rate' ORDER BY 1"
        ).fetchall()
        assert [tuple(r.values()) for r in cmp] == [
            (s["tenant"]["id"], "ab-prod", "ab-canary"),
            (third["id"], "third-prod", "third-canary"),
        ]
    for tenant_id, expected in ((s["tenant"]["id"], 1), (other["id"], 0)):
        with conn.transaction():
            conn.execute("SET LOCAL ROLE cft_app")
            conn.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(tenant_id),))
            assert (
                conn.execute("SELECT count(*) AS n FROM obs.experiment").fetchone()["n"] == expected
            )
            arms = conn.execute("SELECT * FROM obs.experiment_arms(%s)", (EXP,)).fetchall()
            assert len(arms) == 2 * expected


def test_grafana_dashboard_queries_run_as_dashboard_role(conn: Any) -> None:
    import json
    import re
    from pathlib import Path

    s = _setup(conn, p_a=0.5, p_b=0.6, n=300)
    # Another tenant's experiment of the same name: the panels show the chosen tenant's only.
    other = make_tenant(conn)
    route = make_route(conn, tenant_id=other["id"], experiment=EXP)
    make_traffic(
        conn,
        tenant_id=other["id"],
        route=route["name"],
        experiment=EXP,
        variant="A",
        adapter_id="other-prod",
        n=900,
        p_up=0.1,
    )
    dash = json.loads((Path(__file__).resolve().parents[2] / "deploy/grafana/cft.json").read_text())
    panels = {p["title"]: [t["rawSql"] for t in p["targets"]] for p in dash["panels"]}
    variables = {v["name"]: v["query"] for v in dash["templating"]["list"] if v["type"] == "query"}
    assert len(panels) >= 8 and set(variables) == {"tenant", "experiment"}
    subs = {
        "$__timeFrom()": "(now() - interval '30 days')",
        "$__timeTo()": "(now() + interval '1 minute')",
        "$tenant": str(s["tenant"]["id"]),  # the variable's value (__value: the id)
        "$experiment": EXP,
        "$bucket": "hour",
    }

    def run(sql: str) -> list[dict[str, Any]]:
        for k, v in subs.items():
            sql = sql.replace(k, v)
        sql = re.sub(r"\$__timeFilter\((\w+)\)", r"\1 > now() - interval '30 days'", sql)
        return conn.execute(sql).fetchall()  # type: ignore[no-any-return]

    with conn.transaction():
        conn.execute("SET LOCAL ROLE cft_dashboard")
        results = {title: [run(sql) for sql in sqls] for title, sqls in panels.items()}
        assert [r["experiment"] for r in run(variables["experiment"])] == [EXP]
        tenants = {(r["__text"], r["__value"]) for r in run(variables["tenant"])}
        assert {(s["tenant"]["name"], s["tenant"]["id"]), (other["name"], other["id"])} <= tenants
    [arms] = results["Arms (obs.experiment_arms)"]
    assert sorted((r["adapter_id"], r["n"]) for r in arms) == [("ab-canary", 300), ("ab-prod", 300)]
    [cmp] = results["Significance: canary vs prod (obs.experiment_compare)"]
    assert {r["prod"] for r in cmp} == {"ab-prod"}
