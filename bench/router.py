"""Router overhead: latency added by cft's gateway over calling the backend directly.

One run: a fresh embedded PostgreSQL, a fast stub OpenAI backend (bench infrastructure: a raw
ASGI app under uvicorn that answers a fixed completion at once), and cft's API under uvicorn
with CFT_ENGINE_URLS pointing at the stub. C concurrent clients (httpx, keep-alive) send the
same non-streaming /v1/chat/completions either straight to the stub or through the router
(route -> prod adapter, key auth, sticky split, proxy, log record queued and written to
PostgreSQL). Added latency = percentile(router) - percentile(direct), at C = 1, 50, 200.
Usage: python bench/router.py [--seconds 5] [--clients 1,50,200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core import auth, embedded  # noqa: E402
from app.core.db import migrate  # noqa: E402

BASE = "smollm2-135m-instruct"
N_ADAPTERS = 300  # names the stub reports as loaded: bench-v0 .. bench-v299


def stub_app(models: list[str]) -> Any:
    """A raw ASGI OpenAI backend that answers immediately (no framework in the way)."""
    completion = orjson.dumps(
        {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": 0,
            "model": BASE,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hola, ¿en qué te ayudo?"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
        }
    )
    listing = orjson.dumps(
        {"object": "list", "data": [{"id": m, "object": "model"} for m in models]}
    )

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        path = scope["path"]
        body = (
            listing if path == "/v1/models" else completion if path.startswith("/v1/c") else b"ok"
        )
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


class Stack:
    """Embedded PostgreSQL + stub backend + cft router, each in its own process."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="cft-bench-router-"))
        self.pgdata = self.tmp / "pg"
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Stack:
        self.db = embedded.start(self.pgdata)
        migrate(self.db)
        with psycopg.connect(self.db, autocommit=True) as c:
            tid = c.execute("INSERT INTO tenant (name) VALUES ('bench') RETURNING id").fetchone()[0]
            c.execute(
                "INSERT INTO serve.route (name, tenant_id, base_model) VALUES ('support-es', %s, %s)",
                (tid, BASE),
            )
            c.execute(
                "INSERT INTO serve.adapter (id, tenant_id, route, base_model, status, traffic_pct)"
                " VALUES ('bench-v0', %s, 'support-es', %s, 'prod', 100)",
                (tid, BASE),
            )
            c.execute(
                "INSERT INTO train.promotion_policy (route, suite_id, metric, direction)"
                " VALUES ('support-es', 'tasks', 'accuracy', 'higher')"
            )
            c.execute(
                "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
                " VALUES ('bench-v0', 'tasks', 'accuracy', 0.5)"
            )
            self.key = auth.create_key(c, tenant_id=tid, role="client")
            self.tenant_id = tid
        self.stub_port, self.api_port = free_port(), free_port()
        models = ",".join([BASE] + [f"bench-v{i}" for i in range(N_ADAPTERS)])
        self.procs.append(
            subprocess.Popen([sys.executable, __file__, "--stub", str(self.stub_port), models])
        )
        self.stub = f"http://127.0.0.1:{self.stub_port}"
        wait_ready(self.stub + "/v1/models")
        env = os.environ | {
            "CFT_DATABASE_URL": self.db,
            "CFT_ENGINE_URLS": self.stub,
            "CFT_HOME": str(self.tmp / "home"),
        }
        self.procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "app.main:create_app",
                    "--factory",
                    "--port",
                    str(self.api_port),
                    "--log-level",
                    "warning",
                    "--no-access-log",
                    "--loop",
                    "uvloop",
                    "--http",
                    "httptools",
                ],
                env=env,
                cwd=ROOT,
            )
        )
        self.api = f"http://127.0.0.1:{self.api_port}"
        wait_ready(self.api + "/healthz")
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(timeout=20)
        embedded.stop(self.pgdata, mode="immediate")


BODY = orjson.dumps(
    {
        "model": "support-es",
        "messages": [{"role": "user", "content": "¿Cómo cambio mi contraseña?"}],
        "max_tokens": 16,
        "user": "bench-user",
    }
)


async def load(url: str, headers: dict[str, str], clients: int, seconds: float) -> list[float]:
    """Latencies (s) of C clients each sending requests back to back for `seconds`."""
    lat: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        stop = time.perf_counter() + seconds

        async def worker(i: int) -> None:
            h = headers | {"content-type": "application/json", "x-cft-user": f"u{i}"}
            while time.perf_counter() < stop:
                t = time.perf_counter()
                r = await client.post(url, content=BODY, headers=h)
                lat.append(time.perf_counter() - t)
                if r.status_code != 200:
                    raise RuntimeError(f"{url}: {r.status_code} {r.text[:200]}")

        await asyncio.gather(*(worker(i) for i in range(clients)))
    return lat


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] * 1000


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--stub":
        import uvicorn

        uvicorn.run(
            stub_app(sys.argv[3].split(",")),
            host="127.0.0.1",
            port=int(sys.argv[2]),
            log_level="warning",
            access_log=False,
            loop="uvloop",
            http="httptools",
        )
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", default="1,50,200")
    args = ap.parse_args()
    with Stack() as st:
        auth_h = {"authorization": f"Bearer {st.key}"}
        # Warm up both paths (connections, route cache, key cache).
        asyncio.run(load(st.api + "/v1/chat/completions", auth_h, 4, 1.0))
        print(f"router bench: stub backend, {args.seconds:.0f} s per run, {os.cpu_count()} CPUs")
        print(
            f"{'clients':>7} | {'direct p50':>10} {'p99':>7} {'req/s':>7} | "
            f"{'router p50':>10} {'p99':>7} {'req/s':>7} | {'added p50':>9} {'p99':>7}"
        )
        for c in [int(x) for x in args.clients.split(",")]:
            d = asyncio.run(load(st.stub + "/v1/chat/completions", {}, c, args.seconds))
            r = asyncio.run(load(st.api + "/v1/chat/completions", auth_h, c, args.seconds))
            print(
                f"{c:>7} | {pct(d, 50):>8.2f}ms {pct(d, 99):>5.2f}ms {len(d) / args.seconds:>7.0f} | "
                f"{pct(r, 50):>8.2f}ms {pct(r, 99):>5.2f}ms {len(r) / args.seconds:>7.0f} | "
                f"{pct(r, 50) - pct(d, 50):>7.2f}ms {pct(r, 99) - pct(d, 99):>5.2f}ms"
            )
        time.sleep(1.0)
        with psycopg.connect(st.db) as c:
            n = c.execute("SELECT count(*) FROM obs.inference_log").fetchone()
        print(f"log rows written by the router: {n[0] if n else 0}")


if __name__ == "__main__":
    main()
