"""`cft worker loop` and `python -m workers.loop`: the loop worker's command line."""

from __future__ import annotations

import argparse
import logging
import signal
from typing import Any

from app.core.db import database_url
from app.core.metrics import REGISTRY
from workers.loop.worker import LoopWorker


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the loop worker."""
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between passes")
    parser.add_argument("--lease", type=float, default=120.0, help="lease of a claimed cycle (s)")
    parser.add_argument("--refresh", type=float, default=60.0, help="candidate view refresh (s)")
    parser.add_argument("--worker-id", default="", help="name in loop.cycle.worker_id")
    parser.add_argument("--metrics-port", type=int, default=0, help="serve /metrics (0: off)")
    parser.add_argument("--once", action="store_true", help="run one pass and exit")


def run(args: argparse.Namespace) -> int:
    """Run the worker until SIGTERM/SIGINT (or one pass with --once)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, registry=REGISTRY)
    worker = LoopWorker(
        database_url(), worker_id=args.worker_id, lease_s=args.lease, refresh_s=args.refresh
    )
    if args.once:
        worker.run_once()
        return 0

    def _stop(*_: Any) -> None:
        worker.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    worker.run_forever(args.interval)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m workers.loop`."""
    parser = argparse.ArgumentParser(prog="python -m workers.loop", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
