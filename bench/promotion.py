"""Promotion latency: COMMIT of `UPDATE serve.adapter SET status='prod'` -> first request routed
to the new adapter (the gate's NOTIFY invalidates the router's route cache).

Same stack as bench/router.py (embedded PostgreSQL, stub backend that reports bench-v0..N as
loaded, cft router). Each round inserts a candidate with a better eval score, promotes it by
raw SQL, and right after COMMIT returns sends requests back to back until X-Cft-Adapter names
it. Usage: python bench/promotion.py [--rounds 50]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

import router as rb


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=50)
    args = ap.parse_args()
    with rb.Stack() as st, httpx.Client(timeout=10) as client:
        url = st.api + "/v1/chat/completions"
        headers = {"authorization": f"Bearer {st.key}", "content-type": "application/json"}
        assert (
            client.post(url, content=rb.BODY, headers=headers).headers["x-cft-adapter"]
            == "bench-v0"
        )
        times: list[float] = []
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
                c.execute(
                    "UPDATE serve.adapter SET status = 'prod', traffic_pct = 100 WHERE id = %s",
                    (new,),
                )  # autocommit: returns after COMMIT
                t0 = time.perf_counter()
                while True:
                    r = client.post(url, content=rb.BODY, headers=headers)
                    if r.headers.get("x-cft-adapter") == new:
                        break
                    if time.perf_counter() - t0 > 10:
                        raise RuntimeError(f"{new} never reached routing")
                times.append(time.perf_counter() - t0)
        print(f"promotion -> routing, {len(times)} rounds (stub backend, cft router)")
        print(
            f"p50 {rb.pct(times, 50):.1f} ms  p99 {rb.pct(times, 99):.1f} ms"
            f"  max {max(times) * 1000:.1f} ms  (TTL alone: {5.0:.0f} s)"
        )


if __name__ == "__main__":
    main()
