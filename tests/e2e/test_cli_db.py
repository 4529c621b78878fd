"""`cft db` against a real embedded server in its own CFT_HOME: up twice, status, crash, down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg


def cft(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CFT_DATABASE_URL"} | {"CFT_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "cft.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_db_up_twice_status_url_crash_restart_down(tmp_path):
    home = tmp_path / "home"
    first = cft(home, "db", "up")
    assert first.returncode == 0, first.stderr
    pid_line = (home / "pgdata" / "postmaster.pid").read_text().splitlines()[0]
    second = cft(home, "db", "up")
    assert second.returncode == 0, second.stderr
    # Still the same postmaster: starting twice does not double-start.
    assert (home / "pgdata" / "postmaster.pid").read_text().splitlines()[0] == pid_line

    status = cft(home, "db", "status")
    assert status.returncode == 0 and "running" in status.stdout
    url = cft(home, "db", "url").stdout.strip().splitlines()[-1]
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE TABLE survives (x int)")
        c.execute("INSERT INTO survives VALUES (42)")

    # Crash: the postmaster dies and leaves a stale postmaster.pid behind.
    os.kill(int(pid_line), signal.SIGKILL)
    for _ in range(100):
        try:
            os.kill(int(pid_line), 0)
        except ProcessLookupError:
            break
        import time

        time.sleep(0.05)
    assert (home / "pgdata" / "postmaster.pid").exists()
    assert cft(home, "db", "status").returncode == 3

    again = cft(home, "db", "up")
    assert again.returncode == 0, again.stderr
    url = cft(home, "db", "url").stdout.strip().splitlines()[-1]
    with psycopg.connect(url) as c:
        assert c.execute("SELECT x FROM survives").fetchone() == (42,)

    down = cft(home, "db", "down")
    assert down.returncode == 0 and "stopped" in down.stdout
    assert cft(home, "db", "status").returncode == 3
