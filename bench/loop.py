"""The demo loop, headless: feedback-to-live time and how much the adapters beat the base.

Runs `cft run --demo` exactly as `make run` does (fresh CFT_HOME in a temp dir, the bundled
model, embedded PostgreSQL) and prints, from its report:
- feedback-to-live: first user feedback -> the trained adapter serving 100 % of traffic;
- positive-feedback rate on held-out simulated users, base vs each adapter: the simulated users
  like an answer exactly when it follows the house style, so the evaluator's house-style pass
  rate on the held-out questions (which no user asked during training) is that rate;
- the live thumbs-up rates of prod and canary during the experiment.
Targets (issue 10): adapter >= base + 30 points; feedback-to-live < 10 minutes.

    .venv/bin/python bench/loop.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the shortened CI loop")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="cft-bench-loop-"))
    models = ROOT / ".cft" / "models"
    if models.exists():
        (home / "models").symlink_to(models)
    report_path = home / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CFT_")}
    env |= {"CFT_HOME": str(home), "CFT_PORT": str(free_port())}
    cmd = [sys.executable, "-m", "workers.cli", "run", "--demo", "--report-json", str(report_path)]
    if args.quick:
        cmd.append("--quick")
    start = time.time()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, text=True,
                          capture_output=True)  # fmt: skip
    wall = time.time() - start
    (home / "run.log").write_text(proc.stdout + proc.stderr)
    print(f"full output of cft run: {home / 'run.log'}")
    if proc.returncode != 0 or not report_path.exists():
        print(proc.stdout[-4000:], proc.stderr[-2000:])
        print(f"loop failed (rc={proc.returncode}) after {wall:.0f} s")
        return 1
    report = json.loads(report_path.read_text())
    base = report["evals"].get("base", {})

    def rate(scores: dict[str, float]) -> float | None:
        vals = [v for k, v in scores.items() if k.endswith("pass_rate")]
        return max(vals) if vals else None

    base_rate = rate(base)
    print(f"cft run --demo{' --quick' if args.quick else ''}: wall {wall:.0f} s,"
          f" loop {report['demo_seconds']:.0f} s")  # fmt: skip
    print(f"feedback-to-live: {report['feedback_to_live_s']:.0f} s (target < 600 s)")
    for name, seconds in report.get("phases", {}).items():
        print(f"  {seconds:6.1f} s  {name}")
    print(f"load average at the end (1, 5, 15 min): {os.getloadavg()}")
    print(f"held-out positive-feedback rate, base: {base_rate:.0%}" if base_rate is not None
          else "held-out base rate: not reported")  # fmt: skip
    for method, run in report["runs"].items():
        scores = report["evals"].get(run.get("adapter_id"), {})
        r = rate(scores)
        if r is None:
            continue
        gain = (r - base_rate) * 100 if base_rate is not None else float("nan")
        print(f"held-out positive-feedback rate, {method} adapter: {r:.0%}"
              f"  (gain {gain:+.0f} points; target >= +30)")  # fmt: skip
    for arm in report["arms"]:
        if arm.get("thumbs_up_rate") is not None:
            print(f"live thumbs-up {arm['variant']} ({arm['adapter_id']}): {arm['thumbs_up_rate']:.0%}"
                  f" [{arm['thumbs_up_ci_low']:.0%}, {arm['thumbs_up_ci_high']:.0%}], n={arm['n']}")  # fmt: skip
    print(f"promoted: {report['promoted']} (serving after: {report['serving_after']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
