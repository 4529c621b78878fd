"""Local engine: N concurrent requests over K adapters, mixed-adapter batching vs one at a time.

.venv/bin/python bench/engine.py --n 8 --adapters 4 --max-tokens 16
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from app.core.config import get_settings
from workers import base_model
from workers.engine.core import Engine, GenRequest, Sampling


def make_adapter(models_dir: Path, target: Path, seed: int) -> None:
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
    model.save_pretrained(target)


async def generate(engine: Engine, prompt: list[int], adapter: str | None, max_tokens: int) -> int:
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
            return int(payload["completion_tokens"])
        if kind == "error":
            raise payload


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8, help="concurrent requests")
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    models_dir = get_settings().models_path
    engine = Engine(
        base_model.BUNDLED, models_dir, max_loras=args.adapters, max_cpu_loras=args.adapters
    )
    names = [f"bench-{i}" for i in range(args.adapters)]
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(names):
            make_adapter(models_dir, Path(tmp) / name, seed=i)
            engine.load_adapter(name, str(Path(tmp) / name))
        topics = ["cats", "the sea", "bread", "trains", "rain", "chess", "tea", "owls"]
        jobs = [
            (
                engine.chat_prompt_ids(
                    [{"role": "user", "content": f"Write two sentences about {topics[i % 8]}."}]
                ),
                names[i % len(names)],
            )
            for i in range(args.n)
        ]
        await generate(engine, jobs[0][0], jobs[0][1], 2)  # warm-up
        t = time.perf_counter()
        serial = 0
        for prompt, adapter in jobs:
            serial += await generate(engine, prompt, adapter, args.max_tokens)
        serial_s = time.perf_counter() - t
        t = time.perf_counter()
        counts = await asyncio.gather(*(generate(engine, p, a, args.max_tokens) for p, a in jobs))
        batched = sum(counts)
        batched_s = time.perf_counter() - t
    engine.close()
    s_tps, b_tps = serial / serial_s, batched / batched_s
    print(
        f"{args.n} requests over {args.adapters} adapters, max_tokens={args.max_tokens} "
        f"(greedy, {base_model.BUNDLED}, CPU)"
    )
    print(f"one at a time:        {serial} tokens in {serial_s:.1f} s = {s_tps:.1f} tokens/s")
    print(f"mixed-adapter batch:  {batched} tokens in {batched_s:.1f} s = {b_tps:.1f} tokens/s")
    print(f"ratio batched/serial: {b_tps / s_tps:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
