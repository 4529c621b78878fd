"""Router overhead: latency added by cft's gateway over calling the backend directly.

One run: a fresh embedded PostgreSQL, a fast stub OpenAI backend (bench infrastructure: a raw
ASGI app under uvicorn that answers a fixed completion at once), and cft's API under uvicorn
(one process, uvloop + httptools) with CFT_ENGINE_URLS pointing at the stub. The same
non-streaming /v1/chat/completions goes either straight to the stub ("direct") or through the
router (key auth from cache, route -> prod adapter, sticky split, proxy, log record queued and
written to PostgreSQL), from the same load generator in the same run, alternating direct and
router slices so that drift on a shared machine hits both alike.

The load generator is this process: raw asyncio protocols on uvloop, one keep-alive HTTP/1.1
connection per client, requests pre-encoded, responses parsed with httptools (tens of µs per
request, so it does not starve the servers). With --pin (default on a machine with 2+ CPUs)
it runs on the last CPU and the stub and router on the others.

Two measurements per concurrency C:
- open loop: C clients each send at a fixed rate (the offered load is fixed and below
  saturation), latency measured per request from its send (or from its scheduled time when
  the client's previous request was still running, so queueing is not hidden);
- closed loop: C clients send back to back; gives the maximum requests/s.
Added latency = percentile(router) - percentile(direct).

With --litellm a third side joins the same alternating slices: LiteLLM's proxy
(`litellm --config cfg.yaml --num_workers 1`, master key, no database, `model_list` pointing at
the same stub), installed by this bench into its own virtual environment under bench/.peers/
(git-ignored; `pip install 'litellm[proxy]'`, ~2 min the first time, never into cft's deps).
Its CPU per call is the CPU time of its whole process tree. LiteLLM saturates near 35 req/s
on 2 cores: at higher offered loads a client stops at the end of its slice, the sends it had
no time for are counted as "unsent", and latency (from the scheduled time) shows the queue.

Usage: python bench/router.py [--seconds 10] [--slices 4] [--open 1x100,50x10,200x2.5]
       [--closed 1,50,200] [--no-pin] [--client-costs] [--litellm]
(--client-costs also times one call of httpx, aiohttp and the raw protocol against the stub.)
BENCHMARKS.md, "Router against LiteLLM (issue 26)", ran:
    python bench/router.py --litellm --open 1x10,3x10,50x10 --closed ''
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools
import httpx
import orjson
import psycopg
import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core import auth, embedded  # noqa: E402
from app.core.db import migrate  # noqa: E402

BASE = "smollm2-135m-instruct"
PEERS = ROOT / "bench" / ".peers"
LITELLM_VENV = PEERS / "litellm-venv"
LITELLM_KEY = "sk-bench-litellm-master"
N_ADAPTERS = 300  # names the stub reports as loaded: bench-v0 .. bench-v299
PATH = "/v1/chat/completions"


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
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
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


def uvicorn_cmd(port: int, *target: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "uvicorn",
        *target,
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
        "--loop",
        "uvloop",
        "--http",
        "httptools",
    ]


def litellm_bin() -> Path:
    """LiteLLM's CLI in its own venv under bench/.peers/ (installed on first use)."""
    exe = LITELLM_VENV / "bin" / "litellm"
    if exe.exists():
        return exe
    print(f"installing litellm[proxy] into {LITELLM_VENV} (once, ~2 min)", flush=True)
    PEERS.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
    pip = [str(LITELLM_VENV / "bin" / "pip"), "install", "-q", "litellm[proxy]"]
    subprocess.run(pip, check=True)
    return exe


def litellm_version() -> str:
    out = subprocess.run(
        [
            str(LITELLM_VENV / "bin" / "python"),
            "-c",
            "import importlib.metadata as m;print(m.version('litellm'))",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "?"


class Stack:
    """Embedded PostgreSQL + stub backend + cft router (+ LiteLLM), each in its own process."""

    def __init__(self, server_cpus: set[int] | None = None, *, litellm: bool = False) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="cft-bench-router-"))
        self.pgdata = self.tmp / "pg"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.server_cpus = server_cpus
        self.litellm = litellm
        self.litellm_proc: subprocess.Popen[bytes] | None = None
        self.litellm_port = 0

    def _spawn(self, cmd: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(cmd, **kw)
        if self.server_cpus:
            os.sched_setaffinity(proc.pid, self.server_cpus)
        self.procs.append(proc)
        return proc

    def __enter__(self) -> Stack:
        try:
            self._start()
        except BaseException:
            # A server that did not come up must not leave the others running (the stub's
            # stdout would hold the caller's pipe open, PostgreSQL would keep its cores).
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
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
                "INSERT INTO train.promotion_policy (tenant_id, route, suite_id, metric, direction)"
                " VALUES (%s, 'support-es', 'tasks', 'accuracy', 'higher')",
                (tid,),
            )
            c.execute(
                "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
                " VALUES ('bench-v0', 'tasks', 'accuracy', 0.5)"
            )
            self.key = auth.create_key(c, tenant_id=tid, role="client")
            self.tenant_id = tid
        self.stub_port, self.api_port = free_port(), free_port()
        models = ",".join([BASE] + [f"bench-v{i}" for i in range(N_ADAPTERS)])
        self.stub_proc = self._spawn(
            [sys.executable, __file__, "--stub", str(self.stub_port), models]
        )
        self.stub = f"http://127.0.0.1:{self.stub_port}"
        wait_ready(self.stub + "/v1/models")
        env = os.environ | {
            "CFT_DATABASE_URL": self.db,
            "CFT_ENGINE_URLS": self.stub,
            "CFT_HOME": str(self.tmp / "home"),
        }
        self.api_proc = self._spawn(
            uvicorn_cmd(self.api_port, "cft.serve:create_app", "--factory"), env=env, cwd=ROOT
        )
        self.api = f"http://127.0.0.1:{self.api_port}"
        wait_ready(self.api + "/healthz")
        if self.litellm:
            self._start_litellm()

    def _start_litellm(self) -> None:
        exe = litellm_bin()
        self.litellm_port = free_port()
        cfg = self.tmp / "litellm.yaml"
        cfg.write_text(
            "model_list:\n"
            "  - model_name: support-es\n"
            "    litellm_params:\n"
            f"      model: openai/{BASE}\n"
            f"      api_base: {self.stub}/v1\n"
            "      api_key: sk-stub\n"
            "litellm_settings:\n"
            "  telemetry: false\n"
            "general_settings:\n"
            f"  master_key: {LITELLM_KEY}\n"
        )
        env = os.environ | {"LITELLM_LOG": "ERROR", "NO_DOCS": "True"}
        env.pop("DATABASE_URL", None)
        log = (self.tmp / "litellm.log").open("wb")
        self.litellm_proc = self._spawn(
            [
                str(exe),
                "--config",
                str(cfg),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.litellm_port),
                "--num_workers",
                "1",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.tmp,
        )
        try:
            wait_ready(f"http://127.0.0.1:{self.litellm_port}/health/liveliness", timeout=180)
        except RuntimeError:
            print((self.tmp / "litellm.log").read_text()[-3000:], file=sys.stderr)
            raise

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


def raw_request(port: int, headers: dict[str, str], body: bytes = BODY) -> bytes:
    """One pre-encoded keep-alive POST of the chat body."""
    lines = [f"POST {PATH} HTTP/1.1", f"host: 127.0.0.1:{port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += ["content-type: application/json", f"content-length: {len(body)}", "", ""]
    return "\r\n".join(lines).encode() + body


class Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 client connection (one request in flight at a time)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(self.parser.get_status_code())

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection lost: {exc}"))

    def request(self, raw: bytes) -> asyncio.Future[int]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return self.waiter


TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads) and its live children so far."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            todo += [int(c) for c in task.read_text().split()]
    return total


@dataclass
class Result:
    lat: list[float] = field(default_factory=list)
    seconds: float = 0.0
    late: int = 0  # sends that left more than 1 ms after their scheduled time
    cpu: float = 0.0  # CPU seconds the measured server process used meanwhile
    unsent: int = 0  # scheduled sends still waiting for the previous answer at the end
    errors: int = 0  # answers other than 200

    def add(self, other: Result) -> None:
        self.lat += other.lat
        self.seconds += other.seconds
        self.late += other.late
        self.cpu += other.cpu
        self.unsent += other.unsent
        self.errors += other.errors

    @property
    def cpu_us(self) -> float:
        return self.cpu / len(self.lat) * 1e6 if self.lat else 0.0

    @property
    def rps(self) -> float:
        return len(self.lat) / self.seconds if self.seconds else 0.0


async def connect(port: int, n: int) -> list[Conn]:
    loop = asyncio.get_running_loop()
    conns = []
    for _ in range(n):
        _, proto = await loop.create_connection(Conn, "127.0.0.1", port)
        proto.transport.get_extra_info("socket").setsockopt(  # type: ignore[union-attr]
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
        )
        conns.append(proto)
    return conns


async def run_load(
    port: int, reqs: list[bytes], seconds: float, rate: float | None, pid: int | None = None
) -> Result:
    """C clients for `seconds`: each at `rate` req/s (open loop), or back to back (None).

    Connections are opened before the clock starts (servers close idle keep-alives after 5 s).
    """
    conns = await connect(port, len(reqs))
    clock = time.perf_counter
    res = Result()
    start = clock() + 0.05
    stop = start + seconds
    cpu0 = cpu_seconds(pid) if pid else 0.0

    async def client(conn: Conn, raw: bytes) -> None:
        if rate is None:
            await asyncio.sleep(start - clock())
            while clock() < stop:
                t = clock()
                status = await conn.request(raw)
                res.lat.append(clock() - t)
                if status != 200:
                    res.errors += 1
            return
        interval = 1.0 / rate
        due = start + random.uniform(0, interval)
        done = 0.0
        while due < stop:
            if clock() >= stop:  # a saturated server: what is still due was never sent
                res.unsent += int((stop - due) * rate) + 1
                break
            wait = due - clock()
            if wait > 0:
                await asyncio.sleep(wait)
            t = clock()
            if t - due > 0.001:
                res.late += 1
            status = await conn.request(raw)
            # The previous answer came after this one was due: count the wait for it too.
            sent = due if done > due else t
            done = clock()
            res.lat.append(done - sent)
            if status != 200:
                res.errors += 1
            due += interval

    await asyncio.gather(*(client(c, r) for c, r in zip(conns, reqs, strict=True)))
    res.seconds = clock() - start
    res.cpu = cpu_seconds(pid) - cpu0 if pid else 0.0
    for conn in conns:
        assert conn.transport is not None
        conn.transport.close()
    return res


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] * 1000


def load_str() -> str:
    return "load avg " + " ".join(f"{x:.2f}" for x in os.getloadavg())


async def bench(st: Stack, args: argparse.Namespace) -> None:
    auth_h = {"authorization": f"Bearer {st.key}"}
    open_loads = [(int(c), float(r)) for c, r in (x.split("x") for x in args.open.split(","))]
    closed = [int(x) for x in args.closed.split(",")] if args.closed else []
    most = max([c for c, _ in open_loads] + closed)
    sides: list[tuple[str, int, dict[str, str], int]] = [
        ("direct", st.stub_port, {}, st.stub_proc.pid),
        ("router", st.api_port, auth_h, st.api_proc.pid),
    ]
    if st.litellm_proc is not None:
        lite_h = {"authorization": f"Bearer {LITELLM_KEY}"}
        sides.append(("litellm", st.litellm_port, lite_h, st.litellm_proc.pid))
    targets = {}
    for name, port, h, pid in sides:
        reqs = [raw_request(port, h | {"x-cft-user": f"u{i}"}) for i in range(most)]
        targets[name] = (port, reqs, pid)
        # warm-up: upstream pool, route and key caches (LiteLLM: its first calls import a lot)
        await run_load(port, reqs[: min(most, 4)], 3.0 if name == "litellm" else 2.0, None)
    slices = args.slices
    peers: list[tuple[int, str, dict[str, Result], str]] = []
    # CPU each server burns with no traffic (cft's API process also runs the reconciler's
    # passes beside the router): reported, and taken out of the "net" CPU per call.
    idle: dict[str, float] = {}
    if st.litellm_proc is not None:
        cpu0 = {name: cpu_seconds(pid) for name, _, _, pid in sides}
        await asyncio.sleep(args.idle_seconds)
        idle = {
            name: (cpu_seconds(pid) - cpu0[name]) / args.idle_seconds for name, _, _, pid in sides
        }
        print(
            f"idle CPU over {args.idle_seconds:.0f} s: "
            + ", ".join(f"{k} {v * 1000:.1f} ms/s" for k, v in idle.items())
        )

    def head(title: str) -> None:
        print(f"\n{title}")
        print(
            f"{'clients':>7} {'offered':>8} | {'direct p50':>10} {'p99':>7} {'req/s':>6} | "
            f"{'router p50':>10} {'p99':>7} {'req/s':>6} | {'added p50':>9} {'p99':>7} | "
            f"{'ratio p50':>9} {'p99':>5} | {'CPU/req stub':>12} {'router':>6} | load avg"
        )

    def row(c: int, offered: str, d: Result, r: Result, before: str) -> None:
        dp50, dp99, rp50, rp99 = pct(d.lat, 50), pct(d.lat, 99), pct(r.lat, 50), pct(r.lat, 99)
        print(
            f"{c:>7} {offered:>8} | {dp50:>8.2f}ms {dp99:>5.2f}ms {d.rps:>6.0f} | "
            f"{rp50:>8.2f}ms {rp99:>5.2f}ms {r.rps:>6.0f} | {rp50 - dp50:>7.2f}ms "
            f"{rp99 - dp99:>5.2f}ms | {rp50 / dp50:>8.2f}x {rp99 / dp99:>4.1f}x | "
            f"{d.cpu_us:>10.0f}µs {r.cpu_us:>4.0f}µs | {before[9:]} -> {load_str()[9:]}"
            + (f"  (late sends: direct {d.late}, router {r.late})" if d.late or r.late else ""),
            flush=True,
        )

    async def measure(c: int, rate: float | None) -> dict[str, Result]:
        total = {name: Result() for name, *_ in sides}
        for _ in range(slices):
            for name, *_ in sides:
                port, reqs, pid = targets[name]
                total[name].add(await run_load(port, reqs[:c], args.seconds / slices, rate, pid))
        return total

    head(
        f"open loop: fixed offered rate, {args.seconds:.0f} s per side in {slices} alternating "
        "slices (latency from send)"
    )
    for c, rate in open_loads:
        before = load_str()
        total = await measure(c, rate)
        row(c, f"{c * rate:.0f}/s", total["direct"], total["router"], before)
        peers.append((c, f"{c * rate:.0f}/s", total, before))
    if closed:
        head(f"closed loop: back to back, {args.seconds:.0f} s per side (max requests/s)")
    for c in closed:
        before = load_str()
        total = await measure(c, None)
        row(c, "max", total["direct"], total["router"], before)
        peers.append((c, "max", total, before))
    if st.litellm_proc is not None:
        peer_table(peers, idle)


def net_us(r: Result, idle: float) -> float:
    """CPU per call less the server's idle CPU over the same time."""
    return (r.cpu - idle * r.seconds) / len(r.lat) * 1e6 if r.lat else 0.0


def peer_table(
    peers: list[tuple[int, str, dict[str, Result], str]], idle: dict[str, float]
) -> None:
    """cft against LiteLLM, from the same slices: added latency over direct and CPU per call."""
    print(f"\ncft router against LiteLLM {litellm_version()} (same stub, same slices)")
    print(
        f"{'clients':>7} {'offered':>8} | {'cft added p50':>13} {'p99':>7} {'CPU/call':>8} "
        f"{'net':>6} | {'LiteLLM req/s':>13} {'added p50':>10} {'p99':>9} {'CPU/call':>8} "
        f"{'net':>6} {'unsent':>6} {'errors':>6} | {'CPU LiteLLM/cft':>15} {'net':>5} | "
        "load avg before"
    )
    for c, offered, t, before in peers:
        d, r, lt = t["direct"], t["router"], t["litellm"]
        dp50, dp99 = pct(d.lat, 50), pct(d.lat, 99)
        ra50, ra99 = pct(r.lat, 50) - dp50, pct(r.lat, 99) - dp99
        la50, la99 = (pct(lt.lat, 50) - dp50, pct(lt.lat, 99) - dp99) if lt.lat else (0, 0)
        ratio = lt.cpu_us / r.cpu_us if r.cpu_us else 0.0
        rn, ln = net_us(r, idle.get("router", 0.0)), net_us(lt, idle.get("litellm", 0.0))
        print(
            f"{c:>7} {offered:>8} | {ra50:>11.2f}ms {ra99:>5.2f}ms {r.cpu_us:>6.0f}µs "
            f"{rn:>4.0f}µs | {lt.rps:>13.1f} {la50:>8.2f}ms {la99:>7.2f}ms "
            f"{lt.cpu_us / 1000:>6.1f}ms {ln / 1000:>4.1f}ms {lt.unsent:>6} {lt.errors:>6} | "
            f"{ratio:>14.0f}x {ln / rn if rn > 0 else 0:>4.0f}x | {before[9:]}",
            flush=True,
        )


async def client_costs(port: int, n: int = 3000) -> None:
    """CPU per call of the HTTP clients a proxy could use, against the stub (1 call at a time)."""
    import aiohttp

    url = f"http://127.0.0.1:{port}{PATH}"
    json_h = {"content-type": "application/json"}

    async def with_httpx() -> None:
        async with httpx.AsyncClient() as c:
            for _ in range(n):
                r = await c.send(
                    c.build_request("POST", url, content=BODY, headers=json_h), stream=True
                )
                await r.aread()
                await r.aclose()

    async def with_aiohttp() -> None:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as s:
            for _ in range(n):
                r = await s.post(url, data=BODY, headers=json_h)
                await r.read()
                r.release()

    async def with_protocol() -> None:
        [conn] = await connect(port, 1)
        raw = raw_request(port, {})
        for _ in range(n):
            await conn.request(raw)
        assert conn.transport is not None
        conn.transport.close()

    print(f"\nupstream client CPU per call (this process, {n} sequential calls, 2 rounds)")
    for _ in range(2):
        for name, fn in (
            ("httpx", with_httpx),
            ("aiohttp", with_aiohttp),
            ("asyncio protocol + httptools", with_protocol),
        ):
            c0 = time.process_time()
            await fn()
            print(f"  {name:<30} {(time.process_time() - c0) / n * 1e6:6.0f} µs", flush=True)


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
    ap.add_argument("--seconds", type=float, default=10.0, help="per side and load")
    ap.add_argument("--slices", type=int, default=4, help="alternating direct/router slices")
    ap.add_argument(
        "--open", default="1x100,50x10,200x2.5", help="open-loop loads: CLIENTSxRATE_PER_CLIENT"
    )
    ap.add_argument("--closed", default="1,50,200", help="closed-loop concurrencies ('' = none)")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument(
        "--client-costs", action="store_true", help="also time httpx/aiohttp/raw calls to the stub"
    )
    ap.add_argument(
        "--litellm", action="store_true", help="also LiteLLM's proxy in the same slices"
    )
    ap.add_argument("--idle-seconds", type=float, default=5.0, help="idle CPU window (--litellm)")
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    pin = args.pin if args.pin is not None else len(cpus) >= 2
    gen_cpu, server_cpus = cpus[-1], set(cpus[:-1]) if pin else None
    with Stack(server_cpus, litellm=args.litellm) as st:
        if pin:
            os.sched_setaffinity(0, {gen_cpu})
        where = (
            f"generator on CPU {gen_cpu}, stub + router on CPU {sorted(server_cpus)}"
            if pin and server_cpus
            else "nothing pinned"
        )
        print(f"router bench: stub backend, {len(cpus)} CPUs, {where}; {load_str()}")
        uvloop.run(bench(st, args))
        if args.client_costs:
            uvloop.run(client_costs(st.stub_port))
        time.sleep(1.0)
        with psycopg.connect(st.db) as c:
            n = c.execute("SELECT count(*) FROM obs.inference_log").fetchone()
        print(f"\nlog rows written by the router: {n[0] if n else 0}; {load_str()}")


if __name__ == "__main__":
    main()
