"""The loop running itself, headless: feedback-to-live, and the promoted adapter on held-out users.

Runs `cft run --demo` exactly as `make run` does (fresh CFT_HOME in a temp dir, the bundled
model, embedded PostgreSQL, every worker including `cft worker loop`): the demo only sends users
and turns the route's loop on; the platform snapshots, trains, evaluates, opens the canary,
decides and promotes by itself. From the report (read from SQL) it prints:
- feedback-to-live: the route's first feedback (min obs.inference_log.feedback_at) -> the first
  call the promoted adapter served as prod (first row by it at or after promoted_at, not as the
  canary's arm B), and the time in each cycle state (loop.cycle_event);
- held-out positive feedback: the thumbs-up rate of rated rows from users and questions the
  training data never saw (new user ids, the 30 held-out questions; the report checks the
  snapshot's source rows hold none of either), served by the promoted adapter after promotion,
  against the base's rate on rated rows while it served alone (observe);
- the live thumbs-up of each canary arm and the loop's decision with its numbers.
Targets (BENCHMARKS.md, "Loop: the loop runs itself (issue 20)"): feedback-to-live < 300 s at the
default demo size on the 2-core machine; held-out positive-feedback rate >= base + 30 points.

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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(r: dict[str, Any] | None) -> str:
    if not r or r.get("rate") is None:
        return "n/a"
    return f"{r['rate']:.0%} ({r['thumbs_up']}/{r['n']} rated)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the shortened CI demo")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="cft-bench-loop-"))
    models = ROOT / ".cft" / "models"
    if models.exists():
        (home / "models").symlink_to(models)
    report_path = home / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CFT_")}
    env |= {"CFT_HOME": str(home), "CFT_PORT": str(free_port())}
    cmd = [sys.executable, "-m", "cft.cli", "run", "--demo", "--report-json", str(report_path)]
    if args.quick:
        cmd.append("--quick")
    load_before = os.getloadavg()
    start = time.time()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, text=True,
                          capture_output=True)  # fmt: skip
    wall = time.time() - start
    (home / "run.log").write_text(proc.stdout + proc.stderr)
    print(f"full output of cft run: {home / 'run.log'}")
    if not report_path.exists():
        print(proc.stdout[-4000:], proc.stderr[-2000:])
        print(f"the demo failed (rc={proc.returncode}) after {wall:.0f} s")
        return 1
    data = json.loads(report_path.read_text())
    r, demo = data["report"], data["demo"]
    c = r["cycle"] or {}
    print(f"cft run --demo{' --quick' if args.quick else ''}: wall {wall:.0f} s,"
          f" demo {data['demo_seconds']:.0f} s, rc {proc.returncode}")  # fmt: skip
    print(f"load average before / after (1, 5, 15 min): {load_before} / {os.getloadavg()}")
    print(f"cycle {c.get('id')}: {c.get('state')} (trigger {c.get('trigger')}, method"
          f" {c.get('method')}: {c.get('method_reason')})")  # fmt: skip
    print(f"  dataset: {c.get('n_train')} train / {c.get('n_eval')} eval examples")
    if r.get("first_feedback_to_cycle_s") is not None:
        print(f"  {r['first_feedback_to_cycle_s']:6.1f} s  first feedback -> cycle started")
    for d in r.get("durations", []):
        print(f"  {d['seconds']:6.1f} s  {d['state']}")
    ftl = r.get("feedback_to_live_s")
    print(f"feedback-to-live: {ftl:.0f} s (target < 300 s)" if ftl is not None
          else "feedback-to-live: not reached")  # fmt: skip
    live = r.get("live") or {}
    for a in live.get("canary_arms", []):
        print(f"live thumbs-up, canary arm {a['variant']} {a['adapter_id']}: {pct(a)}")
    print(f"decision: {c.get('decision')} ({c.get('decision_code')}): {c.get('decision_reason')}")
    base, held = live.get("base_observe"), live.get("held_out_after_promotion")
    print(f"held-out positive feedback, base (observe): {pct(base)}")
    if held:
        print(f"held-out positive feedback, promoted adapter: {pct(held)} from {held['users']}"
              f" new users on {held['questions']} held-out questions (in the training data:"
              f" {held['questions_in_training']} questions, {held['users_in_training']} users)")  # fmt: skip
        if base and base.get("rate") is not None and held.get("rate") is not None:
            gain = (held["rate"] - base["rate"]) * 100
            print(f"held-out gain: {gain:+.0f} points (target >= +30)")
    print(f"the demo called: {demo['calls']}")
    return 0 if c.get("state") == "promoted" else 1


if __name__ == "__main__":
    raise SystemExit(main())
