"""The evaluator: real scores for small adapters on a real snapshot and suite, into the gate."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from app.core.artefacts import get_store
from app.core.config import Settings
from tests.support.factories import make_adapter, make_route, make_tenant
from tests.support.lora import make_adapter_dir
from tests.support.training import make_snapshot
from workers import base_model
from workers.evaluator.worker import EVALUATOR, BaseScores, EvalConfig, Evaluator

QV = ("q_proj", "v_proj")


def _heldout(start: int, n: int) -> list[dict[str, Any]]:
    """n SFT examples unlike the training ones."""
    return [
        {
            "messages": [
                {"role": "user", "content": f"What is {i} plus {i}?"},
                {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."},
            ]
        }
        for i in range(start, start + n)
    ]


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def weights(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("weights")
    return {
        "good": make_adapter_dir(models_dir, tmp / "good", seed=None, rank=4, target_modules=QV),
        "bad": make_adapter_dir(models_dir, tmp / "bad", seed=7, rank=4, target_modules=QV),
    }


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(home=ROOT / ".cft", artefact_dir=tmp_path_factory.mktemp("artefacts"))


@pytest.fixture(scope="module")
def evaluator(models_dir: Path, settings: Settings) -> Evaluator:
    # One evaluator (one base model load) for the module; db_url is set per test.
    return Evaluator(EvalConfig(db_url="", models_dir=models_dir, settings=settings))


def _register(
    conn: Any, settings: Settings, route: dict[str, Any], path: Path, **over: Any
) -> dict[str, Any]:
    version = f"v{uuid.uuid4().hex[:8]}"
    stored = get_store(settings).put_dir(path, route["name"], version)
    return make_adapter(
        conn,
        route=route,
        id=f"{route['name']}-{version}",
        weights_uri=stored.uri,
        sha256=stored.sha256,
        size_bytes=stored.size_bytes,
        **over,
    )


@pytest.fixture
def world(conn: Any, settings: Settings, weights: dict[str, Path]) -> dict[str, Any]:
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])
    snap = make_snapshot(
        conn, tenant_id=t["id"], route=r["name"], method="sft", eval=_heldout(10, 3)
    )
    conn.execute(
        "INSERT INTO train.eval_suite (id, tenant_id, route, name) VALUES (%s, %s, %s, 'short')",
        (f"short-{r['name']}", t["id"], r["name"]),
    )
    conn.execute(
        "INSERT INTO train.eval_case (tenant_id, suite_id, messages, check_kind, expected,"
        ' max_tokens) VALUES (%s, %s, \'[{"role": "user", "content": "Say hi."}]\','
        " 'max_length', '200', 4)",
        (t["id"], f"short-{r['name']}"),
    )
    conn.execute(
        "INSERT INTO train.promotion_policy (tenant_id, route, suite_id, metric, direction)"
        " VALUES (%s, %s, %s, 'pass_rate', 'higher')",
        (t["id"], r["name"], f"short-{r['name']}"),
    )
    return {"tenant": t, "route": r, "snap": snap, "suite": f"short-{r['name']}"}


def _scores(conn: Any, adapter_id: str) -> dict[tuple[str, str], float]:
    rows = conn.execute(
        "SELECT suite_id, metric, score, judge_model, author_kind, author_role, author"
        " FROM train.eval_result WHERE adapter_id = %s",
        (adapter_id,),
    ).fetchall()
    # Computed, not judged: no judge_model; written by the evaluator, which the database knows.
    assert all(r["judge_model"] is None for r in rows)
    assert all(
        (r["author_kind"], r["author_role"]) == ("evaluator", "evaluator")
        and r["author"].startswith(f"evaluator {EVALUATOR} ")
        for r in rows
    ), rows
    return {(r["suite_id"], r["metric"]): float(r["score"]) for r in rows}


def _run(evaluator: Evaluator, db_url: str) -> int:
    evaluator.cfg.db_url = db_url
    return evaluator.run_once()


def test_scores_flow_into_the_gate(
    conn: Any,
    db_url: str,
    settings: Settings,
    weights: dict[str, Path],
    world: dict[str, Any],
    evaluator: Evaluator,
) -> None:
    route, snap = world["route"], world["snap"]
    prod = _register(conn, settings, route, weights["bad"], status="prod", traffic_pct=100)
    good = _register(conn, settings, route, weights["good"], dataset_snapshot_id=snap["id"])
    assert _run(evaluator, db_url) == 1

    heldout = f"heldout:{snap['id']}"
    cand = _scores(conn, good["id"])
    cur = _scores(conn, prod["id"])
    # Real numbers: the zero adapter is the base; the random one is much worse on the same split.
    assert 0 < cand[(heldout, "loss")] < cur[(heldout, "loss")]
    assert math.isclose(
        cand[(heldout, "perplexity")], math.exp(cand[(heldout, "loss")]), rel_tol=1e-6
    )
    assert cand[(world["suite"], "pass_rate")] == 1.0
    assert (world["suite"], "pass_rate") in cur
    summary = conn.execute(
        "SELECT eval_summary FROM serve.adapter WHERE id = %s", (good["id"],)
    ).fetchone()["eval_summary"]
    assert summary["mode"] == "in-process" and summary["against"] == prod["id"]
    base_loss = summary["results"]["base"][heldout]["loss"]
    assert math.isclose(base_loss, cand[(heldout, "loss")], rel_tol=1e-3)
    assert conn.execute(
        "SELECT serve.can_promote(%s, %s) AS ok", (good["id"], prod["id"])
    ).fetchone()["ok"]

    # A worse candidate on a newer snapshot: prod is scored on that split too, and it is refused.
    snap2 = make_snapshot(
        conn,
        tenant_id=world["tenant"]["id"],
        route=route["name"],
        method="sft",
        eval=_heldout(20, 2),
    )
    conn.execute(
        "UPDATE serve.adapter SET status = 'prod', traffic_pct = 100 WHERE id = %s", (good["id"],)
    )
    bad = _register(conn, settings, route, weights["bad"], dataset_snapshot_id=snap2["id"])
    assert _run(evaluator, db_url) == 1
    assert (f"heldout:{snap2['id']}", "loss") in _scores(conn, good["id"])
    reasons = conn.execute(
        "SELECT * FROM serve.promotion_blockers(%s, %s)", (bad["id"], good["id"])
    ).fetchall()
    # loss (required) and perplexity (its own rule since 20261202) regress on the new split.
    assert {(r["suite_id"], r["metric"]) for r in reasons} == {
        (f"heldout:{snap2['id']}", "loss"),
        (f"heldout:{snap2['id']}", "perplexity"),
    }, reasons
    assert all("regression" in r["reason"] for r in reasons)
    assert all(r["candidate_author"].startswith("evaluator ") for r in reasons)
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "UPDATE serve.adapter SET status = 'prod', traffic_pct = 100 WHERE id = %s",
            (bad["id"],),
        )


def test_requests_and_cli_once(
    conn: Any, db_url: str, settings: Settings, weights: dict[str, Path], world: dict[str, Any]
) -> None:
    cand = _register(
        conn, settings, world["route"], weights["good"], dataset_snapshot_id=world["snap"]["id"]
    )
    listener = psycopg.connect(db_url, autocommit=True)
    listener.execute("LISTEN cft_eval")
    conn.execute(
        "INSERT INTO train.eval_request (tenant_id, adapter_id, requested_by) VALUES (%s, %s, 'test')",
        (world["tenant"]["id"], cand["id"]),
    )
    assert [n.payload for n in listener.notifies(timeout=2, stop_after=1)] == [cand["id"]]
    listener.close()
    env = os.environ | {
        "CFT_DATABASE_URL": db_url,
        "CFT_HOME": str(ROOT / ".cft"),
        "CFT_ARTEFACT_DIR": str(settings.artefact_path),
        "CFT_ENGINE_URLS": "",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "cft.cli", "worker", "eval", "--once"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "in-process" in proc.stderr
    req = conn.execute(
        "SELECT status, error FROM train.eval_request WHERE adapter_id = %s", (cand["id"],)
    ).fetchone()
    assert req == {"status": "done", "error": None}
    assert (f"heldout:{world['snap']['id']}", "loss") in _scores(conn, cand["id"])


def _summary(conn: Any, adapter_id: str) -> dict[str, Any]:
    row = conn.execute("SELECT eval_summary FROM serve.adapter WHERE id = %s", (adapter_id,))
    return dict(row.fetchone()["eval_summary"])


def test_the_base_is_scored_ahead_of_the_first_candidate_and_once_per_suite_and_split(
    conn: Any,
    db_url: str,
    models_dir: Path,
    settings: Settings,
    weights: dict[str, Path],
    world: dict[str, Any],
    evaluator: Evaluator,
) -> None:
    """The bare base's scores do not change between candidates: scored while the route's loop
    waits for signal, kept per suite (its cases as they are) and per held-out split, and
    scored anew once a case changes."""
    evaluator.cfg.db_url = db_url
    evaluator.base_scores = BaseScores()
    route, suite = world["route"], world["suite"]
    # Only a route whose loop is on is scored ahead.
    assert not evaluator.warm(conn)
    conn.execute(
        "INSERT INTO loop.policy (route, tenant_id, enabled) VALUES (%s, %s, true)",
        (route["name"], world["tenant"]["id"]),
    )
    assert evaluator.warm(conn)  # the suite's base score, ahead of any candidate
    assert not evaluator.warm(conn)  # kept: nothing left to score

    snap = world["snap"]["id"]
    # As the trainer records it: the revision of the base it trained on.
    _, revision = base_model.resolve(route["base_model"], models_dir)
    trained = {"dataset_snapshot_id": snap, "base_revision": revision}
    first = _register(conn, settings, route, weights["good"], **trained)
    assert _run(evaluator, db_url) == 1
    one = _summary(conn, first["id"])
    assert one["base_scores_reused"] == 1  # the suite's; the split's is new
    assert one["results"]["base"][suite] == {"pass_rate": 1.0, "n": 1, "passed": 1}

    # A second setting on the same snapshot (the loop's sweep): both of the base's scores kept,
    # the same numbers as computed.
    second = _register(conn, settings, route, weights["bad"], **trained)
    assert _run(evaluator, db_url) == 1
    two = _summary(conn, second["id"])
    assert two["base_scores_reused"] == 2
    assert two["results"]["base"] == one["results"]["base"]

    # A changed case is scored anew (ahead again: no candidate needed to see it).
    conn.execute("UPDATE train.eval_case SET expected = '0' WHERE suite_id = %s", (suite,))
    assert evaluator.warm(conn)
    assert not evaluator.warm(conn)
