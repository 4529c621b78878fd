"""Command line of the reconciler: `cft worker reconcile` and `python -m workers.reconciler`.

`cft/cli.py` lists this module in WORKERS: it uses add_arguments() and run().
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal

from app.core.config import get_settings
from app.core.db import database_url
from app.engines.state import EngineState
from workers.reconciler.reconciler import Reconciler


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `cft worker reconcile`."""
    parser.add_argument(
        "--engine",
        action="append",
        default=None,
        help="engine base URL, KIND+URL for sglang/lorax (default CFT_ENGINE_URLS)",
    )
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    parser.add_argument("--interval", type=float, default=None, help="seconds between passes")


def run(args: argparse.Namespace) -> int:
    """Entry point of `cft worker reconcile`."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = get_settings()
    urls: list[str] = args.engine or settings.engine_url_list
    if not urls:
        print("no engines: pass --engine URL or set CFT_ENGINE_URLS")
        return 2
    try:
        engines = [EngineState.parse(u) for u in urls]
    except ValueError as exc:
        print(f"cannot reconcile: {exc}")
        return 2
    rec = Reconciler(
        database_url(settings),
        engines,
        serving_dir=settings.serving_path,
        settings=settings,
        interval=args.interval or settings.reconcile_interval,
    )
    if args.once:
        report = rec.run_once()
        for what, items in (("loaded", report.loaded), ("unloaded", report.unloaded)):
            for adapter_id, url in items:
                print(f"{what} {adapter_id} on {url}")
        for adapter_id, url, why in report.failed:
            print(f"FAILED {adapter_id} on {url}: {why}")
        rec.close()
        return 1 if report.failed or report.engines_down else 0

    signal.signal(signal.SIGTERM, lambda *_: rec.request_stop())
    with contextlib.suppress(KeyboardInterrupt):
        rec.run_forever()
    rec.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m workers.reconciler`."""
    parser = argparse.ArgumentParser(prog="python -m workers.reconciler", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
