"""`cft worker experiments` and `python -m workers.experiments`: the experiments worker's
command line."""

from __future__ import annotations

import argparse
import logging
import time

from app.core.db import database_url
from workers.experiments.worker import run_once


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the experiments worker."""
    parser.add_argument("--interval", type=float, default=300.0, help="seconds between passes")
    parser.add_argument("--once", action="store_true", help="run one pass and exit")


def run(args: argparse.Namespace) -> int:
    """Run passes every --interval seconds (or once)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    url = database_url()
    while True:
        run_once(url)
        if args.once:
            return 0
        time.sleep(args.interval)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m workers.experiments`."""
    parser = argparse.ArgumentParser(prog="python -m workers.experiments", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
