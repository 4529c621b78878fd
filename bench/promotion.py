"""Promotion latency: COMMIT of `UPDATE serve.adapter SET status='prod'` -> first request routed
to the new adapter (the gate's NOTIFY invalidates the router's route cache).

Same stack as bench/router.py (embedded PostgreSQL, stub backend that reports bench-v0..N as
loaded, cft router). Each round inserts a candidate with a better eval score, promotes it by
raw SQL, and right after COMMIT returns sends requests back to back until X-Cft-Adapter names
it. Usage: python bench/promotion.py [--rounds 50] [--json FILE]

Where the time goes (BENCHMARKS.md, "Promotion COMMIT → routed (item 5b)"): a second LISTEN
connection in this process notes when each NOTIFY cft_adapter arrives (relative to the COMMIT's
return: delivery can beat it; the router's cft_route is sent at the same COMMIT), and each round
counts the calls that still got the old adapter and times the routed call itself: COMMIT ->
routed minus that call is the time the router took to learn of the change (0 when the first call
after COMMIT was routed). --json writes every round's numbers. --trees A,B runs this bench from each tree's own copy
(bench/promotion.py there, so each tree's router and SQL) in turn, alternating the order each
cycle, and prints each run with the load average and every tree's rounds pooled:

    git archive <before> | tar -x -C /tmp/before; cp bench/promotion.py /tmp/before/bench/
    python bench/promotion.py --trees /tmp/before,. --cycles 6 --rounds 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

import router as rb


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--json", help="write the raw numbers here")
    ap.add_argument(
        "--no-probe",
        action="store_true",
        help="without the second listener (its thread takes this process's GIL at the COMMIT)",
    )
    ap.add_argument("--trees", help="comma-separated trees to run alternately (see above)")
    ap.add_argument("--cycles", type=int, default=4, help="with --trees: runs of each tree")
    args = ap.parse_args()
    if args.trees:
        alternate(args.trees.split(","), args)
        return
    with rb.Stack() as st, httpx.Client(timeout=10) as client:
        url = st.api + "/v1/chat/completions"
        headers = {"authorization": f"Bearer {st.key}", "content-type": "application/json"}
        assert (
            client.post(url, content=rb.BODY, headers=headers).headers["x-cft-adapter"]
            == "bench-v0"
        )
        # One call with nothing changing: the floor of COMMIT -> routed (the client's own call).
        base_ms = []
        for _ in range(200):
            tc = time.perf_counter()
            client.post(url, content=rb.BODY, headers=headers)
            base_ms.append((time.perf_counter() - tc) * 1000)
        times: list[float] = []
        notified: dict[str, float] = {}
        listening = threading.Event()
        stop = threading.Event()

        def listen() -> None:
            with psycopg.connect(st.db, autocommit=True) as lc:
                lc.execute("LISTEN cft_adapter")
                listening.set()
                while not stop.is_set():
                    for _note in lc.notifies(timeout=0.2, stop_after=1):
                        notified.setdefault(f"n{len(notified)}", time.perf_counter())

        probe = threading.Thread(target=listen, daemon=True)
        if not args.no_probe:
            probe.start()
            listening.wait(10)
        notify_ms: list[float] = []
        commit_ms: list[float] = []
        stale_calls: list[int] = []
        call_ms: list[float] = []
        routed_call_ms: list[float] = []
        before_routed_ms: list[float] = []
        with psycopg.connect(st.db, autocommit=True) as c:
            for i in range(1, args.rounds + 1):
                new = f"bench-v{i}"
                c.execute(
                    "INSERT INTO serve.adapter (id, tenant_id, route, base_model, status)"
                    " VALUES (%s, %s, 'support-es', %s, 'candidate')",
                    (new, st.tenant_id, rb.BASE),
                )
                c.execute(
                    "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
                    " VALUES (%s, 'tasks', 'accuracy', %s)",
                    (new, 0.5 + i * 0.001),
                )
                time.sleep(0.05)
                seen = len(notified)  # the INSERT above notified too
                ts = time.perf_counter()
                c.execute(
                    "UPDATE serve.adapter SET status = 'prod', traffic_pct = 100 WHERE id = %s",
                    (new,),
                )  # autocommit: returns after COMMIT
                t0 = time.perf_counter()
                stale = 0
                while True:
                    tc = time.perf_counter()
                    r = client.post(url, content=rb.BODY, headers=headers)
                    if r.headers.get("x-cft-adapter") == new:
                        routed_call_ms.append((time.perf_counter() - tc) * 1000)
                        before_routed_ms.append((tc - t0) * 1000)
                        break
                    stale += 1
                    call_ms.append((time.perf_counter() - tc) * 1000)
                    if time.perf_counter() - t0 > 10:
                        raise RuntimeError(f"{new} never reached routing")
                times.append(time.perf_counter() - t0)
                commit_ms.append((t0 - ts) * 1000)
                stale_calls.append(stale)
                time.sleep(0.02)
                arrivals = sorted(notified.values())[seen:]
                if arrivals:
                    notify_ms.append((arrivals[0] - t0) * 1000)
        stop.set()
        if probe.is_alive():  # out of notifies() before the bench stops PostgreSQL
            probe.join(5)
        print(f"promotion -> routing, {len(times)} rounds (stub backend, cft router)")
        print(
            f"p50 {rb.pct(times, 50):.1f} ms  p99 {rb.pct(times, 99):.1f} ms"
            f"  max {max(times) * 1000:.1f} ms  (TTL alone: {5.0:.0f} s)"
        )
        med = statistics.median
        print(
            f"UPDATE+COMMIT {med(commit_ms):.1f} ms median; NOTIFY at a 2nd listener"
            f" {med(notify_ms or [0]):+.1f} ms after COMMIT returned (median, max"
            f" {max(notify_ms or [0]):+.1f}); calls still on the old adapter: median"
            f" {med(stale_calls):.0f}, max {max(stale_calls)}, in"
            f" {sum(1 for x in stale_calls if x)} of {len(stale_calls)} rounds; one call"
            f" {med(call_ms) if call_ms else 0:.1f} ms median; one call with no change:"
            f" p50 {rb.pct(base_ms, 50) / 1000:.1f} ms, p99 {rb.pct(base_ms, 99) / 1000:.1f} ms;"
            f" {rb.load_str()}"
        )
        print(
            f"the routed call itself: p50 {rb.pct(routed_call_ms, 50) / 1000:.1f} ms,"
            f" p99 {rb.pct(routed_call_ms, 99) / 1000:.1f} ms; COMMIT -> routed minus it:"
            f" p50 {rb.pct(before_routed_ms, 50) / 1000:.1f} ms,"
            f" p99 {rb.pct(before_routed_ms, 99) / 1000:.1f} ms"
        )
        if args.json:
            raw = {
                "routed_ms": [t * 1000 for t in times],
                "routed_call_ms": routed_call_ms,
                "before_routed_ms": before_routed_ms,
                "stale_calls": stale_calls,
                "notify_ms": notify_ms,
                "commit_ms": commit_ms,
                "base_ms": base_ms,
                "load": os.getloadavg(),
            }
            Path(args.json).write_text(json.dumps(raw))


def alternate(trees: list[str], args: argparse.Namespace) -> None:
    """Run the bench of each tree in turn (order reversed every cycle), then pool the rounds."""
    runs: dict[str, list[dict[str, list[float]]]] = {t: [] for t in trees}
    extra = ["--no-probe"] if args.no_probe else []
    with tempfile.TemporaryDirectory() as tmp:
        for cycle in range(args.cycles):
            for tree in trees if cycle % 2 == 0 else trees[::-1]:
                out = Path(tmp) / "run.json"
                load = rb.load_str()
                bench = str(Path(tree).resolve() / "bench" / "promotion.py")
                cmd = [sys.executable, bench, "--rounds", str(args.rounds), "--json", str(out)]
                subprocess.run(cmd + extra, check=True, stdout=subprocess.DEVNULL)
                raw = json.loads(out.read_text())
                runs[tree].append(raw)
                print(f"{tree}: {summary([raw])}; {load} before, {rb.load_str()} after", flush=True)
    for tree, raws in runs.items():
        print(f"{tree}, {len(raws)} runs pooled: {summary(raws)}")


def summary(raws: list[dict[str, list[float]]]) -> str:
    """COMMIT -> routed, the routed call itself, the time before it and the old-adapter calls."""

    def pooled(key: str) -> str:
        values = [x / 1000 for raw in raws for x in raw[key]]
        return f"p50 {rb.pct(values, 50):.1f} p99 {rb.pct(values, 99):.1f} ms"

    stale = [x for raw in raws for x in raw["stale_calls"]]
    per_run = ", ".join(f"{rb.pct([x / 1000 for x in raw['routed_ms']], 99):.1f}" for raw in raws)
    return (
        f"COMMIT -> routed {pooled('routed_ms')} (per run p99 {per_run});"
        f" the routed call {pooled('routed_call_ms')}; before it {pooled('before_routed_ms')};"
        f" one call, no change {pooled('base_ms')}; old-adapter calls {sum(stale)} in"
        f" {sum(1 for x in stale if x)} of {len(stale)} rounds"
    )


if __name__ == "__main__":
    main()
