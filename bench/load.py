"""Load (BENCHMARKS.md "Load (issue 11)"): bounded mixed traffic on loopback, POST /v1/logs batches and feedback.

One fresh embedded PostgreSQL (fsync on), `cft`'s API under uvicorn (a subprocess), C clients
for --seconds: each loops "log a batch of B records, then give feedback on one of them". Reports
requests, error rate (anything but 2xx is an error), p50/p99 latency per kind, and reconciles
at the end: every acknowledged record is in obs.inference_log exactly once.
Usage: python bench/load.py [--seconds 30] [--clients 8] [--batch 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core import auth, embedded  # noqa: E402
from app.core.db import migrate  # noqa: E402
from bench.ingest import free_port, make_records  # noqa: E402


def pct(values: list[float], p: float) -> float:
    """The p-th percentile in milliseconds."""
    if not values:
        return float("nan")
    values = sorted(values)
    return 1000 * values[min(len(values) - 1, int(p / 100 * len(values)))]


def main() -> None:
    """Run the load and print the report."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="cft-bench-load-"))
    url = embedded.start(home / "pg", tuning={"max_connections": "200", "timezone": "UTC"})
    env = os.environ | {"CFT_HOME": str(home), "CFT_DATABASE_URL": url}
    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("INSERT INTO tenant (name) VALUES ('load') RETURNING id").fetchone()
        assert row is not None
        tenant_id = int(row[0])
        key = auth.create_key(conn, tenant_id=tenant_id, role="ingest")  # type: ignore[arg-type]

    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--host"]
    cmd += ["127.0.0.1", "--port", str(port), "--workers", str(args.workers)]
    cmd += ["--log-level", "warning", "--no-access-log"]
    server = subprocess.Popen(cmd, cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{port}"
    lat: dict[str, list[float]] = {"logs": [], "feedback": []}
    errors: list[str] = []
    acked: list[str] = []
    lock = threading.Lock()
    deadline = 0.0

    def client() -> None:
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base, headers=headers, timeout=30) as http:
            while time.monotonic() < deadline:
                records = make_records(args.batch)
                for r in records:
                    r["request_id"] = str(uuid.uuid4())
                t0 = time.perf_counter()
                resp = http.post("/v1/logs", json={"records": records})
                t1 = time.perf_counter()
                ok = resp.status_code == 200
                with lock:
                    lat["logs"].append(t1 - t0)
                    if ok:
                        acked.extend(r["request_id"] for r in records)
                    else:
                        errors.append(f"logs {resp.status_code}: {resp.text[:200]}")
                if not ok:
                    continue
                rid = records[0]["request_id"]
                t0 = time.perf_counter()
                fb = http.post(f"/v1/logs/{rid}/feedback", json={"thumbs": 1})
                t1 = time.perf_counter()
                with lock:
                    lat["feedback"].append(t1 - t0)
                    if fb.status_code != 200:
                        errors.append(f"feedback {fb.status_code}: {fb.text[:200]}")

    try:
        for _ in range(300):
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        deadline = time.monotonic() + args.seconds
        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        with psycopg.connect(url) as conn:
            stored = conn.execute(
                "SELECT count(*), count(DISTINCT request_id), count(*) FILTER (WHERE fb_explicit = 1)"
                " FROM obs.inference_log WHERE tenant_id = %s",
                (tenant_id,),
            ).fetchone()
    finally:
        server.terminate()
        server.wait(timeout=30)
        embedded.stop(home / "pg", mode="fast")

    assert stored is not None
    total = len(lat["logs"]) + len(lat["feedback"])
    print(f"machine: {os.cpu_count()} cores; {args.clients} clients, {args.seconds:.0f} s,")
    print(f"  batches of {args.batch} records + one feedback per batch; {args.workers} workers")
    print(f"requests: {total} in {elapsed:.1f} s ({total / elapsed:,.0f}/s),")
    print(f"  records logged: {len(acked)} ({len(acked) / elapsed:,.0f}/s)")
    print(f"errors: {len(errors)} ({100 * len(errors) / max(total, 1):.3f} %)")
    for kind, values in lat.items():
        print(
            f"  {kind:<8} n={len(values):>6}  p50 {pct(values, 50):6.1f} ms  p99"
            f" {pct(values, 99):6.1f} ms  mean {1000 * statistics.fmean(values or [0]):6.1f} ms"
        )
    lost = len(set(acked)) - int(stored[1])
    print(f"reconciliation: {stored[0]} rows, {stored[1]} distinct ids, {len(acked)} acked,")
    print(
        f"  lost {max(lost, 0)}, duplicated {int(stored[0]) - int(stored[1])}, thumbs {stored[2]}"
    )
    for e in errors[:5]:
        print("  ", e)
    if errors or lost > 0 or stored[0] != stored[1]:
        sys.exit(1)


if __name__ == "__main__":
    main()
