"""`cft training-run create|waits`: queue a run (with its resource needs) and see why runs wait."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pydantic import ValidationError

from app.core.db import connect, database_url
from app.core.errors import CftError
from app.datasets.methods import METHODS
from app.training import service
from app.training.schemas import TrainingRunCreate


def register(subparsers: Any) -> None:
    """Add `cft training-run ...`."""
    p = subparsers.add_parser("training-run", help="training runs: create, waits")
    sub = p.add_subparsers(dest="training_command", required=True)

    c = sub.add_parser("create", help="queue a training run (as POST /v1/training-runs)")
    c.add_argument("--tenant", required=True, help="tenant name or id")
    c.add_argument("--route", required=True)
    c.add_argument("--method", required=True, choices=METHODS)
    which = c.add_mutually_exclusive_group(required=True)
    which.add_argument("--snapshot-id", help="an existing snapshot of the route")
    which.add_argument("--fresh", action="store_true", help="freeze a fresh snapshot now")
    c.add_argument("--base-model", help="default: CFT_BASE_MODEL")
    c.add_argument("--gpus", type=int, default=1, help="devices at once (>1: accelerate launch)")
    c.add_argument("--min-gpu-memory-gb", type=float, help="least memory of each GPU")
    c.add_argument("--device-kind", choices=["cuda", "cpu"], help="default: any")
    c.add_argument("--priority", type=int, default=0)
    c.add_argument(
        "--hp",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a hyperparameter (JSON value, e.g. --hp rank=16 --hp distributed_strategy='\"ddp\"'"
        " or a bare word: --hp distributed_strategy=fsdp); repeatable",
    )
    c.set_defaults(func=_create)

    w = sub.add_parser("waits", help="queued runs and why each waits (train.training_run_wait)")
    w.set_defaults(func=_waits)


def _value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _create(args: argparse.Namespace) -> int:
    hp: dict[str, Any] = {}
    for item in args.hp:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            print(f"error: --hp {item!r}: expected KEY=VALUE", file=sys.stderr)
            return 2
        hp[key] = _value(raw)
    body: dict[str, Any] = {
        "route": args.route,
        "method": args.method,
        "gpus": args.gpus,
        "min_gpu_memory_gb": args.min_gpu_memory_gb,
        "device_kind": args.device_kind,
        "priority": args.priority,
        "hyperparameters": hp,
        "base_model": args.base_model,
    }
    body |= {"snapshot": {}} if args.fresh else {"snapshot_id": args.snapshot_id}
    try:
        req = TrainingRunCreate(**body)
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            print(f"error: {where + ': ' if where else ''}{err['msg']}", file=sys.stderr)
        return 2
    try:
        with connect(database_url()) as conn:
            row = conn.execute(
                "SELECT id FROM tenant WHERE name = %s OR id::text = %s", (args.tenant, args.tenant)
            ).fetchone()
            if row is None:
                raise CftError(f"tenant {args.tenant!r} not found")
            run = service.enqueue(conn, tenant_id=int(row["id"]), body=req, actor="cli")
            conn.commit()
    except CftError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    print(run.model_dump_json(indent=2))
    return 0


def _waits(args: argparse.Namespace) -> int:
    with connect(database_url()) as conn:
        rows = conn.execute(
            "SELECT id, route, gpus, min_gpu_memory_gb, device_kind, waiting_for, reason"
            " FROM train.training_run_wait ORDER BY priority DESC, created_at"
        ).fetchall()
    for r in rows:
        print(json.dumps(dict(r), default=str))
    return 0
