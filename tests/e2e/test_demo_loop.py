"""`cft run --demo --quick`: the demo only sends users and turns the loop on; cft does the rest."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from app.core import embedded
from tests.support.servers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"

# Everything the demo may call: its setup (route, eval suite, the one loop PUT), then users.
DEMO_CALLS = {
    "POST /v1/routes",
    "POST /v1/eval-suites",
    "PUT /v1/routes/support/loop",
    "POST /v1/chat/completions",
    "POST /v1/logs/{request_id}/feedback",
}


def test_make_run_demo_the_loop_runs_itself(tmp_path: Path, models_dir: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(models_dir)
    report_path = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CFT_")}
    env |= {"CFT_HOME": str(home), "CFT_PORT": str(free_port())}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cft.cli", "run", "--demo", "--quick",
         "--report-json", str(report_path)],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=840)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # cft run stops its services on Ctrl-C
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"cft run --demo --quick took over 840 s:\n{out[-4000:]}")
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "demo.log").write_text(out)  # what a user sees, kept for reading after CI
    assert proc.returncode == 0, out[-4000:] + err[-2000:]
    for heading in ("setup: route, house-style eval suite, the loop on", "observe:", "canary:",
                    "after the promotion:", "report"):  # fmt: skip
        assert f"== {heading}" in out, f"{heading!r} missing:\n{out[-3000:]}"
    assert re.search(r"feedback-to-live: \d+ s", out), out[-3000:]

    data = json.loads(report_path.read_text())
    # The demo drove nothing but users, after its setup and the one loop PUT.
    calls = data["demo"]["calls"]
    assert set(calls) == DEMO_CALLS, calls
    assert calls["PUT /v1/routes/support/loop"] == 1
    report = data["report"]
    cycle = report["cycle"]
    assert cycle["state"] == "promoted" and cycle["decision"] == "promote", cycle
    assert report["prod_now"] == cycle["adapter_id"]
    held = report["live"]["held_out_after_promotion"]
    assert held["questions_in_training"] == 0 and held["users_in_training"] == 0
    assert held["n"] > 0 and report["feedback_to_live_s"] > 0
    # It passes on gain: new users on held-out questions like the promoted adapter's answers
    # at least 30 points more than the base's (the policy carries no hyperparameters).
    base = report["live"]["base_observe"]
    assert base["rate"] is not None and held["rate"] - base["rate"] >= 0.30, (base, held)

    # The database tells the same story (the run stopped the server it started).
    url = embedded.start(home / "pgdata")
    try:
        with psycopg.connect(url, row_factory=dict_row) as c:
            row = c.execute(
                "SELECT id, tenant_id, state, trigger, adapter_id FROM loop.cycle"
                " WHERE route = 'support'"
            ).fetchone()
            assert row and row["state"] == "promoted" and row["trigger"] == "volume"
            prod = c.execute(
                "SELECT serve.current_prod(%s, 'support') AS id", (row["tenant_id"],)
            ).fetchone()
            assert prod and prod["id"] == row["adapter_id"] == cycle["adapter_id"]
            states = [
                e["to_state"]
                for e in c.execute(
                    "SELECT to_state FROM loop.cycle_event WHERE cycle_id = %s ORDER BY id",
                    (row["id"],),
                ).fetchall()
            ]
            assert states[:6] == ["triggered", "snapshot", "training", "evaluating", "canary",
                                  "deciding"], states  # fmt: skip
            assert states[-1] == "promoted"
            # The loop promoted it (its cycle in the audit), through canary then prod.
            events = c.execute(
                "SELECT new_status, actor, reason FROM serve.adapter_event WHERE adapter_id = %s"
                " ORDER BY id",
                (row["adapter_id"],),
            ).fetchall()
            assert [e["new_status"] for e in events][-2:] == ["canary", "prod"]
            assert f"loop cycle {row['id']}" in (events[-1]["reason"] or "")
            steps = {
                r["step"]
                for r in c.execute(
                    "SELECT DISTINCT step FROM loop.provenance(%s)", (row["adapter_id"],)
                ).fetchall()
            }
            assert {"cycle", "trigger", "snapshot", "example", "log_row", "eval", "decision"} <= (
                steps
            )
            raw_users = c.execute(
                "SELECT count(*) AS n FROM obs.inference_log WHERE messages::text LIKE '%%user-00%%'"
            ).fetchone()["n"]
            assert raw_users == 0
    finally:
        embedded.stop(home / "pgdata")
