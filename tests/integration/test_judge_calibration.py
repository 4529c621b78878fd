"""Judge calibration with a real judge: the local engine (SmolLM2-135M) answers a rubric prompt on
a labelled set this test writes; the stored agreement is recomputed here from the judge's own
replies, and the gate enforces it on a required judge-scored metric."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from app.core.auth import create_key
from app.evals import service as evals
from app.main import create_app
from cft.engine.core import Engine
from cft.engine.server import create_app as create_engine_app
from tests.support.factories import make_adapter, make_route, make_tenant
from tests.support.servers import serve_app
from workers import base_model
from workers.evaluator import judge

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
JUDGE = base_model.BUNDLED
RUBRIC = "Give 10 if the answer correctly answers the question, 0 if it does not."
# (question, answer, people's verdict): a handful, so the judge runs 6 short greedy generations.
LABELLED = [
    ("What is 2 + 2?", "2 + 2 is 4.", True),
    ("What is 2 + 2?", "Bananas are yellow.", False),
    ("What is the capital of France?", "The capital of France is Paris.", True),
    ("What is the capital of France?", "I do not like questions.", False),
    ("Name a colour of the sky on a clear day.", "Blue.", True),
    ("Name a colour of the sky on a clear day.", "Seven hundred.", False),
]


@pytest.fixture(scope="module")
def judge_url(models_dir: Path) -> Iterator[str]:
    eng = Engine(JUDGE, models_dir, max_loras=1, max_cpu_loras=1)
    try:
        with serve_app(create_engine_app(eng), ready_path="/health", timeout=120) as base:
            yield base
    finally:
        eng.close()


@pytest.fixture
def api(db_url: str) -> Iterator[str]:
    with serve_app(create_app(db_url=db_url)) as base:
        yield base


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _blockers(conn: Any, cand: str) -> list[str]:
    rows = conn.execute("SELECT * FROM serve.promotion_blockers(%s, NULL)", (cand,)).fetchall()
    return [r["reason"] for r in rows]


def test_judge_calibration_is_stored_and_enforced(
    api: str, conn: Any, db_url: str, judge_url: str
) -> None:
    t = make_tenant(conn)
    route = make_route(conn, tenant_id=t["id"])["name"]
    keys = {r: create_key(conn, tenant_id=t["id"], role=r) for r in ("trainer", "release", "admin")}
    suite = f"helpful-{route}"
    # A judge suite with its calibration set, over REST (the labels' author is the key).
    body = {
        "id": suite,
        "route": route,
        "kind": "judge",
        "rubric": RUBRIC,
        "cases": [
            {
                "messages": [{"role": "user", "content": "Say hi."}],
                "check": "contains",
                "expected": "hi",
            }
        ],
        "calibration": [
            {"messages": [{"role": "user", "content": q}], "answer": a, "label": y}
            for q, a, y in LABELLED
        ],
    }
    made = httpx.post(f"{api}/v1/eval-suites", headers=_h(keys["trainer"]), json=body, timeout=10)
    assert made.status_code == 201, made.text
    assert [c["human_label"] for c in made.json()["calibration"]] == [y for *_, y in LABELLED]
    assert made.json()["calibrations"] == []
    # A required judge-scored metric, recorded by an author the rule trusts (a release key: the
    # rule names release, which by default is not trusted).
    put = httpx.put(
        f"{api}/v1/promotion-policy",
        headers=_h(keys["admin"]),
        json={
            "route": route,
            "rules": [
                {
                    "suite_id": suite,
                    "metric": "judge_score",
                    "direction": "higher",
                    "trusted_authors": ["evaluator", "release", "owner"],
                }
            ],
        },
        timeout=10,
    )
    assert put.status_code == 200, put.text
    version = evals.rubric_version(RUBRIC)
    cand = make_adapter(
        conn, route={"name": route, "tenant_id": t["id"], "base_model": base_model.BUNDLED}
    )["id"]
    rec = httpx.post(
        f"{api}/v1/adapters/{cand}/eval-results",
        headers=_h(keys["release"]),
        json={
            "results": [
                {
                    "suite_id": suite,
                    "metric": "judge_score",
                    "score": 8.0,
                    "judge_model": JUDGE,
                    "rubric_version": version,
                }
            ]
        },
        timeout=10,
    )
    assert rec.status_code == 200 and rec.json()[0]["rubric_version"] == version, rec.text
    # No calibration yet: refused.
    assert _blockers(conn, cand) == [
        f"judge {JUDGE} (rubric {version}) has no calibration on suite {suite}: a required"
        f" judge-scored metric needs one (cft worker eval --calibrate {suite})"
    ]

    # Calibrate from the command line, with the local engine as the judge.
    env = os.environ | {
        "CFT_DATABASE_URL": db_url,
        "CFT_HOME": str(ROOT / ".cft"),
        "CFT_EVAL_JUDGE_URL": judge_url,
        "CFT_EVAL_JUDGE_MODEL": JUDGE,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "cft.cli", "worker", "eval", "--calibrate", suite],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    print(proc.stdout)  # the judge's agreement, for the record (pytest -rP)
    cal = conn.execute(
        "SELECT * FROM train.judge_calibration WHERE suite_id = %s", (suite,)
    ).fetchone()
    assert (cal["judge_model"], cal["rubric_version"], cal["n"]) == (JUDGE, version, len(LABELLED))
    assert cal["author_role"] == "evaluator" and cal["author"].startswith(
        "evaluator cft-evaluator/"
    )
    assert "kappa=" in proc.stdout and suite in proc.stdout

    # Recompute from the judge's actual answers: ask it again (greedy) and read its replies.
    verdicts = conn.execute(
        "SELECT v.*, c.messages, c.answer FROM train.judge_verdict v"
        " JOIN train.eval_calibration_case c ON c.id = v.case_id"
        " WHERE v.calibration_id = %s ORDER BY v.case_id",
        (cal["id"],),
    ).fetchall()
    assert len(verdicts) == len(LABELLED)
    judged, human = [], []
    with httpx.Client(base_url=judge_url, timeout=300) as client:
        for v, (_, _, label) in zip(verdicts, LABELLED, strict=True):
            reply = client.post(
                "/v1/chat/completions",
                json={
                    "model": JUDGE,
                    "messages": judge.prompt(RUBRIC, v["messages"], v["answer"]),
                    "max_tokens": 8,
                    "temperature": 0,
                },
            ).json()["choices"][0]["message"]["content"]
            assert reply == v["judge_reply"]
            m = re.search(r"\d+(\.\d+)?", reply)
            score = min(float(m.group()), 10.0) if m else None
            assert (None if v["judge_score"] is None else float(v["judge_score"])) == score
            judged.append(score is not None and score >= 5)
            human.append(label)
            assert (v["judge_label"], v["human_label"]) == (judged[-1], label)
    n = len(judged)
    po = sum(j == h for j, h in zip(judged, human, strict=True)) / n
    pj, ph = sum(judged) / n, sum(human) / n
    pe = pj * ph + (1 - pj) * (1 - ph)
    kappa = (po - pe) / (1 - pe)
    assert math.isclose(float(cal["accuracy"]), po, abs_tol=1e-12)
    assert math.isclose(float(cal["kappa"]), kappa, abs_tol=1e-12)
    assert math.isclose(float(cal["bias"]), pj - ph, abs_tol=1e-12)
    assert math.isclose(float(cal["human_positive_rate"]), 0.5, abs_tol=1e-12)

    # The gate follows the stored kappa against the rule's min_judge_kappa (default 0.6).
    def set_min(value: float) -> None:
        conn.execute(
            "UPDATE train.promotion_policy SET min_judge_kappa = %s WHERE route = %s",
            (value, route),
        )

    if kappa < 0.6:
        (why,) = _blockers(conn, cand)
        head = f"judge {JUDGE} (rubric {version}) agrees too little with people on suite {suite}:"
        assert why.startswith(head) and why.endswith(" < 0.6 (min_judge_kappa)"), why
        shown_kappa = why[len(head) :].split()[1]
        assert math.isclose(float(shown_kappa), round(kappa, 3), abs_tol=1e-9)
    else:
        assert _blockers(conn, cand) == []
    set_min(max(-1.0, kappa - 0.01))
    assert _blockers(conn, cand) == []
    if kappa < 0.99:
        set_min(min(1.0, kappa + 0.01))
        assert "agrees too little" in _blockers(conn, cand)[0]
        with pytest.raises(psycopg.errors.CheckViolation, match="agrees too little"):
            conn.execute(
                "UPDATE serve.adapter SET status = 'prod', traffic_pct = 100 WHERE id = %s", (cand,)
            )
    set_min(max(-1.0, kappa - 0.01))
    # A result judged with another rubric is not covered by this calibration.
    conn.execute(
        "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score, judge_model,"
        " rubric_version) SELECT adapter_id, suite_id, metric, score, judge_model, 'other'"
        " FROM train.eval_result_counted WHERE adapter_id = %s",
        (cand,),
    )
    assert "has no calibration" in _blockers(conn, cand)[0]

    # The suite shows its calibrations over REST; a tenant's key cannot record one.
    got = httpx.get(
        f"{api}/v1/eval-suites", params={"route": route}, headers=_h(keys["trainer"])
    ).json()["data"]
    shown = next(s for s in got if s["id"] == suite)["calibrations"]
    assert [(c["judge_model"], c["n"]) for c in shown] == [(JUDGE, len(LABELLED))]
    with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
        conn.execute("SET LOCAL ROLE cft_app")
        conn.execute("SELECT set_config('cft.tenant_id', %s, true)", (str(t["id"]),))
        # Verdicts for every case, so the refusal is the INSERT's (a forged perfect judge).
        conn.execute(
            "SELECT train.record_judge_calibration(%s, %s, 'j', 'v', (SELECT jsonb_agg("
            "jsonb_build_object('case_id', id, 'score', CASE WHEN human_label THEN 10 ELSE 0 END))"
            " FROM train.eval_calibration_case WHERE suite_id = %s))",
            (t["id"], suite, suite),
        )


def test_the_evaluator_calibrates_its_judge_once_then_judges(
    conn: Any, db_url: str, judge_url: str
) -> None:
    from app.core.config import Settings
    from workers.evaluator.worker import EVALUATOR, connect, write_results

    t = make_tenant(conn)
    route = make_route(conn, tenant_id=t["id"])
    suite_id = f"judged-{route['name']}"
    conn.execute(
        "INSERT INTO train.eval_suite (id, tenant_id, route, name, kind, rubric)"
        " VALUES (%s, %s, %s, 'judged', 'judge', %s)",
        (suite_id, t["id"], route["name"], RUBRIC),
    )
    for q, a, y in LABELLED[:4]:
        conn.execute(
            "INSERT INTO train.eval_calibration_case"
            " (tenant_id, suite_id, messages, answer, human_label) VALUES (%s, %s,"
            " jsonb_build_array(jsonb_build_object('role', 'user', 'content', %s::text)), %s, %s)",
            (t["id"], suite_id, q, a, y),
        )
    conn.execute(
        "INSERT INTO train.promotion_policy"
        " (tenant_id, route, suite_id, metric, direction, min_judge_kappa)"
        " VALUES (%s, %s, %s, 'judge_score', 'higher', -1)",
        (t["id"], route["name"], suite_id),
    )
    suite = conn.execute("SELECT * FROM train.eval_suite WHERE id = %s", (suite_id,)).fetchone()
    cases = [{"messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 4}]
    settings = Settings(home=ROOT / ".cft", eval_judge_url=judge_url, eval_judge_model=JUDGE)
    cand = make_adapter(conn, route=route)["id"]
    with connect(db_url, "w-test") as ev:
        first = judge.ensure_calibrated(ev, settings, suite)
        assert first is not None and first.n == 4
        assert first.author == f"evaluator {EVALUATOR} w-test"
        again = judge.ensure_calibrated(ev, settings, suite)  # calibrated: not run again
        assert again is not None and again.id == first.id
        scored = judge.judge_suite(
            settings, suite, cases, lambda chats: ["2 + 2 is 4."] * len(chats)
        )
        assert scored["_judge_model"] == JUDGE
        assert scored["_rubric_version"] == evals.rubric_version(RUBRIC)
        write_results(ev, cand, {suite_id: scored}, replace=True)
    row = conn.execute("SELECT * FROM train.eval_result WHERE adapter_id = %s", (cand,)).fetchone()
    assert (row["judge_model"], row["rubric_version"], row["author_kind"]) == (
        JUDGE,
        evals.rubric_version(RUBRIC),
        "evaluator",
    )
    if math.isnan(float(row["score"])):
        assert "not a finite number" in _blockers(conn, cand)[0]
    else:
        # min_judge_kappa -1: any calibrated judge will do here; with none the gate refuses.
        assert _blockers(conn, cand) == []
        conn.execute("DELETE FROM train.judge_calibration WHERE suite_id = %s", (suite_id,))
        assert "has no calibration" in _blockers(conn, cand)[0]
