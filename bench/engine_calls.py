"""CPU per engine control call (load, unload, probe) for each HTTP client the reconciler could use.

One SGLang fake (tests/support/engines.py, under uvicorn in a child process: bench/fleet.py's
`engines` role, loads instant, 64 adapters loaded ahead so /v1/models lists them) is called
from one thread, as a load thread calls it, by the engine kind's own code (SGLang.load and
unload, the probe's GET of /v1/models): a cycle of load, probe, unload for a new name,
--gap seconds between calls (the reconciler's calls come tens of milliseconds apart; 0 for a
tight loop). Reported: the calling thread's CPU time (time.thread_time) per call, by client
and call, for --rounds rounds of --n cycles per client, the clients taking turns in each
round (the order rotated), and the TCP connections each opened per call (a kept-alive client
opens one at its first call).

The clients: `reconciler` (workers/reconciler/http.py of this checkout), `httpx` (one
httpx.Client kept), and for each --before REF the LeanClient of workers/reconciler/http.py at
git REF (named REF; that file alone, importing this checkout's app/).

Usage: python bench/engine_calls.py [--n 150] [--rounds 5] [--gap 0.03] [--before REF ...]
BENCHMARKS.md, "The fleet at 10,000 routes", has the numbers.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

CALLS = ("load", "probe", "unload")
CONNECTS = [0]  # socket.create_connection calls (every client here connects through it)


def _counted(create: Any) -> Any:
    def create_connection(*args: Any, **kwargs: Any) -> Any:
        CONNECTS[0] += 1
        return create(*args, **kwargs)

    return create_connection


def client_at(ref: str, tmp: Path) -> Any:
    """The reconciler's LeanClient of workers/reconciler/http.py at git ref."""
    source = subprocess.run(
        ["git", "show", f"{ref}:workers/reconciler/http.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    name = f"reconciler_http_{len(sys.modules)}"
    path = tmp / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.LeanClient(connect_timeout=10.0, read_timeout=300.0)


def cycles(client: Any, url: str, path: str, n: int, gap: float, tag: str) -> dict[str, float]:
    """n cycles of load, probe, unload from a thread of its own: CPU seconds by call."""
    from app.engines.sglang import KIND

    spent = dict.fromkeys(CALLS, 0.0)
    spent["connects"] = -CONNECTS[0]

    def run() -> None:
        for i in range(n):
            name = f"{tag}-{i}"
            for call in CALLS:
                time.sleep(gap)
                began = time.thread_time()
                if call == "load":
                    answer = KIND.load(client, url, name, path)
                elif call == "unload":
                    answer = KIND.unload(client, url, name)
                else:
                    resp = client.get(url + KIND.probe_path, timeout=5.0)
                    resp.raise_for_status()
                    resp.json()
                spent[call] += time.thread_time() - began
                if call != "probe":
                    assert answer.outcome.value == "done", answer

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    spent["connects"] += CONNECTS[0]
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=150, help="cycles per client per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gap", type=float, default=0.03, help="seconds between calls")
    parser.add_argument(
        "--before", metavar="REF", action="append", default=[], help="the client at a git ref"
    )
    args = parser.parse_args()
    socket.create_connection = _counted(socket.create_connection)  # type: ignore[assignment]

    import fleet
    import httpx

    from app.engines.sglang import KIND
    from tests.support.engines import write_adapter
    from workers.reconciler.http import LeanClient

    tmp = Path(tempfile.mkdtemp(prefix="cft-bench-engine-calls-"))
    engine = None
    clients: dict[str, Any] = {}
    try:
        adapter = str(write_adapter(tmp / "adapter", rank=8, layers=1, modules=("q_proj",)))
        port = fleet.free_port()
        command = [sys.executable, str(ROOT / "bench" / "fleet.py"), "engines", "--kind"]
        command += ["sglang", "--ports", str(port), "--cap", "100000", "--latency", "0,0"]
        engine = fleet.Proc(command, log=tmp / "engine.log")
        url = f"http://127.0.0.1:{port}"
        fleet.wait_ready(url + "/health", engine)

        clients["reconciler"] = LeanClient(connect_timeout=10.0, read_timeout=300.0)
        for ref in args.before:
            clients[ref] = client_at(ref, tmp)
        clients["httpx"] = httpx.Client(timeout=httpx.Timeout(10.0, read=300.0))
        with httpx.Client() as warm:
            for i in range(64):
                KIND.load(warm, url, f"kept-{i}", adapter)
        for name, client in clients.items():  # connected, and each code path run once
            cycles(client, url, adapter, 2, 0.0, f"warm-{name}")

        names = list(clients)
        per_call: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        opened: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                spent = cycles(clients[name], url, adapter, args.n, args.gap, f"{name}-{r}")
                connects = spent.pop("connects") / (args.n * len(CALLS))
                per_call[name].append({c: 1000 * s / args.n for c, s in spent.items()})
                opened[name].append(connects)

        print(
            f"CPU ms per call, {args.rounds} rounds of {args.n} cycles (load, probe, unload)"
            f" per client, {args.gap * 1000:g} ms between calls; median of the rounds (each)"
        )
        for name in names:
            rows = per_call[name]
            cells = []
            for call in (*CALLS, "mean"):
                values = [
                    sum(row.values()) / len(CALLS) if call == "mean" else row[call] for row in rows
                ]
                each = "/".join(f"{v:.3f}" for v in values)
                cells.append(f"{call} {statistics.median(values):.3f} ({each})")
            cells.append(f"connections per call {max(opened[name]):.3f}")
            print(f"  {name:12s} " + "  ".join(cells))
    finally:
        for client in clients.values():
            client.close()
        if engine is not None:
            engine.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
