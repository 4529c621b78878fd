"""Command line of the evaluator: `cft worker eval` and `python -m workers.evaluator`.

`cft/cli.py` lists this module in WORKERS: it uses add_arguments() and run().
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The worker's options."""
    p.add_argument("--once", action="store_true", help="process what is pending, then exit")
    p.add_argument("--lease", type=float, default=900.0, help="lease of a request in seconds")
    p.add_argument("--poll", type=float, default=5.0, help="poll interval when LISTEN is quiet")
    p.add_argument("--worker-id", default="", help="name in eval_request.worker_id")
    p.add_argument(
        "--calibrate",
        metavar="SUITE",
        help="run the judge on SUITE's calibration set, store its agreement, print it and exit",
    )
    p.add_argument(
        "--tenant",
        help="with --calibrate: the suite's tenant (name or id), needed when several have SUITE",
    )


def run(args: argparse.Namespace) -> int:
    """Run the evaluator until SIGTERM/SIGINT (or one pass with --once)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from app.core.config import get_settings
    from app.core.db import database_url
    from workers.evaluator.worker import EvalConfig, Evaluator

    settings = get_settings()
    # The evaluator speaks vLLM's API (load, generate, unload): it uses the first engine of a kind
    # that does (vllm or the local engine); SGLang and LoRAX entries serve traffic only.
    from app.engines.kinds import kind_of, parse_engine_urls

    vllm_api = [
        s.url for s in parse_engine_urls(settings.engine_url_list) if kind_of(s.kind).vllm_api
    ]
    if args.calibrate:
        return _calibrate(
            settings, database_url(settings), args.calibrate, args.tenant, args.worker_id
        )
    worker = Evaluator(
        EvalConfig(
            db_url=database_url(settings),
            models_dir=settings.models_path,
            settings=settings,
            engine_urls=vllm_api,
            worker_id=args.worker_id,
            lease_s=args.lease,
            poll_s=args.poll,
        )
    )
    if args.once:
        n = worker.run_once()
        logging.getLogger(__name__).info("evaluated %d adapter(s)", n)
        return 0

    def _stop(*_: Any) -> None:
        worker.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    worker.run_forever()
    return 0


def _calibrate(settings: Any, url: str, suite_id: str, tenant: str | None, worker_id: str) -> int:
    from app.core.errors import CftError
    from app.evals import service as evals
    from workers.evaluator import judge
    from workers.evaluator.worker import EvalConfig, connect

    cfg = EvalConfig(db_url=url, models_dir=settings.models_path, settings=settings)
    with connect(url, worker_id or cfg.worker_id) as conn, conn.transaction():
        try:
            tenant_id = evals.suite_tenant(conn, suite_id=suite_id, tenant=tenant)
            suite = evals.get_suite_or_raise(conn, tenant_id=tenant_id, suite_id=suite_id)
            # The judge reads suites as the evaluator's rows: the tenant's id beside the suite.
            cal = judge.calibrate(conn, settings, suite.model_dump() | {"tenant_id": tenant_id})
        except (CftError, ValueError) as exc:
            print(f"cannot calibrate: {exc}", file=sys.stderr)
            return 1
    kappa = "undefined" if cal.kappa is None else f"{cal.kappa:.3f}"
    accuracy = "undefined" if cal.accuracy is None else f"{cal.accuracy:.3f}"
    bias = "undefined" if cal.bias is None else f"{cal.bias:+.3f}"
    print(
        f"judge {cal.judge_model} (rubric {cal.rubric_version}) on {suite_id}:"
        f" n={cal.n} accuracy={accuracy} kappa={kappa} bias={bias}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m workers.evaluator`."""
    parser = argparse.ArgumentParser(prog="python -m workers.evaluator", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
