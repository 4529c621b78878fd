"""`cft can-promote`, `cft promote`, `cft rollback`: the promotion gate on the command line;
`cft adapter import`: an adapter trained elsewhere, registered as a candidate."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from app.adapters import imports
from app.adapters import service as adapters
from app.adapters.schemas import AdapterOut, Blocker
from app.core import artefacts
from app.core.config import get_settings
from app.core.db import connect, database_url
from app.core.errors import CftError
from app.datasets.methods import METHODS
from app.routes import service as routes


def register(subparsers: Any) -> None:
    """Add `cft can-promote`, `cft promote` and `cft rollback`."""
    p = subparsers.add_parser(
        "can-promote", help="ask the gate: exit 0 if CANDIDATE may replace CURRENT, 1 if not"
    )
    p.add_argument("candidate")
    p.add_argument(
        "current", nargs="?", help="the adapter to replace; default: the route's prod now"
    )
    p.set_defaults(func=_can_promote)

    p = subparsers.add_parser("promote", help="promote an adapter to prod through the gate")
    p.add_argument("adapter")
    p.add_argument("--reason", required=True)
    p.set_defaults(func=_promote)

    p = subparsers.add_parser("rollback", help="retire a route's prod and restore the previous")
    p.add_argument("route")
    p.add_argument(
        "--tenant", help="the route's tenant (name or id); needed when several tenants have it"
    )
    p.add_argument("--reason", required=True)
    p.set_defaults(func=_rollback)

    p = subparsers.add_parser("adapter", help="adapters trained elsewhere: import")
    sub = p.add_subparsers(dest="adapter_command", required=True)
    i = sub.add_parser(
        "import",
        help="check, store and register an adapter trained elsewhere as a candidate",
        description="Import a PEFT LoRA adapter trained outside cft: it is checked as cft's own"
        " are (the engines' contract, the route's base), stored in the artefact store and"
        " registered as a candidate that the evaluator, the gate and the router treat like any.",
    )
    i.add_argument(
        "source",
        help="the folder save_pretrained wrote, a .tar.gz/.tar/.zip of it, or s3://bucket/prefix"
        " (read with the CFT_S3_* credentials)",
    )
    i.add_argument("--route", required=True)
    i.add_argument("--method", required=True, choices=METHODS, help="how it was trained")
    i.add_argument("--base", help="the base it was trained on; must be the route's (default)")
    i.add_argument(
        "--tenant", help="the route's tenant (name or id); needed when several tenants have it"
    )
    i.add_argument(
        "--snapshot",
        help="the cft dataset snapshot it was trained on (the evaluator scores its held-out split)",
    )
    i.add_argument("--metadata", help="a JSON object kept with the adapter")
    i.set_defaults(func=_import)


def _print_blockers(rows: list[Blocker]) -> None:
    for b in rows:
        where = f"{b.suite_id}/{b.metric} ({b.direction} is better): " if b.metric else ""
        scores = (
            f" [candidate {b.candidate_score}, current {b.current_score}, threshold {b.threshold}]"
            if b.metric and b.current_score is not None
            else ""
        )
        print(f"  - {where}{b.reason}{scores}")


def _can_promote(args: argparse.Namespace) -> int:
    with connect(database_url()) as conn:
        current = args.current
        if current is None:
            row = adapters.get_adapter(conn, adapter_id=args.candidate)
            current = (
                adapters.current_prod(conn, tenant_id=row.tenant_id, route=row.route)
                if row
                else None
            )
        found = adapters.blockers(conn, candidate=args.candidate, current=current)
    against = current or "no prod (first promotion)"
    if not found:
        print(f"allowed: {args.candidate} may replace {against}")
        return 0
    print(f"refused: {args.candidate} may not replace {against}", file=sys.stdout)
    _print_blockers(found)
    return 1


def _promote(args: argparse.Namespace) -> int:
    try:
        with connect(database_url()) as conn, conn.transaction():
            row = adapters.promote(conn, adapter_id=args.adapter, reason=args.reason, actor="cli")
    except CftError as exc:
        print(f"refused: {exc.message}", file=sys.stderr)
        return 1
    print(f"{row.id} is prod on {row.route} (replaced {row.previous_prod_id or 'none'})")
    return 0


def _rollback(args: argparse.Namespace) -> int:
    try:
        with connect(database_url()) as conn, conn.transaction():
            tenant_id = routes.route_tenant(conn, name=args.route, tenant=args.tenant)
            prod = adapters.current_prod(conn, tenant_id=tenant_id, route=args.route)
            if prod is None:
                print(f"route {args.route} has no prod adapter", file=sys.stderr)
                return 1
            row = adapters.rollback(conn, adapter_id=prod, reason=args.reason, actor="cli")
    except CftError as exc:
        print(f"refused: {exc.message}", file=sys.stderr)
        return 1
    print(f"rolled back {prod}: {row.id} is prod on {args.route} again")
    return 0


def _import(args: argparse.Namespace) -> int:
    settings = get_settings()
    store = artefacts.get_store(settings)
    row: AdapterOut | None = None
    try:
        metadata = json.loads(args.metadata) if args.metadata else {}
        if not isinstance(metadata, dict):
            raise ValueError("not a JSON object")
    except (ValueError, RecursionError) as exc:
        print(f"error: --metadata must be a JSON object ({exc})", file=sys.stderr)
        return 2
    try:
        with tempfile.TemporaryDirectory(prefix="cft-import-") as tmp:
            work = Path(tmp)
            source = imports.unpack_source(args.source, work / "source", settings=settings)
            with connect(database_url(settings)) as conn:
                try:
                    with conn.transaction():
                        tenant_id = routes.route_tenant(conn, name=args.route, tenant=args.tenant)
                        row = imports.import_adapter(
                            conn,
                            tenant_id=tenant_id,
                            source_dir=source,
                            spec=imports.ImportSpec(
                                route=args.route,
                                method=args.method,
                                base_model=args.base,
                                dataset_snapshot_id=args.snapshot,
                                metadata=metadata,
                                origin=args.source,
                                actor="cli",
                            ),
                            store=store,
                            settings=settings,
                            work=work,
                        )
                except BaseException:
                    if row is not None:  # registered, but the commit failed
                        imports.discard(store, row)
                    raise
    except CftError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    assert row is not None
    print(
        f"imported {row.id}: a candidate of route {row.route} (sha256 {row.sha256},"
        f" {row.size_bytes} bytes at {row.weights_uri}); the evaluator scores it next"
    )
    return 0
