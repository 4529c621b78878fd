"""`python -m workers.embedder` / `cft worker embed`: fill missing prompt embeddings, then store
each new prompt's near duplicates (CFT_DEDUP_RADIUS, CFT_DEDUP_NEIGHBOURS) for snapshot dedup."""

from __future__ import annotations

import argparse
import logging
import time

from app.core.config import get_settings
from app.core.db import connect, database_url
from workers.embedder.model import load_encoder
from workers.embedder.service import embed_and_link

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


def run(args: argparse.Namespace) -> int:
    """Loop until interrupted; each batch commits on its own, so a restart loses nothing."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = get_settings()
    encoder = load_encoder(settings)
    url = database_url(settings)
    while True:
        with connect(url, autocommit=True) as conn:
            n, m = embed_and_link(
                conn,
                encoder,
                radius=settings.dedup_radius,
                neighbours=settings.dedup_neighbours,
                batch_size=args.batch_size,
            )
        if n or m:
            log.info("embedded %d rows, searched neighbours of %d", n, m)
        if args.once:
            print(f"embedded {n} rows, searched neighbours of {m}")
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    raise SystemExit(main())
