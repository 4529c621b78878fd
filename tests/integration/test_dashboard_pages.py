"""The dashboard's loop pages over real HTTP and in headless Chromium: training runs (a real TRL
run by the trainer worker, its loss curve), evals (candidate vs prod vs base, the gate's
blockers), snapshots (train.create_snapshot's counts, the example browser), logged calls
(filters, keyset pages, EXPLAIN) and adapter lineage; tenant isolation and escaping."""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from app.adapters import service as adapters
from app.core.artefacts import LocalStore
from app.core.auth import create_key
from app.core.config import Settings
from app.dashboard import calls
from app.datasets import service as datasets
from app.main import create_app
from tests.support import db as testdb
from tests.support.dashboard import login
from tests.support.factories import make_adapter, make_log, make_route, make_tenant
from tests.support.servers import serve_app
from tests.support.traffic import make_traffic
from tests.support.training import make_run, make_snapshot
from workers.trainer.train import progress_callback
from workers.trainer.worker import WorkerConfig, _Heartbeat

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ROUTE = "support-es"
STEPS = 40  # optimizer steps of the finished run (the other one is at step 12 of them)
WORKER = "dashboard-test-worker"
BASE_REVISION = "gguf-sha256:" + "1" * 16
XSS = "<script>alert('pwned')</script>"
SFT_ROWS = 26  # distinct edited prompts; 4 of them logged twice (exact duplicates)


def _user(text: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a support bot."},
        {"role": "user", "content": text},
    ]


@pytest.fixture(scope="module")
def world(
    pg_server: str, template_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    url = testdb.clone(pg_server)
    tmp = tmp_path_factory.mktemp("dashboard")
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as c:
        w = _seed(c, url, tmp)
        with serve_app(create_app(Settings(home=tmp), db_url=url, engine_urls=[])) as base:
            yield w | {"base": base, "conn": c}
    testdb.drop(pg_server, url)


def _loss(step: int) -> float:
    return round(2.4 * math.exp(-step / 12) + 0.55 + 0.04 * math.sin(step), 4)


def _train(
    c: Any,
    url: str,
    store: LocalStore,
    snap: dict[str, Any],
    *,
    steps: int,
    total: int,
    adapter_id: str | None = None,
) -> dict[str, Any]:
    """A training run through the queue's SQL as the trainer worker drives it: claimed, its
    progress reported step by step by the trainer's own callback and written by the worker's
    heartbeat (train.heartbeat_training_run), and, given an adapter_id, finished with its
    candidate registered. The optimizer steps are not run (a real TRL run of the bundled model
    takes ~45 s of CPU; tests/integration/test_training_methods.py trains each method)."""
    queued = make_run(c, snapshot=snap, params={"max_steps": total})
    claimed = c.execute(
        "SELECT * FROM train.claim_training_run(%s, '60 seconds')", (WORKER,)
    ).fetchone()
    assert claimed is not None and claimed["id"] == queued["id"]
    cfg = WorkerConfig(db_url=url, models_dir=Path(), store=store, worker_id=WORKER)
    hb = _Heartbeat(cfg, queued["id"])
    callback = progress_callback(hb.update)
    control = SimpleNamespace(should_training_stop=False)
    for step in range(1, steps + 1):
        state = SimpleNamespace(global_step=step, max_steps=total, num_input_tokens_seen=256 * step)
        callback.on_log(None, state, control, logs={"loss": _loss(step)})
    hb.beat(c)
    if adapter_id is not None:
        with c.transaction():
            adapters.register_candidate(
                c, adapter_id=adapter_id, tenant_id=snap["tenant_id"], route=snap["route"],
                base_model=queued["base_model"], base_revision=BASE_REVISION, rank=8, alpha=16,
                target_modules=["q_proj", "v_proj"], method="sft", training_run_id=queued["id"],
                dataset_snapshot_id=snap["id"], weights_uri=f"file:///nonexistent/{adapter_id}",
                sha256="0" * 64, size_bytes=1, eval_summary={},
            )  # fmt: skip
            metrics = {"train_loss": _loss(steps), "steps": steps, "train_seconds": 41.5}
            done = c.execute(
                "SELECT train.finish_training_run(%s, %s, %s, %s) AS ok",
                (
                    queued["id"],
                    WORKER,
                    adapter_id,
                    Jsonb((hb.progress or {}) | {"metrics": metrics}),
                ),
            ).fetchone()
            assert done["ok"]
    return c.execute("SELECT * FROM train.training_run WHERE id = %s", (queued["id"],)).fetchone()  # type: ignore[no-any-return]


def _seed(c: Any, url: str, tmp: Path) -> dict[str, Any]:
    a, b = make_tenant(c), make_tenant(c)
    route = make_route(c, tenant_id=a["id"], name=ROUTE, experiment="support-es-exp")
    prod = {"id": "support-es-v1"}  # registered below, on the trained candidate's base revision
    c.execute("SELECT obs.create_partitions(1, now() - interval '5 weeks')")
    # Edited answers: the SFT snapshot's source rows (four prompts twice: exact duplicates).
    for i in range(SFT_ROWS + 4):
        make_log(c, tenant_id=a["id"], route=ROUTE, adapter_id=prod["id"], variant="A",
                 experiment="support-es-exp", messages=_user(f"How do I reset password {i % SFT_ROWS}?"),
                 completion="Try again later.", fb_edited=True, fb_explicit=-1 if i % 3 else None,
                 edited_completion=f"Open Settings, then Security, then reset ({i % SFT_ROWS}).",
                 created_at=datetime.now(UTC) - timedelta(minutes=5 + i))  # fmt: skip
    xss = make_log(c, tenant_id=a["id"], route=ROUTE, adapter_id=prod["id"], variant="B",
                   messages=_user(XSS), completion=f"answer {XSS}", fb_regen=True)  # fmt: skip
    snap = datasets.create_snapshot(c, tenant_id=a["id"], route=ROUTE, method="sft",
                                    dedup_threshold=0, eval_pct=0).model_dump()  # fmt: skip
    # After the snapshot (its thumbs-up answers would be SFT examples too). A few thousand calls, most in the last two days: the calls browser's window and EXPLAIN.
    for n, hours, seed in ((3000, 48, 0.1), (1000, 720, 0.2)):
        make_traffic(c, tenant_id=a["id"], route=ROUTE, experiment="support-es-exp", variant="A",
                     adapter_id=prod["id"], n=n, p_up=0.6, p_regen=0, p_edit=0, hours=hours,
                     seed=seed)  # fmt: skip
    store = LocalStore(tmp / "store")
    run = _train(c, url, store, snap, steps=STEPS, total=STEPS, adapter_id=f"{ROUTE}-run1")
    running = _train(c, url, store, snap, steps=12, total=STEPS)
    cand = run["adapter_id"]
    make_adapter(c, route=route, id=prod["id"], status="prod", traffic_pct=100,
                 base_revision=BASE_REVISION)  # fmt: skip
    _evals(c, cand, prod["id"], str(snap["id"]))
    _loop_history(c, a["id"], cand, prod["id"], run, snap)
    queued = make_run(c, snapshot=snap)  # waits in the queue
    # Tenant B has a run, a snapshot and an adapter of its own.
    rb = make_route(c, tenant_id=b["id"], name="b-route")
    make_adapter(c, route=rb, id="b-secret-adapter")
    sb = make_snapshot(c, tenant_id=b["id"], route="b-route", method="sft")
    return {
        "tenant": a, "route": route, "prod": prod["id"], "candidate": cand, "snapshot": snap,
        "run": run, "running": running, "queued": queued, "xss": xss, "b_snapshot": sb, "b_run": make_run(c, snapshot=sb),
        "reader": create_key(c, tenant_id=a["id"], role="reader"),
        "b_reader": create_key(c, tenant_id=b["id"], role="reader"),
    }  # fmt: skip


# (suite, metric): (base, prod, candidate). safety regresses beyond the default 2 % tolerance.
# (suite, metric): (base, prod, candidate), in the page's order. "heldout" is the candidate's own
# snapshot's split (the default global rule: loss, lower is better, required); safety regresses
# beyond the default rule's 2 % tolerance.
SCORES = {
    ("heldout", "loss"): (1.9, 1.2, 1.1),
    ("house-style", "pass_rate"): (0.5, 0.8, 0.9),
    ("safety", "pass_rate"): (0.9, 0.95, 0.7),
}


def _suite(name: str, snap: str) -> str:
    return f"heldout:{snap}" if name == "heldout" else name


def _evals(c: Any, cand: str, prod: str, snap: str) -> None:
    """The evaluator's writes: results of candidate and prod, the base's in eval_summary."""
    base: dict[str, dict[str, float]] = {}
    for (name, metric), (b, p, k) in SCORES.items():
        suite = _suite(name, snap)
        for adapter, score in ((prod, p), (cand, k)):
            c.execute(
                "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score) VALUES (%s, %s, %s, %s)",
                (adapter, suite, metric, score),
            )
        base[suite] = {metric: b, "n": 20}
    c.execute(
        "UPDATE serve.adapter SET eval_summary = coalesce(eval_summary, '{}') || %s WHERE id = %s",
        (Jsonb({"results": {"base": base}, "against": prod}), cand),
    )


def _loop_history(
    c: Any, tenant_id: int, cand: str, prod: str, run: dict[str, Any], snap: dict[str, Any]
) -> None:
    """The loop cycle that made the candidate, and the experiments worker's decision on it."""
    numbers = {"metric": {"control_value": 0.61, "canary_value": 0.42, "p_value": 0.004}}
    c.execute(
        "INSERT INTO loop.cycle (tenant_id, route, state, trigger, trigger_values, method,"
        " method_reason, snapshot_id, training_run_id, adapter_id, canary_pct, experiment,"
        " decision, decision_code, decision_reason, current_prod_id, blockers, settings_tried)"
        " VALUES (%s, %s, 'rejected', 'volume', %s, 'sft', 'edits: 26 usable', %s, %s, %s, 20, %s,"
        " 'retire', 'worse', 'canary significantly worse: thumbs_up_rate 0.61 -> 0.42', %s, %s,"
        " %s)",
        (tenant_id, ROUTE, Jsonb({"new_examples": 26, "threshold": 24}), snap["id"], run["id"],
         cand, Jsonb(numbers), prod, Jsonb([]), Jsonb(TRIED)),
    )  # fmt: skip
    c.execute(
        "INSERT INTO serve.experiment_decision (route, tenant_id, experiment, canary_id,"
        " control_id, action, code, metric, reason, numbers) VALUES (%s, %s, 'support-es-exp',"
        " %s, %s, 'rollback', 'worse', 'thumbs_up_rate', 'canary significantly worse', %s)",
        (ROUTE, tenant_id, cand, prod, Jsonb(numbers)),
    )


@contextmanager
def _client(w: dict[str, Any], key: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=w["base"], timeout=30) as client:
        assert login(client, key).status_code == 303
        yield client


TRIED = [
    {"hyperparameters": {"learning_rate": 0.0123, "max_steps": 9}, "adapter_id": "first",
     "kept": False, "offline": {"against": "the base model", "best": {
         "suite": "heldout", "metric": "answer_similarity", "reference": 0.1, "candidate": 0.12}}},
    {"hyperparameters": {"learning_rate": 0.005, "max_steps": 14}, "adapter_id": "second",
     "kept": True, "offline": {"against": "the base model", "best": {
         "suite": "heldout", "metric": "answer_similarity", "reference": 0.1, "candidate": 0.42}}},
]  # fmt: skip


def test_every_page_renders_the_seeded_rows(world: dict[str, Any]) -> None:
    w = world
    with _client(w, w["reader"]) as http:
        runs = http.get("/dashboard/runs").text
        assert str(w["run"]["id"])[:8] in runs and 'http-equiv="refresh"' in runs  # two live
        run = http.get(f"/dashboard/runs/{w['run']['id']}").text
        assert f'data-points="{STEPS}"' in run and 'http-equiv="refresh"' not in run
        running = http.get(f"/dashboard/runs/{w['running']['id']}").text
        assert 'data-points="12"' in running and 'http-equiv="refresh"' in running
        assert f'step <b id="step">12</b> of <b>{STEPS}</b>' in running
        queued = http.get(f"/dashboard/runs/{w['queued']['id']}").text
        assert 'http-equiv="refresh"' in queued and "no progress reported yet" in queued
        evals = http.get(f"/dashboard/evals/{w['candidate']}").text
        assert "the gate refuses" in evals and "regression" in evals
        snap = http.get(f"/dashboard/snapshots/{w['snapshot']['id']}").text
        assert 'data-step="exact_dedup"' in snap and "−4" in snap  # the duplicates dropped
        lineage = http.get(f"/dashboard/lineage/{w['candidate']}").text
        assert f"{SFT_ROWS} examples from {SFT_ROWS} logged calls" in lineage
        assert "canary significantly worse" in lineage
        # Every setting the cycle tried, with its held-out numbers.
        assert 'class="settings-tried"' in lineage and "0.0123" in lineage
        assert "heldout/answer_similarity 0.100 → 0.420" in lineage
        # What each adapter served, from the log (obs.adapter_serving_7d), and LoRA vs base.
        overview = http.get("/dashboard").text
        serving = overview[overview.index('id="serving"') : overview.index("<h2>Experiments")]
        assert "support-es-v1" in serving and "LoRA adapters" in serving
        # Bad input: a clear 400, not a 500.
        bad = http.get("/dashboard/calls", params={"before": "yesterday"})
        assert bad.status_code == 400 and "cursor" in bad.text
        assert http.get("/dashboard/calls", params={"window": "forever"}).status_code == 400


def test_another_tenants_ids_are_404_without_its_data(world: dict[str, Any]) -> None:
    w = world
    # What A's pages show and B must never see (the 404 page may echo the id B sent).
    secrets = ["Settings, then Security", "house-style", w["snapshot"]["set_hash"][:16], w["prod"]]
    with _client(w, w["b_reader"]) as http:
        for path in (
            f"/dashboard/runs/{w['run']['id']}",
            f"/dashboard/snapshots/{w['snapshot']['id']}",
            f"/dashboard/evals/{w['candidate']}",
            f"/dashboard/lineage/{w['candidate']}",
            "/dashboard/runs/not-a-uuid",
            "/dashboard/snapshots/not-a-uuid",
        ):
            r = http.get(path)
            assert r.status_code == 404, (path, r.status_code)
            leaked = [m for m in secrets if m in r.text]
            assert leaked == [], (path, leaked)
        # B's lists show B's rows only.
        for path in ("/dashboard/runs", "/dashboard/snapshots", "/dashboard/evals",
                     "/dashboard/lineage", "/dashboard/calls?window=90d"):  # fmt: skip
            r = http.get(path)
            assert r.status_code == 200 and ROUTE not in r.text and w["candidate"] not in r.text, (
                path
            )
        assert str(w["b_snapshot"]["id"])[:8] in http.get("/dashboard/snapshots").text
    with _client(w, w["reader"]) as http:  # and A does not see B's
        assert http.get(f"/dashboard/snapshots/{w['b_snapshot']['id']}").status_code == 404
        assert http.get(f"/dashboard/runs/{w['b_run']['id']}").status_code == 404
        assert "b-secret-adapter" not in http.get("/dashboard/lineage").text


def test_a_logged_script_is_shown_as_text(world: dict[str, Any]) -> None:
    with _client(world, world["reader"]) as http:
        html = http.get("/dashboard/calls", params={"feedback": "regenerated", "variant": "B"}).text
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;" in html
    assert html.count('class="call"') == 1  # the filters leave only that row


def test_calls_pages_read_only_the_window_through_indexes(world: dict[str, Any]) -> None:
    c = world["conn"]
    c.execute("ANALYZE obs.inference_log")
    tenant = world["tenant"]["id"]
    parts = c.execute(
        "SELECT count(*) AS n FROM pg_inherits WHERE inhparent = 'obs.inference_log'::regclass"
    ).fetchone()["n"]
    now = datetime.now(UTC)
    since, until = now - timedelta(hours=24), now + calls.SKEW
    for filters in (
        {},
        {"route": ROUTE},
        {"adapter": world["prod"]},
        {"route": ROUTE, "feedback": "up"},
    ):
        sql, args = calls.page_query(tenant_id=tenant, since=since, until=until, **filters)
        plan = "\n".join(r["QUERY PLAN"] for r in c.execute("EXPLAIN " + sql, args))
        scanned = set(re.findall(r"on (inference_log_\w+)", plan))
        # The window's partition (and DEFAULT, for rows outside every range) only.
        assert 1 <= len(scanned) <= 3 < parts, (filters, plan)
        if filters.get("route") or filters.get("adapter"):
            assert "Seq Scan" not in plan and "Index" in plan, (filters, plan)
    # Keyset: the second page starts strictly after the first page's last row, newest first.
    sql, args = calls.page_query(
        tenant_id=tenant, since=since - timedelta(days=29), until=until, route=ROUTE
    )
    first = c.execute(sql, args).fetchall()
    last = first[calls.PAGE_SIZE - 1]
    sql, args = calls.page_query(tenant_id=tenant, since=since - timedelta(days=29), until=until, route=ROUTE,
                                 before=(last["created_at"], last["id"]))  # fmt: skip
    second = c.execute(sql, args).fetchall()
    assert second[0]["created_at"] <= last["created_at"] and second[0]["id"] != last["id"]
    keys = [(r["created_at"], r["id"]) for r in first[: calls.PAGE_SIZE] + second]
    assert keys == sorted(keys, reverse=True) and len(set(keys)) == len(keys)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_pages_in_headless_chromium(world: dict[str, Any]) -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    w = world
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
            page.goto(w["base"] + "/dashboard")
            page.fill("#key", w["reader"])
            page.click("button[type=submit]")
            page.wait_for_selector("#timeline")
            _shot(page, "dashboard")
            _runs(page, w)
            _evals_page(page, w)
            _snapshot(page, w)
            _calls(page, w)
            _lineage(page, w)
        finally:
            browser.close()
    assert errors == []


def _shot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)
    # The docs' screenshots are these, copied by hand (docs/dashboard.md says how).
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}-top.png"))


def _runs(page: Any, w: dict[str, Any]) -> None:
    page.click("header nav a[href='/dashboard/runs']")
    rows = page.locator("tr.run")
    assert rows.count() == 3
    states = [rows.nth(i).locator("td").nth(1).inner_text() for i in range(3)]
    assert states == ["queued", "running", "succeeded"], states
    page.click(f"a[href='/dashboard/runs/{w['run']['id']}']")
    chart = page.locator("#chart-loss")
    assert chart.get_attribute("data-points") == str(STEPS)
    box = chart.bounding_box()
    assert box is not None and box["width"] > 600
    progress = page.inner_text(".progress")
    assert f"step {STEPS} of {STEPS}" in progress and "100 %" in progress, progress
    history = w["run"]["progress"]["loss_history"]
    assert [s for s, _ in history] == list(range(1, STEPS + 1))
    assert f"{history[-1][1]:.4f}" in progress  # the latest loss, as the trainer wrote it
    assert "train_loss" in page.inner_text("#metrics")
    _shot(page, "run")


def _evals_page(page: Any, w: dict[str, Any]) -> None:
    page.click("header nav a[href='/dashboard/evals']")
    listed = page.locator("tr.adapter", has_text=w["candidate"])
    assert "blocked: 1" in listed.inner_text()
    listed.locator("a").click()
    rows = page.locator("#evals tr.metric")
    assert rows.count() == len(SCORES)
    for i, ((name, _), (base, prod, cand)) in enumerate(SCORES.items()):
        cells = rows.nth(i).locator("td").all_inner_texts()
        assert cells[0] == _suite(name, str(w["snapshot"]["id"])), cells
        assert cells[3] == f"{base:.4f}", cells
        assert cells[4].startswith(f"{prod:.4f}") and cells[5].startswith(f"{cand:.4f}"), cells
    rules = [rows.nth(i).locator("td").nth(2).inner_text() for i in range(len(SCORES))]
    assert rules[0] == "lower is better, 2 %, required" and rules[1].startswith("default"), rules
    verdicts = [rows.nth(i).locator("td").last.inner_text() for i in range(len(SCORES))]
    assert verdicts[:2] == ["ok", "ok"] and "regression: 0.7 < 0.931" in verdicts[2], verdicts
    assert "the gate refuses: 1 blocker" in page.inner_text(".gate")
    _shot(page, "evals")


def _snapshot(page: Any, w: dict[str, Any]) -> None:
    page.click("header nav a[href='/dashboard/snapshots']")
    page.click(f"a[href='/dashboard/snapshots/{w['snapshot']['id']}']")
    counts = w["snapshot"]["counts"]
    steps = page.locator("#funnel tr.step")
    got = {steps.nth(i).get_attribute("data-step"): steps.nth(i).locator("td").nth(2).inner_text()
           for i in range(steps.count())}  # fmt: skip
    assert got["view_rows"] == str(SFT_ROWS + 4) and got["exact_dedup"] == str(SFT_ROWS), got
    assert got == {k: str(v) for k, v in counts.items() if k in got and k != "examples"} | {
        "examples": str(SFT_ROWS)
    }
    first = page.locator("#examples tr.example")
    assert first.count() == 20
    assert "Open Settings, then Security" in first.first.inner_text()
    hashes = first.locator("code").all_inner_texts()
    page.click("text=next ›")
    second = page.locator("#examples tr.example")
    assert second.count() == SFT_ROWS - 20
    more = second.locator("code").all_inner_texts()
    assert not set(hashes) & set(more) and hashes + more == sorted(hashes + more)
    page.click("text=‹ previous")
    assert page.locator("#examples tr.example code").all_inner_texts() == hashes
    _shot(page, "snapshot")


def _calls(page: Any, w: dict[str, Any]) -> None:
    page.click("header nav a[href='/dashboard/calls']")
    rows = page.locator("#calls tr.call")
    assert rows.count() == calls.PAGE_SIZE
    assert XSS in rows.first.locator(".prompt").inner_text()  # newest first, shown as text
    page.select_option("select[name=feedback]", "edited")
    page.click("form.filters button")
    rows = page.locator("#calls tr.call")
    assert rows.count() == SFT_ROWS + 4
    assert all("edited" in t for t in rows.locator("td:nth-child(7)").all_inner_texts())
    page.select_option("select[name=feedback]", "")
    page.select_option("select[name=window]", "30d")
    page.click("form.filters button")
    page.click("text=older ›")
    assert page.locator("#calls tr.call").count() == calls.PAGE_SIZE
    _shot(page, "calls")


def _lineage(page: Any, w: dict[str, Any]) -> None:
    page.click("header nav a[href='/dashboard/lineage']")
    page.click(f"a[href='/dashboard/lineage/{w['candidate']}']")
    order = [s.get_attribute("data-step") for s in page.locator(".lineage-step").all()]
    assert order == ["sources", "snapshot", "run", "evals", "experiment", "decisions"]
    text = page.inner_text("main")
    assert f"{SFT_ROWS} examples from {SFT_ROWS} logged calls" in text
    assert str(w["snapshot"]["id"]) in text and "volume" in text and "rollback worse" in text
    assert f"over {STEPS} logged steps" in text
    _shot(page, "lineage")


def test_the_lineage_page_shows_markup_in_its_data_as_text(world: dict[str, Any]) -> None:
    """Every free-text field the lineage page shows (eval suites, judges, the loop's reasons and
    trigger values, the experiments worker's decisions, audit reasons) carries a script; ids and
    route names cannot (their CHECK allows letters, digits and _.:- only)."""
    c = world["conn"]
    t = make_tenant(c)
    route = make_route(c, tenant_id=t["id"], name="xss-route", experiment=XSS)
    adapter = make_adapter(c, route=route, id="xss-route-v1", status="candidate")
    c.execute(
        "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score, judge_model)"
        " VALUES (%s, %s, %s, 0.5, %s)",
        (adapter["id"], XSS, XSS, XSS),
    )
    c.execute(
        "INSERT INTO loop.cycle (tenant_id, route, state, trigger, trigger_values, method,"
        " method_reason, adapter_id, decision, decision_code, decision_reason)"
        " VALUES (%s, %s, 'rejected', 'volume', %s, 'sft', %s, %s, 'retire', %s, %s)",
        (t["id"], route["name"], Jsonb({"note": XSS}), XSS, adapter["id"], XSS, XSS),
    )
    c.execute(
        "INSERT INTO serve.experiment_decision (route, tenant_id, experiment, canary_id,"
        " action, code, metric, reason) VALUES (%s, %s, %s, %s, 'rollback', %s, %s, %s)",
        (route["name"], t["id"], XSS, adapter["id"], XSS, XSS, XSS),
    )
    c.execute("UPDATE serve.adapter SET status = 'retired' WHERE id = %s", (adapter["id"],))
    c.execute(
        "UPDATE serve.adapter_event SET reason = %s WHERE adapter_id = %s", (XSS, adapter["id"])
    )
    reader = create_key(c, tenant_id=t["id"], role="reader")
    with _client(world, reader) as http:
        html = http.get(f"/dashboard/lineage/{adapter['id']}").text
    assert "<script>" not in html, html
    escaped = "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;"
    # suite/metric, judge, method reason, loop decision code and reason, decision experiment,
    # code, metric and reason, the audit reason; the trigger values as (escaped) JSON.
    assert html.count(escaped) >= 10, html
    assert "&#34;note&#34;: &#34;&lt;script&gt;" in html
