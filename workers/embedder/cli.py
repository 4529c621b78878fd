"""`python -m workers.embedder` / `cft worker embed`: fill missing prompt embeddings, then store
each new prompt's near duplicates (CFT_DEDUP_RADIUS, CFT_DEDUP_NEIGHBOURS) for snapshot dedup."""

from __future__ import annotations

import argparse
import logging
import time

from app.core.config import get_settings
from app.core.db import connect, database_url
from workers.embedder.metrics import backlog
from workers.embedder.model import load_encoder
from workers.embedder.service import embed_and_link, embed_pending, link_parallel

log = logging.getLogger("cft.embedder")


def main(argv: list[str] | None = None) -> int:
    """Embed pending rows, then poll every --interval seconds (or stop with --once)."""
    parser = argparse.ArgumentParser(prog="cft worker embed")
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the embedder."""
    parser.add_argument("--once", action="store_true", help="drain the backlog once, then exit")
    parser.add_argument("--batch-size", type=int, default=256, help="rows per transaction")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between polls")
    parser.add_argument(
        "--link-sessions",
        type=int,
        default=1,
        help="database sessions that search neighbours at once when a backlog is left after"
        " a pass (up to the database's cores)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus metrics (rows done, backlogs and their age) on this port",
    )


def run(args: argparse.Namespace) -> int:
    """Loop until interrupted; each batch commits on its own, so a restart loses nothing."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = get_settings()
    encoder = load_encoder(settings)
    url = database_url(settings)
    if args.metrics_port:
        from prometheus_client import start_http_server

        from app.core.metrics import REGISTRY

        start_http_server(args.metrics_port, registry=REGISTRY)
    total_n = total_m = 0
    while True:
        with connect(url, autocommit=True) as conn:
            if args.link_sessions > 1:
                # A few batches embedded, then their neighbours searched from several sessions
                # (the search is the slower half, and CPU-bound in the database).
                n = embed_pending(
                    conn, encoder, batch_size=args.batch_size, limit=4 * args.batch_size
                )
                m = link_parallel(
                    url,
                    radius=settings.dedup_radius,
                    neighbours=settings.dedup_neighbours,
                    sessions=args.link_sessions,
                    batch_size=args.batch_size,
                )
            else:
                n, m = embed_and_link(
                    conn,
                    encoder,
                    radius=settings.dedup_radius,
                    neighbours=settings.dedup_neighbours,
                    batch_size=args.batch_size,
                )
            backlog(conn)  # the gauges
        total_n, total_m = total_n + n, total_m + m
        if n or m:
            log.info("embedded %d rows, searched neighbours of %d", n, m)
        if args.once and not (n or m):
            print(f"embedded {total_n} rows, searched neighbours of {total_m}")
            return 0
        if not (n or m):
            time.sleep(args.interval)


if __name__ == "__main__":
    raise SystemExit(main())
