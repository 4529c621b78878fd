"""Would another ASGI server cut the router's per-call cost? uvicorn against Granian, same app.

cft's router runs under uvicorn (uvloop + httptools). Its added p99 at 50 clients x 10 req/s is
~2-3 router service times (BENCHMARKS.md, "Router against LiteLLM"), and about a third of the
router's CPU per call is the HTTP server's own work, the same work the stub backend does alone. This
serves bench/router.py's raw ASGI stub under uvicorn and under Granian (a Rust HTTP server with
an ASGI interface; `--interface asgi`, one worker, single-threaded runtime, uvloop, HTTP/1.1), on
the same CPU, and times both from the same load generator in alternating slices (open loop, the
router bench's raw-protocol clients): latency p50/p99 and the server's CPU per request.

Granian is installed by this bench into bench/.peers/granian-site (pip --target, git-ignored),
never into cft's dependencies.

Usage: python bench/asgi_servers.py [--open 1x10,50x10] [--seconds 4] [--slices 6]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import router as rb  # noqa: E402

SITE = rb.PEERS / "granian-site"
GRANIAN = "granian==2.8.9"
HEADERS = {"content-type": "application/json"}


def granian_site() -> Path:
    """Granian under bench/.peers/ (installed on first use, for this Python)."""
    if not (SITE / "granian").exists():
        print(f"installing {GRANIAN} into {SITE} (once)", flush=True)
        pip = [sys.executable, "-m", "pip", "install", "-q", "--target", str(SITE), GRANIAN]
        subprocess.run(pip, check=True)
    return SITE


def spawn(cmd: list[str], cpu: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--open", default="1x10,50x10", help="open-loop loads: CLIENTSxRATE")
    ap.add_argument("--seconds", type=float, default=4.0, help="per slice")
    ap.add_argument("--slices", type=int, default=6, help="alternating slices per server")
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu, gen_cpu = cpus[0], cpus[-1]
    site = granian_site()
    version = next(site.glob("granian-*.dist-info")).name.removesuffix(".dist-info").split("-")[1]
    ports = {"uvicorn": rb.free_port(), "granian": rb.free_port()}
    # The stub as an importable ASGI app for Granian: bench.router.stub_app([BASE]).
    shim = Path(rb.tempfile.mkdtemp(prefix="cft-bench-asgi-")) / "granian_stub.py"
    shim.write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from bench.router import BASE, stub_app\napp = stub_app([BASE])\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{shim.parent}")
    procs = {
        "uvicorn": spawn(
            [sys.executable, str(ROOT / "bench" / "router.py"), "--stub", str(ports["uvicorn"]), rb.BASE],
            server_cpu,
        ),
        "granian": spawn(
            [
                sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1",
                "--port", str(ports["granian"]), "--workers", "1", "--runtime-threads", "1",
                "--runtime-mode", "st", "--loop", "uvloop", "--http", "1", "--no-ws",
                "--log-level", "warning", "granian_stub:app",
            ],
            server_cpu,
            env,
        ),
    }  # fmt: skip
    try:
        for port in ports.values():
            rb.wait_ready(f"http://127.0.0.1:{port}/v1/models")
        os.sched_setaffinity(0, {gen_cpu})
        print(
            f"asgi servers: uvicorn (uvloop, httptools) vs Granian {version} (asgi, st, uvloop), "
            f"both on CPU {server_cpu}, generator on CPU {gen_cpu}; {rb.load_str()}"
        )
        print("clients  offered | server    p50      p99   req/s  CPU/req")
        for load in args.open.split(","):
            clients, rate = load.split("x")
            results = {name: rb.Result() for name in ports}

            async def measure(
                results: dict[str, rb.Result] = results,
                n: int = int(clients),
                r: float = float(rate),
            ) -> None:
                for _ in range(args.slices):
                    for name, port in ports.items():
                        reqs = [rb.raw_request(port, HEADERS) for _ in range(n)]
                        got = await rb.run_load(port, reqs, args.seconds, r, procs[name].pid)
                        results[name].add(got)

            uvloop.run(measure())
            for name, res in results.items():
                print(
                    f"{clients:>7} {int(clients) * float(rate):>6.0f}/s | {name:<8} "
                    f"{rb.pct(res.lat, 50):>5.2f}ms {rb.pct(res.lat, 99):>6.2f}ms {res.rps:>6.0f} "
                    f"{res.cpu_us:>6.0f}µs  errors {res.errors}"
                )
        print(rb.load_str())
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
