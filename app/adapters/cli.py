"""`cft can-promote`, `cft promote`, `cft rollback`: the promotion gate on the command line."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from app.adapters import service as adapters
from app.adapters.schemas import Blocker
from app.core.db import connect, database_url
from app.core.errors import CftError
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
