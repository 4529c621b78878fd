"""The dedup pipeline next to ingest, in one run: POST /v1/logs rows/s, the embedder's rows/s
(the bundled all-MiniLM-L6-v2 on CPU, and an OpenAI-compatible /v1/embeddings endpoint), and the
neighbour search's rows/s (obs.compute_prompt_neighbours from 1 and from --sessions sessions).

    .venv/bin/python bench/dedup.py                  # 20,000 rows ingested
    .venv/bin/python bench/dedup.py --rows 100000 --model-rows 2000 --endpoint-rows 20000

One fresh embedded PostgreSQL. The rows are ingested through the API without embeddings (as a
product logs them); the embedder then embeds --model-rows of them with the bundled model and
--endpoint-rows through an endpoint. The endpoint is a local stub (a deterministic vector per
text, built in Python in this process), so its figure is the embedder without a model: the HTTP
round trip, the database writes and the HNSW inserts (and the stub's own CPU on the same cores). Every embedded row is queued for the neighbour
search; the first half of the queue is searched from one session, the rest from --sessions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
# Not bench/ itself on the path: bench/datasets.py would hide the `datasets` package that
# sentence-transformers imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from app.core import auth, embedded  # noqa: E402
from app.core.config import Settings  # noqa: E402
from app.core.db import connect, migrate  # noqa: E402
from bench.ingest import api_ingest, free_port  # noqa: E402
from workers.embedder.metrics import backlog  # noqa: E402
from workers.embedder.model import load_encoder  # noqa: E402
from workers.embedder.service import embed_pending, link_batch, link_parallel  # noqa: E402

TOPICS = ["password", "invoice", "refund", "shipping", "account", "plan", "email", "card"]
ASKS = [
    "How do I change my {t}?",
    "How can I update my {t}?",
    "I need help with my {t}, order {n}",
    "Where do I find the {t} settings for store {n}?",
    "My {t} does not work since update {n}",
]


def make_records(n: int) -> list[dict[str, Any]]:
    """Support questions: templates x topics x numbers, so some prompts are paraphrases."""
    return [
        {
            "request_id": str(uuid.uuid4()),
            "route": "support",
            "messages": [
                {"role": "system", "content": "You are a support assistant."},
                {
                    "role": "user",
                    "content": ASKS[i % len(ASKS)].format(
                        t=TOPICS[(i // 5) % len(TOPICS)], n=(i * 7919) % max(n // 3, 1)
                    ),
                },
            ],
            "completion": "Go to Settings and follow the steps.",
            "tokens_out": 8,
            "user": f"user-{i % 5000}",
        }
        for i in range(n)
    ]


class _StubEmbeddings(BaseHTTPRequestHandler):
    dim = 384

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = []
        for i, text in enumerate(body["input"]):
            seed = hashlib.sha256(text.encode()).digest()
            raw = [(seed[(j * 7) % 32] ^ j) / 255 - 0.5 for j in range(self.dim)]
            norm = sum(x * x for x in raw) ** 0.5
            data.append({"index": i, "embedding": [x / norm for x in raw]})
        out = json.dumps({"data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


def main() -> int:
    """Run the pipeline stages and print their rates side by side."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000, help="rows ingested through the API")
    ap.add_argument("--model-rows", type=int, default=1_000, help="rows embedded by the model")
    ap.add_argument("--endpoint-rows", type=int, default=5_000, help="rows via the endpoint")
    ap.add_argument("--sessions", type=int, default=2, help="parallel neighbour-search sessions")
    ap.add_argument("--batch", type=int, default=256, help="embedder batch size")
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="cft-bench-dedup-"))
    url = embedded.start(home / "pg", tuning={"max_connections": "100", "timezone": "UTC"})
    env = os.environ | {"CFT_HOME": str(home), "CFT_DATABASE_URL": url}
    os.environ["CFT_HOME"] = str(home)
    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        tid = conn.execute("INSERT INTO tenant (name) VALUES ('bench') RETURNING id").fetchone()
        assert tid is not None
        key = auth.create_key(conn, tenant_id=int(tid[0]), role="ingest")  # type: ignore[arg-type]
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--host",
         "127.0.0.1", "--port", str(port), "--workers", "2", "--log-level", "warning",
         "--no-access-log"],
        cwd=ROOT,
        env=env,
    )  # fmt: skip
    stub = ThreadingHTTPServer(("127.0.0.1", 0), _StubEmbeddings)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    rates: dict[str, tuple[int, float]] = {}
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        api_ingest(base, key, make_records(1_000), 500, 4)  # warm-up (embedded below too)
        rates["ingest: POST /v1/logs (batches of 500, 4 clients)"] = (
            args.rows,
            api_ingest(base, key, make_records(args.rows), 500, 4),
        )
        server.terminate()
        server.wait(timeout=30)

        model = load_encoder(Settings(home=home))
        model(["warm-up"])
        endpoint = load_encoder(
            Settings(home=home, embedding_url=f"http://127.0.0.1:{stub.server_port}")
        )
        with connect(url, autocommit=True) as conn:
            for label, enc, n in (
                ("embed: bundled all-MiniLM-L6-v2 (CPU)", model, args.model_rows),
                ("embed: /v1/embeddings endpoint (local stub)", endpoint, args.endpoint_rows),
            ):
                t = time.perf_counter()
                done = embed_pending(conn, enc, batch_size=args.batch, limit=n)
                rates[label] = (done, time.perf_counter() - t)
            queued = int(backlog(conn)["neighbours_rows"])
            t = time.perf_counter()
            one = 0
            while one < queued // 2:
                m = link_batch(conn, radius=0.2, neighbours=10, batch_size=args.batch)
                if not m:
                    break
                one += m
            rates["neighbour search: 1 session"] = (one, time.perf_counter() - t)
            t = time.perf_counter()
            rest = link_parallel(
                url, radius=0.2, neighbours=10, sessions=args.sessions, batch_size=args.batch
            )
            rates[f"neighbour search: {args.sessions} sessions"] = (rest, time.perf_counter() - t)
            left = backlog(conn)
            edges = conn.execute("SELECT count(*) AS n FROM obs.prompt_neighbour").fetchone()
            assert edges is not None
    finally:
        stub.shutdown()
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=30)
        embedded.stop(home / "pg", mode="fast")

    ingest_rate = args.rows / rates["ingest: POST /v1/logs (batches of 500, 4 clients)"][1]
    print(f"machine: {os.cpu_count()} cores; log rows in the table: {args.rows + 1_000}")
    print(f"{'stage':52} {'rows':>7} {'s':>7} {'rows/s':>8} {'/ ingest':>8}")
    for label, (n, s) in rates.items():
        rate = n / s if s else 0.0
        print(f"{label:52} {n:>7} {s:>7.1f} {rate:>8,.0f} {rate / ingest_rate:>8.2f}")
    print(
        f"edges stored: {edges['n']}; backlog left: {left['embedding_rows']:.0f} rows to embed,"
        f" {left['neighbours_rows']:.0f} to search (the gauges cft_embedder_backlog_rows)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
