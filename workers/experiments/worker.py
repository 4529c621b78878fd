"""`cft worker experiments` (or `python -m workers.experiments`): apply the live-traffic
promotion policy of every enabled route: always-valid decisions (serve.canary_decision,
serve.watch_decision), so checking every --interval keeps their error bound."""

from __future__ import annotations

import argparse
import logging
import time

from app.core.db import connect, database_url
from app.experiments import service as experiments

log = logging.getLogger("cft.experiments")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the experiments worker."""
    parser.add_argument("--interval", type=float, default=300.0, help="seconds between passes")
    parser.add_argument("--once", action="store_true", help="run one pass and exit")


def run_once(url: str) -> int:
    """One pass: each enabled route in its own transaction; returns the decisions recorded."""
    recorded = 0
    with connect(url) as conn:
        routes = experiments.policy_routes(conn)
        conn.commit()
        for tenant_id, route in routes:
            try:
                with conn.transaction():
                    for d in experiments.run_policy(conn, tenant_id=tenant_id, route=route):
                        if d["id"] is not None:
                            recorded += 1
                            log.info(
                                "%s/%s %s: %s %s (%s)",
                                tenant_id,
                                route,
                                d["canary_id"],
                                d["action"],
                                d["code"],
                                d["reason"],
                            )
            except Exception:
                log.exception("experiment policy of route %s/%s failed", tenant_id, route)
    return recorded


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
