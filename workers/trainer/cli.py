"""Command line of the training worker: `cft worker train` and `python -m workers.trainer`.

`workers/cli.py` lists this module in WORKERS: it uses add_arguments() and run().
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The worker's options."""
    p.add_argument("--once", action="store_true", help="process at most one run, then exit")
    p.add_argument("--lease", type=float, default=120.0, help="lease in seconds (renewed)")
    p.add_argument("--poll", type=float, default=5.0, help="poll interval when LISTEN is quiet")
    p.add_argument("--worker-id", default="", help="name in training_run.worker_id")


def run(args: argparse.Namespace) -> int:
    """Run the worker until SIGTERM/SIGINT (or one run with --once)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from workers.trainer.worker import Worker, from_settings

    worker = Worker(from_settings(lease_s=args.lease, poll_s=args.poll, worker_id=args.worker_id))
    if args.once:
        worker.run_once()
        return 0

    def _stop(*_: Any) -> None:
        worker.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    worker.run_forever()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m workers.trainer`."""
    parser = argparse.ArgumentParser(prog="python -m workers.trainer", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
