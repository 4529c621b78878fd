"""`python -m workers.maintenance` / `cft worker maintenance`: run passes on an interval."""

from __future__ import annotations

import argparse
import logging
import time

from app.core import artefacts
from app.core.config import get_settings
from app.core.db import connect, database_url
from workers.maintenance.tasks import run_once, sweep_orphan_artefacts

log = logging.getLogger("cft.maintenance")


def main(argv: list[str] | None = None) -> int:
    """Run maintenance passes (partitions, orphan artefacts) every --interval seconds (or once)."""
    parser = argparse.ArgumentParser(prog="cft worker maintenance")
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the maintenance worker."""
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    parser.add_argument("--interval", type=float, default=3600.0, help="seconds between passes")


def run(args: argparse.Namespace) -> int:
    """Loop until interrupted."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = get_settings()
    url = database_url(settings)
    while True:
        with connect(url, autocommit=True) as conn:
            report = run_once(
                conn,
                weeks_ahead=settings.partitions_ahead_weeks,
                retention_days=settings.log_retention_days,
            )
        log.info(
            "partitions created=%s rescued-from-default=%s dropped=%s neighbour-rows-pruned=%d",
            report.created,
            report.rescued,
            report.dropped,
            report.neighbours_pruned,
        )
        try:
            with connect(url, autocommit=True) as conn:
                orphans = sweep_orphan_artefacts(
                    conn,
                    artefacts.get_store(settings),
                    grace_hours=settings.artefact_orphan_grace_hours,
                )
            log.info("orphan artefacts deleted=%s", orphans)
        except artefacts.ArtefactError as exc:
            # A store outage must not stop partition maintenance; the next pass retries.
            log.error("orphan artefact sweep failed: %s", exc)
        if args.once:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    raise SystemExit(main())
