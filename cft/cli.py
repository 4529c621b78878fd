"""The `cft` command line: one entry point for the database, the services and the workers."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

from app.core import embedded
from app.core.config import get_settings
from app.core.db import database_url, migrate

# Domains that add subcommands: each module has `register(subparsers) -> None`.
PLUGINS: list[str] = [
    "cft.engine.cli",
    "app.tenants.cli",
    "app.datasets.cli",
    "app.training.cli",
    "app.adapters.cli",
    "app.privacy.cli",
    "app.loop.cli",
]

# `cft worker NAME` runs the package workers.<WORKERS[NAME]>: its `cli` module has
# `add_arguments(parser)` and `run(args) -> int`.
WORKERS: dict[str, str] = {
    "maintenance": "maintenance",
    "embed": "embedder",
    "train": "trainer",
    "experiments": "experiments",
    "reconcile": "reconciler",
    "eval": "evaluator",
    "loop": "loop",
}


def _worker_cli(name: str) -> Any:
    return importlib.import_module(f"workers.{WORKERS[name]}.cli")


def _worker(args: argparse.Namespace) -> int:
    module = _worker_cli(args.worker)
    rc: int = module.run(args)
    return rc


def _db(args: argparse.Namespace) -> int:
    settings = get_settings()
    if args.action in ("up", "down") and not settings.embedded:
        print(f"CFT_DATABASE_URL is set: cft does not manage that server ({args.action} ignored)")
        return 1
    if args.action == "up":
        url = embedded.start(settings.pgdata)
        print(f"embedded PostgreSQL running at {settings.pgdata}\n{url}")
    elif args.action == "down":
        stopped = embedded.stop(settings.pgdata)
        print("stopped" if stopped else "not running")
    elif args.action == "status":
        if not settings.embedded:
            print(f"external database: {settings.database_url}")
            return 0
        st = embedded.status(settings.pgdata)
        state = "running" if st.running else ("stopped" if st.initialised else "not initialised")
        print(
            f"embedded PostgreSQL at {st.pgdata}: {state}" + (f" (pid {st.pid})" if st.pid else "")
        )
        if st.url:
            print(st.url)
        return 0 if st.running else 3
    elif args.action == "url":
        print(database_url(settings))
    elif args.action == "psql":
        return embedded.run_psql(database_url(settings), args.psql_args)
    return 0


def _migrate(args: argparse.Namespace) -> int:
    print(migrate(database_url()))
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.core.http_server import server_options
    from cft.serve import create_app  # the app, with the reconciler beside its router

    settings = get_settings()
    url = database_url(settings)
    if not args.no_migrate:
        migrate(url)
    host = args.host or settings.host
    port = args.port or settings.port
    print(
        f"cft API listening on http://{host}:{port}  (health: http://{host}:{port}/healthz)",
        flush=True,
    )
    uvicorn.run(create_app(settings, db_url=url), host=host, port=port, **server_options())
    return 0


def _run(args: argparse.Namespace) -> int:
    from cft.run import main as main_job

    return main_job.main(args)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every cft command."""
    parser = argparse.ArgumentParser(prog="cft", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("db", help="the embedded PostgreSQL: up, down, status, url, psql")
    p.add_argument("action", choices=["up", "down", "status", "url", "psql"])
    p.add_argument("psql_args", nargs=argparse.REMAINDER, help="extra arguments for psql")
    p.set_defaults(func=_db)

    p = sub.add_parser(
        "migrate", help="create the schema, or run pending migrations and changed SQL code"
    )
    p.set_defaults(func=_migrate)

    p = sub.add_parser("serve", help="run the API server (control plane + router)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--no-migrate", action="store_true", help="do not upgrade the schema first")
    p.set_defaults(func=_serve)

    p = sub.add_parser("run", help="the main job: everything on one machine, and the demo loop")
    from cft.run import main as main_job

    main_job.add_arguments(p)
    p.set_defaults(func=_run)

    p = sub.add_parser("worker", help="run a worker process: " + ", ".join(WORKERS))
    workers = p.add_subparsers(dest="worker", required=True)
    for name in WORKERS:
        wp = workers.add_parser(name, help=f"the {name} worker")
        _worker_cli(name).add_arguments(wp)
        wp.set_defaults(func=_worker)

    for name in PLUGINS:
        register: Callable[[Any], None] = importlib.import_module(name).register
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `cft` console script."""
    args = build_parser().parse_args(argv)
    try:
        rc: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return rc


if __name__ == "__main__":
    sys.exit(main())
