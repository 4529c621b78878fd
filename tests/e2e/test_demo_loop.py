"""`cft run --demo --quick`: the whole loop through the public APIs, as a user runs it."""

from __future__ import annotations

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

PHASES = [
    "setup: route and house-style eval suite",
    "observe: users talk to the base model and give feedback",
    "train: SFT on the edits",
    "train: DPO on the preference pairs",
    "evaluate: held-out and house-style suites (evaluator worker)",
    "canary:",
    "promote through the gate",
    "report",
]


def test_make_run_demo_closes_the_loop(tmp_path: Path, models_dir: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(models_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CFT_")}
    env |= {"CFT_HOME": str(home), "CFT_PORT": str(free_port())}
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "run", "--demo", "--quick"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=840)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # cft run stops its services on Ctrl-C
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"cft run --demo --quick took over 840 s:\n{out[-4000:]}")
    assert proc.returncode == 0, out[-4000:] + err[-2000:]
    for phase in PHASES:
        assert f"== {phase}" in out, f"phase {phase!r} missing:\n{out[-3000:]}"
    promoted = re.search(r"promoted: (\S+); serving now: (\S+)", out)
    assert promoted, out[-3000:]
    assert promoted.group(1) == promoted.group(2)
    assert re.search(r"feedback-to-live: \d+ s", out)

    # The database tells the same story (the run stopped the server it started).
    url = embedded.start(home / "pgdata")
    try:
        with psycopg.connect(url, row_factory=dict_row) as c:
            prod = c.execute(
                "SELECT id FROM serve.adapter WHERE route = 'support' AND status = 'prod'"
            ).fetchone()
            assert prod and prod["id"] == promoted.group(1)
            events = c.execute(
                "SELECT new_status FROM serve.adapter_event WHERE adapter_id = %s ORDER BY id",
                (prod["id"],),
            ).fetchall()
            assert [e["new_status"] for e in events][-2:] == ["canary", "prod"]
            runs = c.execute(
                "SELECT method, status FROM train.training_run ORDER BY created_at"
            ).fetchall()
            assert [(r["method"], r["status"]) for r in runs][:1] == [("sft", "succeeded")]
            assert (
                c.execute(
                    "SELECT count(*) AS n FROM train.eval_result WHERE adapter_id = %s",
                    (prod["id"],),
                ).fetchone()["n"]
                > 0
            )
            arms = c.execute(
                "SELECT variant, count(*) AS n FROM obs.inference_log"
                " WHERE experiment = 'support-house-style' AND variant IS NOT NULL"
                " GROUP BY variant ORDER BY variant"
            ).fetchall()
            # Calls that fell back (canary not loaded yet) are logged without an arm.
            assert [a["variant"] for a in arms] == ["A", "B"]
            raw_users = c.execute(
                "SELECT count(*) AS n FROM obs.inference_log WHERE messages::text LIKE '%%user-00%%'"
            ).fetchone()["n"]
            assert raw_users == 0
    finally:
        embedded.stop(home / "pgdata")
