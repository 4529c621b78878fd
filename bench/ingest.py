"""Ingestion throughput: raw psycopg COPY into obs.inference_log vs POST /v1/logs over HTTP.

One run, one fresh embedded PostgreSQL, the same N records both ways:
  1. raw: one psycopg COPY ... FROM STDIN into obs.inference_log as the owner (the physical
     limit: no validation, no RLS, no HTTP);
  2. api: `cft`'s API under uvicorn (a subprocess, --workers W) and C concurrent httpx
     clients posting {"records": [...]} batches of B records (serialised with orjson).
The two alternate for --rounds rounds (raw, api, raw, api, ...; the shared 2-core machine's load
drifts from minute to minute, so each ratio compares neighbours in time). Prints each round's
rates, the medians and api/raw. Usage: python bench/ingest.py [--n 100000] [--batch 500]
[--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core import auth, embedded  # noqa: E402
from app.core.db import migrate  # noqa: E402


def make_records(n: int) -> list[dict[str, Any]]:
    """N small, realistic log records (a question, an answer, counters, a user)."""
    return [
        {
            "request_id": str(uuid.uuid4()),
            "route": "support-es",
            "adapter_id": "support-es-v3",
            "model": "smollm2-135m-instruct",
            "variant": "A",
            "messages": [
                {"role": "system", "content": "Eres un asistente de soporte."},
                {"role": "user", "content": f"¿Cómo cambio la contraseña de la cuenta {i % 97}?"},
            ],
            "completion": "Ve a Ajustes > Seguridad > Contraseña y sigue los pasos.",
            "ttft_ms": 80 + i % 50,
            "tokens_in": 24,
            "tokens_out": 14,
            "user": f"user-{i % 5000}",
        }
        for i in range(n)
    ]


def raw_copy(url: str, tenant_id: int, records: list[dict[str, Any]]) -> float:
    """Seconds to COPY the records straight into obs.inference_log."""
    cols = (
        "request_id, tenant_id, user_hash, route, adapter_id, model, variant, messages,"
        " completion, ttft_ms, tokens_in, tokens_out"
    )
    rows = [
        (
            r["request_id"],
            tenant_id,
            r["user"].encode(),
            r["route"],
            r["adapter_id"],
            r["model"],
            r["variant"],
            orjson.dumps(r["messages"]).decode(),
            r["completion"],
            r["ttft_ms"],
            r["tokens_in"],
            r["tokens_out"],
        )
        for r in records
    ]
    with psycopg.connect(url) as conn:
        start = time.perf_counter()
        with conn.cursor() as cur, cur.copy(f"COPY obs.inference_log ({cols}) FROM STDIN") as cp:
            for row in rows:
                cp.write_row(row)
        conn.commit()
        return time.perf_counter() - start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api_ingest(
    base: str, key: str, records: list[dict[str, Any]], batch: int, clients: int
) -> float:
    """Seconds for `clients` threads to POST all records in batches."""
    batches = [records[i : i + batch] for i in range(0, len(records), batch)]
    lock = threading.Lock()
    errors: list[str] = []

    def worker() -> None:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}) as c:
            while True:
                with lock:
                    if not batches:
                        return
                    b = batches.pop()
                r = c.post(
                    "/v1/logs",
                    content=orjson.dumps({"records": b}),
                    headers={"Content-Type": "application/json"},
                    timeout=60,
                )
                if r.status_code != 200 or r.json()["inserted"] != len(b):
                    errors.append(r.text[:300])
                    return

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise SystemExit(f"API errors: {errors[0]}")
    return elapsed


def main() -> None:
    """Run both measurements and print the ratio."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    ap.add_argument("--rounds", type=int, default=3, help="raw/api pairs, alternating")
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="cft-bench-ingest-"))
    url = embedded.start(home / "pg", tuning={"max_connections": "200", "timezone": "UTC"})
    env = os.environ | {"CFT_HOME": str(home), "CFT_DATABASE_URL": url}
    os.environ.update({"CFT_HOME": str(home)})
    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        tid = conn.execute("INSERT INTO tenant (name) VALUES ('bench') RETURNING id").fetchone()
        assert tid is not None
        tenant_id = int(tid[0])
        key = auth.create_key(conn, tenant_id=tenant_id, role="ingest")  # type: ignore[arg-type]

    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "app.main:create_app",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(args.workers),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        cwd=ROOT,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    rounds: list[tuple[float, float]] = []
    try:
        for _ in range(300):
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        raw_copy(url, tenant_id, make_records(2_000))  # warm-up, both ways
        api_ingest(base, key, make_records(4 * args.batch), args.batch, args.clients)
        for r in range(args.rounds):
            raw_rate = args.n / raw_copy(url, tenant_id, make_records(args.n))
            api_rate = args.n / api_ingest(
                base, key, make_records(args.n), args.batch, args.clients
            )
            rounds.append((raw_rate, api_rate))
            print(
                f"round {r + 1}: raw {raw_rate:>9,.0f} rows/s, api {api_rate:>9,.0f} rows/s,"
                f" api/raw {api_rate / raw_rate:.0%}",
                flush=True,
            )
    finally:
        server.terminate()
        server.wait(timeout=30)
        embedded.stop(home / "pg", mode="fast")

    raw_med = statistics.median(r[0] for r in rounds)
    api_med = statistics.median(r[1] for r in rounds)
    ratio_med = statistics.median(r[1] / r[0] for r in rounds)
    print(f"machine: {os.cpu_count()} cores; N = {args.n} records per round, {args.rounds} rounds")
    print(f"raw COPY into obs.inference_log : {raw_med:>9,.0f} rows/s (median)")
    print(
        f"POST /v1/logs, batches of {args.batch}, {args.clients} clients, "
        f"{args.workers} workers: {api_med:>9,.0f} rows/s (median)"
    )
    print(
        f"api / raw = {api_med / raw_med:.0%} of medians, {ratio_med:.0%} median of rounds"
        " (target >= 75%)"
    )


if __name__ == "__main__":
    main()
