"""Command line of the training worker: `cft worker train` and `python -m workers.trainer`.

`cft/cli.py` lists this module in WORKERS: it uses add_arguments() and run(). With
`--devices` the command supervises one worker process per device group (`supervisor`); without
it, it is one worker on one device (GPU 0, else the CPU).
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
    p.add_argument(
        "--devices",
        default=None,
        help="one worker process per device group: all (every visible GPU), 0,1 (one per"
        " GPU), 0+1 (one process holding GPUs 0 and 1, for runs with gpus=2), cpu, cpu:N"
        " (N CPU workers), cpu+cpu (one CPU worker launching 2 ranks)",
    )
    p.add_argument(
        "--gpu-memory-gb",
        type=float,
        default=None,
        help="memory per GPU the workers report to the queue (default: measured, in GiB)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="with --devices: a worker that dies more often than this in 10 minutes stops all",
    )
    p.add_argument("--device-group", default=None, help=argparse.SUPPRESS)


def _supervise(args: argparse.Namespace) -> int:
    import torch

    from workers.trainer.devices import DeviceSpecError, parse_devices
    from workers.trainer.supervisor import Supervisor, install_signals

    try:
        groups = parse_devices(args.devices, torch.cuda.device_count())
    except DeviceSpecError as exc:
        logging.error("%s", exc)
        return 2
    child_args = ["--lease", str(args.lease), "--poll", str(args.poll)]
    if args.once:
        child_args.append("--once")
    if args.gpu_memory_gb is not None:
        child_args += ["--gpu-memory-gb", str(args.gpu_memory_gb)]
    if args.worker_id:
        logging.warning("--worker-id is ignored with --devices: each worker names itself")
    sup = Supervisor(groups, child_args, max_restarts=args.max_restarts)
    install_signals(sup)
    return sup.run()


def run(args: argparse.Namespace) -> int:
    """Run the worker until SIGTERM/SIGINT (or one run with --once)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.devices is not None:
        return _supervise(args)
    from workers.trainer.devices import detect_capacity
    from workers.trainer.worker import Worker, from_settings

    capacity = detect_capacity(group=args.device_group, gpu_memory_gb=args.gpu_memory_gb)
    worker = Worker(
        from_settings(
            lease_s=args.lease, poll_s=args.poll, worker_id=args.worker_id, capacity=capacity
        )
    )
    logging.info(
        "trainer %s serves runs needing up to %d %s device(s)%s",
        worker.cfg.worker_id,
        capacity.gpus,
        capacity.kind,
        f" of {capacity.gpu_memory_gb} GB" if capacity.gpu_memory_gb else "",
    )
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
