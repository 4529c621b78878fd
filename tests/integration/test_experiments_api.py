"""The experiments API and the dashboard over real HTTP, and the page in a real headless browser."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from psycopg.types.json import Jsonb

from app.core.auth import create_key
from app.main import create_app
from tests.support.dashboard import login
from tests.support.factories import make_adapter, make_route, make_tenant
from tests.support.servers import serve_app
from tests.support.traffic import make_traffic

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def world(conn: Any, db_url: str) -> Iterator[dict[str, Any]]:
    tenant = make_tenant(conn)
    other = make_tenant(conn)
    route = make_route(conn, tenant_id=tenant["id"], name="support-es", experiment="support-es-exp")
    prod = make_adapter(conn, route=route, id="support-es-v1", status="prod", traffic_pct=100)
    canary = make_adapter(conn, route=route, id="support-es-v2", status="canary", traffic_pct=20)
    for variant, adapter, p_up, seed in (("A", prod, 0.5, 0.3), ("B", canary, 0.6, 0.4)):
        make_traffic(
            conn,
            tenant_id=tenant["id"],
            route=route["name"],
            experiment="support-es-exp",
            variant=variant,
            adapter_id=adapter["id"],
            n=2000,
            p_up=p_up,
            seed=seed,
        )
    _loop_rows(conn, tenant["id"], route["name"], canary["id"])
    make_route(conn, tenant_id=tenant["id"], name="support-en")  # no loop policy row: defaults
    with serve_app(create_app(db_url=db_url)) as base:
        yield {
            "base": base,
            "reader": create_key(conn, tenant_id=tenant["id"], role="reader"),
            "ingest": create_key(conn, tenant_id=tenant["id"], role="ingest"),
            "other": create_key(conn, tenant_id=other["id"], role="reader"),
        }


def _loop_rows(conn: Any, tenant_id: int, route: str, canary: str) -> None:
    """The route's loop on, one finished cycle with its decision's numbers, one in flight."""
    conn.execute(
        "INSERT INTO loop.policy (route, tenant_id, enabled, min_new_examples, canary_pct)"
        " VALUES (%s, %s, true, 24, 20)",
        (route, tenant_id),
    )
    numbers = {"metric": {"control_value": 0.5, "canary_value": 0.61, "p_value": 0.0007,
                          "n_control": 1600, "n_canary": 400}, "canary_users": 400}  # fmt: skip
    conn.execute(
        "INSERT INTO loop.cycle (tenant_id, route, state, trigger, method, adapter_id, decision,"
        " decision_code, decision_reason, experiment, created_at, finished_at)"
        " VALUES (%s, %s, 'rejected', 'volume', 'sft', 'support-es-v0', 'retire', 'worse',"
        " 'canary significantly worse: thumbs_up_rate 0.52 -> 0.31', %s,"
        " now() - interval '3 hours', now() - interval '2 hours')",
        (tenant_id, route, Jsonb(numbers | {"metric": numbers["metric"] | {"p_value": 0.0123}})),
    )
    conn.execute(
        "INSERT INTO loop.cycle (tenant_id, route, state, trigger, method, adapter_id,"
        " canary_pct, experiment, waiting_for)"
        " VALUES (%s, %s, 'deciding', 'volume', 'dpo', %s, 20, %s,"
        " 'waiting for 500 rows per arm: thumbs_up_rate')",
        (tenant_id, route, canary, Jsonb(numbers)),
    )


def _get(w: dict[str, Any], path: str, key: str) -> httpx.Response:
    return httpx.get(w["base"] + path, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_list_and_metrics(world: dict[str, Any]) -> None:
    r = _get(world, "/v1/experiments", world["reader"])
    assert r.status_code == 200, r.text
    [exp] = r.json()["data"]
    assert exp["name"] == "support-es-exp" and exp["running"] and exp["n"] == 4000

    r = _get(world, "/v1/experiments/support-es-exp/metrics?window=7d", world["reader"])
    assert r.status_code == 200, r.text
    body = r.json()
    assert {a["variant"] for a in body["arms"]} == {"A", "B"}
    fb = next(c for c in body["comparisons"] if c["metric"] == "feedback_mean")
    assert fb["significant"] and fb["canary_better"] and fb["p_value"] < 0.05
    assert body["verdicts"][0]["verdict"] == "canary_better"

    # A one-hour window sees only part of the 48 hours of traffic.
    short = _get(world, "/v1/experiments/support-es-exp/metrics?window=1h", world["reader"]).json()
    assert sum(a["n"] for a in short["arms"]) < 4000


def test_errors_roles_and_tenants(world: dict[str, Any]) -> None:
    assert httpx.get(world["base"] + "/v1/experiments").status_code == 401
    assert _get(world, "/v1/experiments", world["ingest"]).status_code == 403
    assert _get(world, "/v1/experiments", world["other"]).json()["data"] == []
    r = _get(world, "/v1/experiments/support-es-exp/metrics", world["other"])
    assert r.status_code == 404 and r.json()["error"]["code"] == "experiment_not_found"
    r = _get(world, "/v1/experiments/support-es-exp/metrics?window=forever", world["reader"])
    assert r.status_code == 400 and r.json()["error"]["param"] == "window"


def test_dashboard_login(world: dict[str, Any]) -> None:
    base = world["base"]
    page = httpx.get(base + "/dashboard")
    assert page.status_code == 200 and 'name="key"' in page.text
    with httpx.Client(base_url=base) as client:
        assert login(client, "cft_nope").status_code == 401
        assert login(client, world["ingest"]).status_code == 403
        r = login(client, world["reader"])
        assert r.status_code == 303
        (cookie,) = [c.lower() for c in r.headers.get_list("set-cookie") if "session=" in c]
        assert "httponly" in cookie and "samesite=strict" in cookie
        home = client.get("/dashboard")
        assert "support-es-v2" in home.text and 'id="timeline"' in home.text
        assert 'id="loop-support-es"' in home.text and "min_new_examples" in home.text
        other = home.text.split('id="loop-support-en"')[1]
        assert "<b>enabled</b> False" in other and "no cycles yet" in other
        exp = client.get("/dashboard/experiments/support-es-exp")
        assert exp.status_code == 200
        assert exp.text.count('class="line"') >= 8 and "canary significantly better" in exp.text


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_dashboard_in_headless_chromium(world: dict[str, Any]) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(10_000)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(world["base"] + "/dashboard")
            page.fill("#key", world["reader"])
            page.click("button[type=submit]")
            page.wait_for_selector("#timeline")
            assert page.locator("#timeline rect").count() >= 2
            _check_loop_panel(page)
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
            page.click("a[href='/dashboard/experiments/support-es-exp']")
            page.wait_for_selector("#chart-thumbs")
            for chart in ("chart-thumbs", "chart-feedback", "chart-ttft", "chart-regen"):
                svg = page.locator(f"#{chart}")
                assert int(svg.get_attribute("data-points") or 0) > 40, chart
                box = svg.bounding_box()
                assert box is not None and box["width"] > 300 and box["height"] > 150
            assert page.locator("#chart-thumbs polygon.band").count() == 2
            assert "canary significantly better" in page.inner_text(".verdict")
            page.screenshot(path=str(ARTIFACTS / "experiment.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert (ARTIFACTS / "experiment.png").stat().st_size > 10_000


def _check_loop_panel(page: Any) -> None:
    """The loop panel shows the route's policy, every trigger's live value, the cycle in flight
    and the history with each decision and its numbers."""
    panel = page.locator("#loop-support-es")
    assert panel.is_visible()
    policy = panel.locator(".policy").inner_text()
    assert (
        "min_new_examples 24" in policy
        and "canary_pct 20" in policy
        and "min_interval 3600" in policy
    ), policy
    triggers = panel.locator("tr.trigger")
    assert triggers.count() == 5
    names = [triggers.nth(i).locator("td").first.inner_text() for i in range(5)]
    assert names == ["forget", "decline", "drift", "volume", "schedule"]
    # Live values from loop.triggers: the prod the decline trigger watches, the volume count
    # since the newest cycle against the policy's threshold.
    assert "support-es-v1" in triggers.nth(1).inner_text()
    volume = triggers.nth(3).inner_text()
    assert "no\t0\t24\twaiting: 0 of 24 usable" in volume, volume
    current = panel.locator(".current").inner_text()
    assert "deciding" in current and "waiting for 500 rows per arm" in current, current
    cycles = panel.locator("tr.cycle")
    assert cycles.count() == 2
    newest, oldest = cycles.nth(0).inner_text(), cycles.nth(1).inner_text()
    assert "deciding" in newest and "support-es-v2" in newest and "p_value = 0.0007" in newest
    assert "retire worse" in oldest and "canary significantly worse" in oldest
    assert "metric.p_value = 0.0123" in oldest and "metric.n_canary = 400" in oldest, oldest
