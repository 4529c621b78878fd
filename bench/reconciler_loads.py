"""The reconciler's CPU per load, by part: what one first-call load costs its threads.

The reconciler of this checkout leads 4 engine fakes (tests/support/engines.py, run by
bench/fleet.py's `engines` role in a child process: SGLang by default, each keeping 64
adapters, loads of 25-100 ms) over --routes routes with a prod adapter each (one embedded
PostgreSQL). Once the hot sets are loaded ahead, --n adapters not loaded anywhere are asked
for with want() at --rate per second, as the router asks for an adapter's first call, until
all are loaded. Reported: the reconciler's CPU time (its pass thread and load threads, what
cft_reconciler_cpu_seconds_total counts) per load, and by part (thread CPU time inside each
function, summed): the engine's load call, staging (the verified copy), the records (and their
batched writes), the asks taken between loads, the passes. With --distinct each asked adapter
has an artefact of its own (fetched and hashed at its load), as in a fleet of distinct
adapters; by default all share one, as in bench/fleet.py.

Usage: python bench/reconciler_loads.py [--kind sglang|vllm] [--n 400] [--rate 30] [--distinct]
BENCHMARKS.md, "The fleet at 10,000 routes", has the numbers.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def timed(parts: dict[str, list[float]], cls: Any, name: str, label: str) -> None:
    """Count the thread CPU time spent inside cls.name under `label`."""
    inner: Callable[..., Any] = getattr(cls, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            part = parts.setdefault(label, [0, 0.0])
            part[0] += 1
            part[1] += time.thread_time() - began

    setattr(cls, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--kind", choices=["sglang", "vllm"], default="sglang")
    parser.add_argument("--routes", type=int, default=3000)
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--rate", type=float, default=30.0)
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--distinct", action="store_true")
    args = parser.parse_args()

    import fleet
    import psycopg

    from app.core import embedded
    from app.core.artefacts import LocalStore
    from app.core.db import migrate
    from tests.support.engines import write_adapter

    tmp = Path(tempfile.mkdtemp(prefix="cft-bench-reconciler-"))
    pgdata = tmp / "pg"
    pg = embedded.start(pgdata)
    engines_proc = None
    try:
        with psycopg.connect(pg, autocommit=True) as c:
            c.execute("CREATE DATABASE loads")
        url = pg.replace("/postgres?", "/loads?")
        migrate(url)
        store = LocalStore(tmp / "store")
        src = write_adapter(tmp / "src", rank=8, layers=1, modules=("q_proj",))
        stored = store.put_dir(src, "fleet", "v1")
        _key, names = fleet.seed(
            url, argparse.Namespace(routes=args.routes, canaries=0), stored.uri, stored.sha256
        )
        rng = random.Random(1)
        pick = [f"{n}-prod" for n in rng.sample(names, args.n)]
        if args.distinct:
            with psycopg.connect(url, autocommit=True) as c:
                for i, adapter_id in enumerate(pick):
                    own = store.put_dir(src, "fleet", f"d{i}")
                    c.execute(
                        "UPDATE serve.adapter SET weights_uri = %s, sha256 = %s WHERE id = %s",
                        (own.uri, own.sha256, adapter_id),
                    )
        ports = [fleet.free_port() for _ in range(args.engines)]
        command = [sys.executable, str(ROOT / "bench" / "fleet.py"), "engines"]
        command += ["--kind", args.kind, "--ports", ",".join(map(str, ports)), "--cap", "64"]
        command += ["--per-batch", "8", "--latency", "0.5,2", "--scale", "20"]
        engines_proc = fleet.Proc(command, log=tmp / "engines.log")
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for u in urls:
            fleet.wait_ready(u + "/health", engines_proc)

        os.environ["CFT_ARTEFACT_DIR"] = str(tmp / "store")
        from app.core.config import get_settings
        from app.engines import sglang, vllm
        from app.engines.state import EngineState
        from workers.reconciler import loads, reconciler, records, staging

        slots = 64 if args.kind == "vllm" else 0
        settings = get_settings().model_copy(
            update={"serving_dir": tmp / "serving", "engine_adapter_slots": slots}
        )
        engines = [EngineState.parse(f"{args.kind}+{u}") for u in urls]
        parts: dict[str, list[float]] = {}
        timed(parts, sglang.SGLang, "load", "the engine's load call")
        timed(parts, vllm.VLLM, "load", "the engine's load call")
        # (prepare: a checkout from before source() existed, for a before-and-after.)
        stage = "source" if hasattr(staging.Stager, "source") else "prepare"
        timed(parts, staging.Stager, stage, "staging (the verified copy)")
        timed(parts, records.Deployments, "record", "records (in memory)")
        if hasattr(records.Deployments, "flush"):
            timed(parts, records.Deployments, "flush", "records written (batches)")
        timed(parts, loads.Loads, "run", "the pass thread while loads run (all of it)")
        timed(parts, reconciler.Reconciler, "run_once", "passes")
        rec = reconciler.Reconciler(
            url, engines, serving_dir=tmp / "serving", settings=settings, interval=5.0
        )
        rec.start()
        deadline = time.monotonic() + 120
        while not (rec.last and all(e.models is not None for e in engines)):
            assert time.monotonic() < deadline, "no first pass"
            time.sleep(0.1)
        time.sleep(3)  # the hot sets loaded ahead
        while any(rec.loads.urgent.values()):
            time.sleep(0.1)
        time.sleep(2)
        pick = [a for a in pick if not any(e.has(a) for e in engines)]
        cpu0 = rec.cpu_seconds
        parts.clear()
        began = time.monotonic()
        for i, adapter_id in enumerate(pick):
            delay = began + i / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            rec.want(adapter_id)
        deadline = time.monotonic() + 60
        while not all(any(e.has(a) for e in engines) for a in pick):
            assert time.monotonic() < deadline, "asked-for adapters not loaded"
            time.sleep(0.05)
        elapsed = time.monotonic() - began
        time.sleep(1)  # the last records written
        cpu = rec.cpu_seconds - cpu0
        rec.stop()
        n = len(pick)
        print(
            f"{args.kind}, {n} loads asked at {args.rate:g}/s"
            f" ({'an artefact each' if args.distinct else 'one artefact'}), {elapsed:.1f} s:"
            f" reconciler CPU {cpu:.3f} s = {cpu / elapsed:.4f} CPU s/s,"
            f" {1000 * cpu / n:.3f} ms per load"
        )
        for label, (count, seconds) in sorted(parts.items(), key=lambda kv: -kv[1][1]):
            print(f"  {label:45s} {1000 * seconds / n:7.3f} ms per load ({count} calls)")
    finally:
        if engines_proc is not None:
            engines_proc.stop()
        embedded.stop(pgdata, mode="immediate")
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
