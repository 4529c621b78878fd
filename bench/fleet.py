"""The fleet at 10,000 routes: cold start, calls answered by their adapter, control-plane CPU.

One run, two strategies side by side, each on a fresh database of the same embedded
PostgreSQL and fresh engine replicas:

- old: cft as of --old-ref (default b1deda0, before this bench): every canary and prod loaded
  into every engine, sequentially; a route re-read by a thread of its own each TTL;
- new: this checkout: each adapter on its rendezvous-first engine, each engine's hot set within
  its capacity loaded ahead, the rest on first call (the router asks the reconciler for it);
  SGLang's prods pinned; routes kept current by NOTIFY, re-read in batches.

The old code is exported with `git archive` into a temporary directory and runs from there.

The fleet: --routes routes (one tenant), each with a prod adapter, --canaries of them with a
canary at 10 %; --engines replicas of tests/support/engines.py's protocol-faithful fakes
(SGLang by default: --max-loaded-loras --cap, --max-loras-per-batch --per-batch; or vLLM with
--max-cpu-loras --cap; --kind vllm-lazy: new as vllm-lazy, each fake's filesystem resolver
reading the reconciler's staged folder, against old loading into vLLM), each load taking a time drawn uniformly from --latency (seconds, real
engines' range) divided by --scale (the run would take hours at real load times: the old
strategy loads routes x engines adapters one after another). Traffic: --rate calls/s for
--seconds, Zipf-distributed over the routes (exponent --zipf, random users), from this
process; at --probe-at seconds, --probe calls to routes chosen uniformly (the cold tail).

Reported per strategy: calls answered by their intended adapter (200, no fallback, the engine
says that adapter served it), overall and in the second half; silent base answers; the cold
probe's answers and latency (a cold fleet serving every adapter on its first call); loads per
minute (asked by the reconciler, and made by engines for calls: cold starts); the router's
adapter cache hit ratio (cft_router_adapter_lookups_total); adapters listed by some engine at
the end; CPU per second of the control plane (the reconciler's threads and the route table's,
measured per thread in the router process) and of the request path, over the second half; the
five hottest adapters of the second half, with the replicas that served each and the busiest
one's share (a widened adapter's calls spread over two).

Usage: python bench/fleet.py [--kind sglang|vllm|vllm-lazy] [--routes 10000] [--canaries 200]
       [--engines 4] [--cap 64] [--latency 0.5,2] [--scale 20] [--rate 100] [--seconds 90]
       [--only old|new]
BENCHMARKS.md, "The fleet at 10,000 routes", has the command and numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BASE = "smollm2-135m-instruct"
OLD_REF = "b1deda0"
# Threads of the router process by what they do (name prefixes).
GROUPS = {
    "cft-reconciler": "reconciler",
    "cft-route-": "route_table",
    "MainThread": "request_path",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_of(name: str) -> str:
    for prefix, group in GROUPS.items():
        if name.startswith(prefix):
            return group
    return "other"


# -- the engines' process ----------------------------------------------------------------------


def run_engines(args: argparse.Namespace) -> None:
    """Serve --engines fakes, one port each, in this process (one event loop)."""
    sys.path.insert(0, str(ROOT))
    import uvicorn

    from tests.support.engines import FakeSGLang, FakeVLLM

    low, high = (float(x) / args.scale for x in args.latency.split(","))
    servers = []
    for port in (int(p) for p in args.ports.split(",")):
        fake: FakeSGLang | FakeVLLM
        if args.kind == "sglang":
            fake = FakeSGLang(
                BASE,
                max_loaded_loras=args.cap,
                max_loras_per_batch=args.per_batch,
                load_latency=(low, high),
            )
        else:
            # vllm-lazy: vLLM's filesystem resolver over the reconciler's staged folder.
            resolver = Path(args.resolver_dir) if args.resolver_dir else None
            fake = FakeVLLM(
                BASE, max_cpu_loras=args.cap, load_latency=(low, high), resolver_dir=resolver
            )

        fake.app.add_api_route("/bench/stats", _stats_route(fake), methods=["GET"])
        fake.requests = _Capped(fake.requests)
        config = uvicorn.Config(fake.app, host="127.0.0.1", port=port, log_level="warning")
        servers.append(uvicorn.Server(config))

    async def serve() -> None:
        await asyncio.gather(*(s.serve() for s in servers))

    asyncio.run(serve())


def _stats_route(fake: Any) -> Any:
    """GET /bench/stats for one fake: its loads, evictions and what it holds."""

    def stats(names: int = 0) -> dict[str, Any]:
        load_paths = ("/load_lora_adapter", "/v1/load_lora_adapter")
        out = {
            "loads": fake.loads,
            "load_requests": sum(1 for p, _ in fake.requests if p in load_paths),
            "reloads": getattr(fake, "reloads", 0),
            "evictions": getattr(fake, "evictions", 0),
            "registered": len(fake.loras),
            "pinned": len(getattr(fake, "pinned", ())),
            "served": len(fake.served),
        }
        if names:
            out["names"] = list(fake.loras)
        # Calls served per adapter (SGLang's "base:adapter" named by the adapter), the most.
        served = Counter(m.partition(":")[2] or m for m in fake.served)
        out["served_top"] = dict(served.most_common(200))
        return out

    return stats


class _Capped(list[Any]):
    """A fake's request log that keeps only what the stats count (loads), not every call."""

    def append(self, item: Any) -> None:
        if "load" in item[0]:
            super().append(item)


# -- the router's process ----------------------------------------------------------------------


def thread_cpu() -> Any:
    """Count each thread group's CPU time in this process (threads that ended included); the
    function that returns the seconds by group so far, and the process's under "process"."""
    dead: dict[str, float] = defaultdict(float)
    original = threading.Thread.run

    def run(self: threading.Thread) -> None:
        try:
            original(self)
        finally:
            dead[group_of(self.name)] += time.thread_time()

    threading.Thread.run = run  # type: ignore[method-assign]
    tick = os.sysconf("SC_CLK_TCK")

    def cpu() -> dict[str, float]:
        out: dict[str, float] = defaultdict(float, dead)
        for t in threading.enumerate():
            try:
                fields = Path(f"/proc/self/task/{t.native_id}/stat").read_text().split(")")[-1]
            except OSError:
                continue
            parts = fields.split()
            out[group_of(t.name)] += (int(parts[11]) + int(parts[12])) / tick
        stat = Path("/proc/self/stat").read_text().split(")")[-1].split()
        out["process"] = (int(stat[11]) + int(stat[12])) / tick
        return dict(out)

    return cpu


def run_router(args: argparse.Namespace) -> None:
    """cft's API with its reconciler, from --tree, and a side port answering each thread
    group's CPU seconds."""
    tree = Path(args.tree).resolve()
    sys.path.insert(0, str(tree))
    os.chdir(tree)
    cpu = thread_cpu()

    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(cpu()).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    side = ThreadingHTTPServer(("127.0.0.1", args.cpu_port), Handler)
    threading.Thread(target=side.serve_forever, name="bench-cpu", daemon=True).start()

    import uvicorn

    from cft.serve import create_app

    uvicorn.run(create_app(), host="127.0.0.1", port=args.port, log_level="warning")


def run_table(args: argparse.Namespace) -> None:
    """The route table of --tree alone, every route of --db cached, then --table-rate lookups/s
    spread evenly over all of them for --table-seconds: prints its threads' CPU and reads."""
    tree = Path(args.tree).resolve()
    sys.path.insert(0, str(tree))
    os.chdir(tree)
    cpu = thread_cpu()
    import psycopg

    # Count the statements that read routes (old: one per route; new: one per batch).
    reads = [0]
    execute = psycopg.Cursor.execute

    def counted(self: Any, query: Any, *a: Any, **kw: Any) -> Any:
        if "route_state" in str(query):
            reads[0] += 1
        return execute(self, query, *a, **kw)

    psycopg.Cursor.execute = counted  # type: ignore[method-assign]
    from app.gateway.table import RouteTable

    with psycopg.connect(args.db) as c:
        keys = [(int(t), str(n)) for t, n in c.execute("SELECT tenant_id, name FROM serve.route")]
    table = RouteTable(args.db, ttl=5.0)
    table.start()
    table.listening.wait(10)
    for key in keys:
        table.get(*key)
    rng = random.Random(3)

    def lookups(seconds: float) -> tuple[int, float]:
        began = time.monotonic()
        n = int(args.table_rate * seconds)
        for i in range(n):
            delay = began + i / args.table_rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            key = keys[rng.randrange(len(keys))]
            fresh, _ = table.lookup(*key)
            if not fresh:
                table.get(*key)
        return n, time.monotonic() - began

    lookups(6.0)  # past one TTL: every route has gone stale once (the old table's steady state)
    reads_before, began_cpu = reads[0], cpu()
    n, elapsed = lookups(args.table_seconds)
    end_cpu = cpu()
    read = reads[0] - reads_before
    table.stop()
    print(
        json.dumps(
            {
                "routes": len(keys),
                "lookups_per_s": n / elapsed,
                "table_cpu": (end_cpu.get("route_table", 0) - began_cpu.get("route_table", 0))
                / elapsed,
                "lookup_cpu": (end_cpu.get("request_path", 0) - began_cpu.get("request_path", 0))
                / elapsed,
                "reads_per_s": read / elapsed,
            }
        )
    )


# -- the bench -----------------------------------------------------------------------------------


def export_tree(ref: str, dest: Path) -> Path:
    """The code of `ref` (git archive) in dest."""
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", ref, "app", "cft", "workers", "sql", "migrations"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def migrate(tree: Path, url: str) -> None:
    code = f"import sys; sys.path.insert(0, {str(tree)!r}); from app.core.db import migrate;"
    code += f" migrate({url!r})"
    subprocess.run([sys.executable, "-c", code], cwd=tree, check=True)


def seed(url: str, args: argparse.Namespace, uri: str, sha: str) -> tuple[str, list[str]]:
    """The tenant, its routes and adapters; (a client key, the route names)."""
    import psycopg
    from psycopg.rows import dict_row

    from app.core.auth import create_key

    names = [f"r{i:05d}" for i in range(args.routes)]
    step = max(1, args.routes // max(1, args.canaries))
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute(
            "INSERT INTO tenant (name, consent_training) VALUES ('fleet', true) RETURNING id"
        ).fetchone()
        assert row is not None
        tid = row[0]
        c.execute(
            "INSERT INTO serve.route (name, tenant_id, base_model)"
            " SELECT n, %s, %s FROM unnest(%s::text[]) n",
            (tid, BASE, names),
        )
        cols = "id, tenant_id, route, base_model, status, traffic_pct, method, rank, alpha,"
        cols += " weights_uri, sha256"
        c.execute(
            f"INSERT INTO serve.adapter ({cols})"
            " SELECT n || '-prod', %(t)s, n, %(b)s, 'prod', 100, 'sft', 8, 16, %(u)s, %(s)s"
            " FROM unnest(%(names)s::text[]) n",
            {"t": tid, "b": BASE, "u": uri, "s": sha, "names": names},
        )
        c.execute(
            f"INSERT INTO serve.adapter ({cols})"
            " SELECT n || '-canary', %(t)s, n, %(b)s, 'canary', 10, 'sft', 8, 16, %(u)s, %(s)s"
            " FROM unnest(%(names)s::text[]) n",
            {"t": tid, "b": BASE, "u": uri, "s": sha, "names": names[::step][: args.canaries]},
        )
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as c:
        key = create_key(c, tenant_id=tid, role="client")
    return key, names


class Proc:
    """A child process, killed (its group) at exit."""

    def __init__(self, cmd: list[str], *, env: dict[str, str] | None = None, log: Path):
        self.log = log
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)


def wait_ready(url: str, proc: Proc, timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{url}: exited; {proc.log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready in {timeout} s; {proc.log.read_text()[-2000:]}")


class Zipf:
    """Route indices by a Zipf law over a random order of the routes."""

    def __init__(self, n: int, s: float, rng: random.Random):
        self.order = list(range(n))
        rng.shuffle(self.order)
        weights = [1.0 / (k + 1) ** s for k in range(n)]
        total = 0.0
        self.cum = []
        for w in weights:
            total += w
            self.cum.append(total)
        self.total = total
        self.rng = rng

    def draw(self) -> int:
        return self.order[bisect.bisect_left(self.cum, self.rng.random() * self.total)]


async def drive(
    api: str,
    cpu_url: str,
    metrics_url: str,
    engine_urls: list[str],
    key: str,
    names: list[str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Traffic, the cold probe and the samples; what they came to."""
    import aiohttp

    rng = random.Random(7)
    zipf = Zipf(len(names), args.zipf, rng)
    headers = {"Authorization": f"Bearer {key}"}
    calls: list[dict[str, Any]] = []
    probe: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=0)
    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:

        async def call(route: str, into: list[dict[str, Any]]) -> None:
            body = {
                "model": route,
                "prompt": "Hi",
                "max_tokens": 2,
                "user": f"u{rng.randrange(10000)}",
            }
            sent = time.monotonic()
            out: dict[str, Any] = {"t": sent - started, "route": route}
            try:
                async with http.post(f"{api}/v1/completions", json=body, headers=headers) as r:
                    raw = await r.read()
                    out |= {
                        "status": r.status,
                        "adapter": r.headers.get("x-cft-adapter"),
                        "fallback": r.headers.get("x-cft-fallback"),
                    }
                    if r.status == 200:
                        text = json.loads(raw)["choices"][0]["text"]
                        out["served_by"] = text.removeprefix("served by ")
                    else:
                        out["error"] = raw[:200].decode(errors="replace")
            except (aiohttp.ClientError, TimeoutError) as exc:
                out |= {"status": 0, "error": repr(exc)}
            out["latency"] = time.monotonic() - sent
            into.append(out)

        async def stats(names: bool = False) -> list[dict[str, Any]]:
            q = "?names=1" if names else ""
            got = []
            for url in engine_urls:
                async with http.get(f"{url}/bench/stats{q}") as r:
                    got.append(await r.json())
            return got

        async def cpu() -> dict[str, float]:
            async with http.get(cpu_url) as r:
                return dict(await r.json())

        tasks: list[asyncio.Task[None]] = []
        cpu_start = await cpu()
        stats_start = await stats()

        async def traffic() -> None:
            n = int(args.rate * args.seconds)
            for i in range(n):
                delay = started + i / args.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(call(names[zipf.draw()], calls)))

        async def cold_probe() -> None:
            await asyncio.sleep(max(0.0, started + args.probe_at - time.monotonic()))
            for route in rng.sample(names, args.probe):
                tasks.append(asyncio.create_task(call(route, probe)))
                await asyncio.sleep(1 / args.probe_rate)

        half: dict[str, Any] = {}

        async def halfway() -> None:
            await asyncio.sleep(max(0.0, started + args.seconds / 2 - time.monotonic()))
            half["cpu"], half["stats"], half["t"] = await cpu(), await stats(), time.monotonic()

        await asyncio.gather(traffic(), cold_probe(), halfway())
        end_t = time.monotonic()
        cpu_end, stats_end = await cpu(), await stats(names=True)
        async with http.get(metrics_url) as r:
            metrics = await r.text()
        await asyncio.gather(*tasks)
        # The fleet idle: no calls; what the control plane costs by itself.
        await asyncio.sleep(5)
        idle0, idle_t = await cpu(), time.monotonic()
        await asyncio.sleep(args.idle)
        idle1 = await cpu()
        idle = {
            g: (idle1.get(g, 0.0) - idle0.get(g, 0.0)) / (time.monotonic() - idle_t) for g in idle1
        }
    return {
        "idle": idle,
        "calls": calls,
        "probe": probe,
        "cpu": (cpu_start, half["cpu"], cpu_end),
        "stats": (stats_start, half["stats"], stats_end),
        "window": end_t - half["t"],
        "elapsed": end_t - started,
        "lookups": lookups(metrics),
    }


def lookups(text: str) -> dict[str, float]:
    """cft_router_adapter_lookups_total by result."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("cft_router_adapter_lookups_total{"):
            result = line.split('result="')[1].split('"')[0]
            out[result] = float(line.rsplit(" ", 1)[1])
    return out


def summarise(name: str, got: dict[str, Any], args: argparse.Namespace, n: int) -> dict[str, Any]:
    calls, probe = got["calls"], got["probe"]

    def intended(c: dict[str, Any]) -> bool:
        return (
            c["status"] == 200
            and not c.get("fallback")
            and c.get("adapter") not in (None, BASE)
            and c.get("served_by") == c.get("adapter")
        )

    warm = [c for c in calls if c["t"] >= args.seconds / 2]
    statuses = Counter(c["status"] for c in calls)
    silent = sum(
        1
        for c in calls
        if c["status"] == 200 and c.get("adapter") == BASE and not c.get("fallback")
    )
    probe_lat = sorted(c["latency"] for c in probe if intended(c))
    cpu0, cpu_half, cpu1 = got["cpu"]
    st0, _st_half, st1 = got["stats"]
    window = got["window"]

    def per_s(group: str, a: dict[str, float], b: dict[str, float], secs: float) -> float:
        return (b.get(group, 0.0) - a.get(group, 0.0)) / secs

    minutes = got["elapsed"] / 60
    load_requests = sum(s["load_requests"] for s in st1) - sum(s["load_requests"] for s in st0)
    engine_loads = sum(s["loads"] for s in st1) - sum(s["loads"] for s in st0)
    listed = set().union(*(set(s["names"]) for s in st1))
    # The hottest adapters of the second half: their calls, the replicas that served them and
    # the busiest replica's share (a widened adapter's calls go to two).
    st_half = got["stats"][1]
    per_replica: dict[str, list[int]] = defaultdict(lambda: [0] * len(st1))
    for i, (a, b) in enumerate(zip(st_half, st1, strict=True)):
        for model, count in b["served_top"].items():
            if model != BASE:
                per_replica[model][i] = count - a["served_top"].get(model, 0)
    hottest = sorted(per_replica.items(), key=lambda kv: -sum(kv[1]))[:5]
    looked = got["lookups"]
    total_lookups = sum(looked.values()) or 1.0
    control = per_s("reconciler", cpu_half, cpu1, window) + per_s(
        "route_table", cpu_half, cpu1, window
    )
    return {
        "strategy": name,
        "calls": len(calls),
        "status": dict(statuses),
        "intended": sum(map(intended, calls)) / max(1, len(calls)),
        "intended_warm": sum(map(intended, warm)) / max(1, len(warm)),
        "silent_base": silent,
        "fallbacks": sum(1 for c in calls if c.get("fallback")),
        "probe_ok": sum(map(intended, probe)),
        "probe_n": len(probe),
        "probe_p50": probe_lat[len(probe_lat) // 2] if probe_lat else None,
        "probe_max": probe_lat[-1] if probe_lat else None,
        "reconciler_loads_per_min": load_requests / minutes,
        "engine_loads_per_min": engine_loads / minutes,
        "call_loads_per_min": (engine_loads - load_requests) / minutes,
        "hit_ratio": looked.get("hit", 0.0) / total_lookups,
        "listed": len(listed),
        "adapters": n,
        "reconciler_cpu": per_s("reconciler", cpu_half, cpu1, window),
        "route_table_cpu": per_s("route_table", cpu_half, cpu1, window),
        "control_cpu": control,
        "request_path_cpu": per_s("request_path", cpu_half, cpu1, window),
        "process_cpu": per_s("process", cpu_half, cpu1, window),
        "reconciler_cpu_all": per_s("reconciler", cpu0, cpu1, got["elapsed"]),
        "reconciler_cpu_total": cpu1.get("reconciler", 0.0) - cpu0.get("reconciler", 0.0),
        "cpu_per_load_ms": (
            1000 * (cpu1.get("reconciler", 0.0) - cpu0.get("reconciler", 0.0)) / load_requests
            if load_requests
            else None  # vllm-lazy: no load asked at all
        ),
        "idle_control_cpu": got["idle"].get("reconciler", 0.0)
        + got["idle"].get("route_table", 0.0),
        "idle_process_cpu": got["idle"].get("process", 0.0),
        "window": window,
        "hottest": [
            (sum(c), sum(1 for x in c if x > 0), max(c) / max(1, sum(c))) for _, c in hottest
        ],
    }


def run_strategy(
    name: str, tree: Path, pg: str, tmp: Path, args: argparse.Namespace, uri: str, sha: str
) -> dict[str, Any]:
    import psycopg

    dbname = f"fleet_{name}"
    with psycopg.connect(pg, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {dbname}")
        c.execute(f"CREATE DATABASE {dbname}")
    url = pg.replace("/postgres?", f"/{dbname}?")
    began = time.monotonic()
    migrate(tree, url)
    key, names = seed(url, args, uri, sha)
    adapters = len(names) + min(args.canaries, len(names))
    print(f"[{name}] database ready in {time.monotonic() - began:.0f} s ({adapters} adapters)")
    ports = [free_port() for _ in range(args.engines)]
    serving = tmp / f"{name}-serving"
    # The old strategy has no vllm-lazy: it loads into vLLM as it always did.
    kind = {"sglang": "sglang", "vllm": "vllm"}.get(
        args.kind, "vllm" if name == "old" else "vllm-lazy"
    )
    engines = Proc(
        [
            sys.executable,
            __file__,
            "engines",
            "--kind",
            args.kind,
            "--ports",
            ",".join(map(str, ports)),
            "--cap",
            str(args.cap),
            "--per-batch",
            str(args.per_batch),
            "--latency",
            args.latency,
            "--scale",
            str(args.scale),
            "--resolver-dir",
            str(serving) if kind == "vllm-lazy" else "",
        ],
        log=tmp / f"{name}-engines.log",
    )
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    router = None
    try:
        for u in urls:
            wait_ready(u + "/health", engines)
        port, cpu_port, metrics_port = free_port(), free_port(), free_port()
        env = os.environ | {
            "CFT_DATABASE_URL": url,
            "CFT_ENGINE_URLS": ",".join(f"{kind}+{u}" for u in urls),
            "CFT_HOME": str(tmp / f"{name}-home"),
            "CFT_SERVING_DIR": str(serving),
            "CFT_ARTEFACT_DIR": str(tmp / "store"),
            "CFT_METRICS_PORT": str(metrics_port),
            "PYTHONPATH": str(tree),
        }
        if name == "new" and args.kind == "vllm":
            env["CFT_ENGINE_ADAPTER_SLOTS"] = str(args.cap)
        router = Proc(
            [
                sys.executable,
                __file__,
                "router",
                "--tree",
                str(tree),
                "--port",
                str(port),
                "--cpu-port",
                str(cpu_port),
            ],
            env=env,
            log=tmp / f"{name}-router.log",
        )
        api = f"http://127.0.0.1:{port}"
        wait_ready(api + "/healthz", router)
        print(f"[{name}] router up; {args.rate:g} calls/s for {args.seconds:g} s")
        got = asyncio.run(
            drive(
                api,
                f"http://127.0.0.1:{cpu_port}/cpu",
                f"http://127.0.0.1:{metrics_port}/metrics",
                urls,
                key,
                names,
                args,
            )
        )
    finally:
        if router is not None:
            router.stop()
        engines.stop()
    result = summarise(name, got, args, adapters)
    if args.table_seconds > 0:
        print(f"[{name}] route table alone: {args.table_rate:g} lookups/s over every route")
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "table",
                "--tree",
                str(tree),
                "--db",
                url,
                "--table-rate",
                str(args.table_rate),
                "--table-seconds",
                str(args.table_seconds),
            ],
            env=os.environ | {"PYTHONPATH": str(tree)},
            check=True,
            capture_output=True,
            text=True,
        )
        table = json.loads(out.stdout.strip().splitlines()[-1])
        result |= {f"table_{k}": v for k, v in table.items()}
    return result


def show(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    low, high = (float(x) for x in args.latency.split(","))
    print()
    print(
        f"{args.routes} routes, {args.canaries} canaries, {args.engines} {args.kind} replicas"
        f" keeping {args.cap} adapters each, loads {low:g}-{high:g} s / {args.scale:g}"
        f" = {low / args.scale * 1000:.0f}-{high / args.scale * 1000:.0f} ms;"
        f" {args.rate:g} calls/s for {args.seconds:g} s, Zipf {args.zipf:g}"
    )
    rows: list[tuple[str, str]] = [
        ("calls (status: count)", "status"),
        ("answered by their intended adapter", "intended"),
        ("  in the second half (warm)", "intended_warm"),
        ("silent base answers", "silent_base"),
        ("answers by a fallback model (declared)", "fallbacks"),
        ("cold probe: answered by their adapter", "probe"),
        ("cold probe: latency p50 / max (s)", "probe_lat"),
        ("loads asked by the reconciler per minute", "reconciler_loads_per_min"),
        ("loads by engines for calls per minute", "call_loads_per_min"),
        ("router adapter cache hit ratio", "hit_ratio"),
        ("adapters listed by some engine at the end", "listed"),
        ("reconciler CPU s/s (second half)", "reconciler_cpu"),
        ("route table CPU s/s (second half)", "route_table_cpu"),
        ("control plane CPU s/s (both)", "control_cpu"),
        ("request path CPU s/s (event loop)", "request_path_cpu"),
        ("router process CPU s/s", "process_cpu"),
        ("reconciler CPU per load asked (ms)", "cpu_per_load_ms"),
        ("reconciler CPU over the whole run (s)", "reconciler_cpu_total"),
        ("5 hottest adapters: calls in the second half", "hottest_calls"),
        ("  replicas that served each (busiest one's share)", "hottest_spread"),
        ("idle: control plane CPU s/s", "idle_control_cpu"),
        ("idle: router process CPU s/s", "idle_process_cpu"),
        ("route table alone: lookups/s over every route", "table_lookups_per_s"),
        ("route table alone: route reads (queries)/s", "table_reads_per_s"),
        ("route table alone: its threads' CPU s/s", "table_table_cpu"),
    ]

    def cell(r: dict[str, Any], key: str) -> str:
        if key in ("hottest_calls", "hottest_spread"):
            if not r.get("hottest"):
                return "-"
            if key == "hottest_calls":
                return ", ".join(f"{n:,}" for n, _, _ in r["hottest"])
            return ", ".join(f"{k} ({share * 100:.0f} %)" for _, k, share in r["hottest"])
        if key not in r and key not in ("probe", "probe_lat"):
            return "-"
        if key == "status":
            return ", ".join(f"{k}: {v}" for k, v in sorted(r["status"].items()))
        if key == "probe":
            return f"{r['probe_ok']} / {r['probe_n']}"
        if key == "probe_lat":
            if r["probe_p50"] is None:
                return "-"
            return f"{r['probe_p50']:.2f} / {r['probe_max']:.2f}"
        if key == "listed":
            return f"{r['listed']} / {r['adapters']}"
        value = r[key]
        if value is None:
            return "-"
        if key == "table_table_cpu":
            return f"{value:.3f}"
        if key in ("intended", "intended_warm", "hit_ratio"):
            return f"{value * 100:.2f} %"
        if isinstance(value, float):
            if key.endswith("_ms"):
                return f"{value:.2f}"
            return f"{value:.3f}" if "cpu" in key else f"{value:.0f}"
        return str(value)

    width = max(len(label) for label, _ in rows)
    print(f"| {'':{width}} | " + " | ".join(r["strategy"] for r in results) + " |")
    print(f"|{'-' * (width + 2)}|" + "|".join("---" for _ in results) + "|")
    for label, key in rows:
        print(f"| {label:{width}} | " + " | ".join(cell(r, key) for r in results) + " |")
    if len(results) == 2 and results[0]["control_cpu"] > 0:
        ratio = results[1]["control_cpu"] / results[0]["control_cpu"]
        print(f"\ncontrol plane CPU under traffic, new / old: {ratio:.3f}")
    if len(results) == 2 and results[0]["idle_control_cpu"] > 0:
        ratio = results[1]["idle_control_cpu"] / results[0]["idle_control_cpu"]
        print(f"control plane CPU idle, new / old: {ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "role", nargs="?", default="bench", choices=["bench", "engines", "router", "table"]
    )
    parser.add_argument("--kind", choices=["sglang", "vllm", "vllm-lazy"], default="sglang")
    parser.add_argument("--routes", type=int, default=10_000)
    parser.add_argument("--canaries", type=int, default=200)
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--cap", type=int, default=64)
    parser.add_argument("--per-batch", type=int, default=8)
    parser.add_argument("--latency", default="0.5,2")
    parser.add_argument("--scale", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--probe", type=int, default=100)
    parser.add_argument("--probe-at", type=float, default=5.0)
    parser.add_argument("--probe-rate", type=float, default=10.0)
    parser.add_argument("--only", choices=["old", "new"])
    parser.add_argument("--old-ref", default=OLD_REF)
    parser.add_argument("--json", type=Path, help="write the results here too")
    # Internal: the children's arguments.
    parser.add_argument("--ports", default="")
    parser.add_argument("--resolver-dir", default="")
    parser.add_argument("--tree", default="")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cpu-port", type=int, default=0)
    parser.add_argument("--db", default="")
    parser.add_argument("--table-rate", type=float, default=2000.0)
    parser.add_argument("--table-seconds", type=float, default=20.0)
    args = parser.parse_args()
    if args.role == "engines":
        run_engines(args)
        return
    if args.role == "router":
        run_router(args)
        return
    if args.role == "table":
        run_table(args)
        return

    sys.path.insert(0, str(ROOT))
    from app.core import embedded
    from app.core.artefacts import LocalStore
    from tests.support.engines import write_adapter

    tmp = Path(tempfile.mkdtemp(prefix="cft-bench-fleet-"))
    pgdata = tmp / "pg"
    pg = embedded.start(pgdata)
    try:
        src = write_adapter(tmp / "src", rank=8, layers=1, modules=("q_proj",))
        stored = LocalStore(tmp / "store").put_dir(src, "fleet", "v1")
        results = []
        for name in ("old", "new"):
            if args.only and args.only != name:
                continue
            tree = ROOT if name == "new" else export_tree(args.old_ref, tmp / "old-tree")
            results.append(run_strategy(name, tree, pg, tmp, args, stored.uri, stored.sha256))
        show(results, args)
        if args.json:
            args.json.write_text(
                json.dumps({"args": vars(args) | {"json": None}, "results": results}, default=str)
            )
    finally:
        embedded.stop(pgdata, mode="immediate")
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
