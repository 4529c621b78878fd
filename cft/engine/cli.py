"""`cft engine`: run the local engine (flags named like `vllm serve`'s)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from app.core.config import get_settings


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The engine's flags."""
    p.add_argument("--base-model", help="base model (default CFT_BASE_MODEL)")
    p.add_argument("--served-model-name", help="name of the base in /v1/models")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-loras", type=int, default=4, help="most adapters in one batch")
    p.add_argument("--max-cpu-loras", type=int, default=None, help="most adapters in memory (LRU)")
    p.add_argument("--max-lora-rank", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=16, help="most requests in one batch")
    p.add_argument(
        "--max-waiting-queue-length",
        type=int,
        default=256,
        help="most requests waiting for the batch; more are refused with 429 and Retry-After",
    )
    p.add_argument(
        "--lora-modules",
        nargs="*",
        default=[],
        metavar="NAME=PATH",
        help="adapters to load at start",
    )


def run(args: argparse.Namespace) -> int:
    """Load the model, then serve until interrupted."""
    import uvicorn

    from app.core.http_server import server_options
    from cft.engine.core import Engine
    from cft.engine.server import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = get_settings()
    engine = Engine(
        args.base_model or settings.base_model,
        settings.models_path,
        served_name=args.served_model_name,
        max_loras=args.max_loras,
        max_cpu_loras=args.max_cpu_loras,
        max_lora_rank=args.max_lora_rank,
        max_batch=args.max_num_seqs,
        max_waiting=args.max_waiting_queue_length,
    )
    for spec in args.lora_modules:
        name, _, path = spec.partition("=")
        engine.load_adapter(name, path)
    print(f"cft engine serving {engine.model.name} on http://{args.host}:{args.port}", flush=True)
    try:
        uvicorn.run(create_app(engine), host=args.host, port=args.port, **server_options())
    finally:
        engine.close()
    return 0


def register(subparsers: Any) -> None:
    """Add `cft engine`."""
    p = subparsers.add_parser("engine", help="the local engine (vLLM's OpenAI + LoRA API)")
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m cft.engine`."""
    parser = argparse.ArgumentParser(prog="python -m cft.engine", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
