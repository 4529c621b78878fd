"""`cft loop enable|pause|status ROUTE`, `cft loop stop-all|resume-all`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from app.core.db import Connection, connect, database_url
from app.core.errors import CftError
from app.loop import service as loop
from app.routes import service as routes

TENANT_HELP = "the route's tenant (name or id); needed when several tenants have the route"


def register(subparsers: Any) -> None:
    """Add `cft loop ...`."""
    p = subparsers.add_parser("loop", help="the autonomous loop: enable, pause, status, stop-all")
    sub = p.add_subparsers(dest="loop_action", required=True)
    e = sub.add_parser("enable", help="turn a route's loop on (other fields keep their values)")
    e.add_argument("route")
    e.add_argument("--tenant", help=TENANT_HELP)
    e.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE",
        help="also set a policy field (VALUE as JSON, else text), e.g. --set min_new_examples=20",
    )  # fmt: skip
    e.set_defaults(func=_enable)
    s = sub.add_parser("pause", help="hold new cycles of a route (in-flight cycles finish)")
    s.add_argument("route")
    s.add_argument("--tenant", help=TENANT_HELP)
    s.add_argument("--reason", default="paused from the CLI")
    s.set_defaults(func=_pause)
    s = sub.add_parser("status", help="a route's policy, triggers, limits and cycles")
    s.add_argument("route")
    s.add_argument("--tenant", help=TENANT_HELP)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=_status)
    s = sub.add_parser("stop-all", help="the kill switch: no loop cycle starts anywhere")
    s.add_argument("--reason", required=True)
    s.set_defaults(func=_stop_all)
    s = sub.add_parser("resume-all", help="release the kill switch")
    s.set_defaults(func=_resume_all)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _tenant(conn: Connection, args: argparse.Namespace) -> int:
    return routes.route_tenant(conn, name=args.route, tenant=args.tenant)


def _write(args: argparse.Namespace, fields: dict[str, Any]) -> int:
    try:
        with connect(database_url()) as conn, conn.transaction():
            loop.write_policy(
                conn,
                tenant_id=_tenant(conn, args),
                route=args.route,
                fields=fields,
                replace=False,
                actor="cli",
            )
    except CftError as exc:
        print(f"refused: {exc.message}", file=sys.stderr)
        return 1
    return 0


def _enable(args: argparse.Namespace) -> int:
    fields: dict[str, Any] = {"enabled": True, "paused": False, "paused_reason": None}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep:
            print(f"--set needs FIELD=VALUE, got {item!r}", file=sys.stderr)
            return 2
        fields[name] = _value(value)
    rc = _write(args, fields)
    if rc == 0:
        print(f"loop of {args.route} enabled")
    return rc


def _pause(args: argparse.Namespace) -> int:
    rc = _write(args, {"paused": True, "paused_reason": args.reason})
    if rc == 0:
        print(f"loop of {args.route} paused: {args.reason}")
    return rc


def _status(args: argparse.Namespace) -> int:
    try:
        with connect(database_url()) as conn:
            st = loop.status(conn, tenant_id=_tenant(conn, args), route=args.route)
    except CftError as exc:
        print(exc.message, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(st.model_dump(exclude_unset=True), default=str, indent=2))
        return 0
    p, k = st.policy, st.control
    state = "enabled" if p["enabled"] else "disabled"
    if p["paused"]:
        state += f", paused ({p['paused_reason']})"
    print(
        f"loop of {args.route}: {state}"
        + ("; STOPPED EVERYWHERE: " + str(k["reason"]) if k["paused"] else "")
    )
    print("triggers:")
    for t in st.triggers:
        print(f"  {t.trigger:<9} {t.line}")
    held = [lim for lim in st.limits if lim.blocking]
    print("limits holding a new cycle:" + ("" if held else " none"))
    for lim in held:
        print(f"  {lim.limit_name:<22} {lim.line}")
    cur = st.current_cycle
    if cur:
        print(f"current cycle {cur.id}: {cur.state} ({cur.trigger}, {cur.method})"
              + (f"; {cur.waiting_for}" if cur.waiting_for else ""))  # fmt: skip
    for c in st.cycles[:10]:
        print(f"  cycle {c.id}: {c.state:<11} {c.trigger:<8} {c.method or '-':<5}"
              f" {c.decision_reason or c.error or ''}")  # fmt: skip
    return 0


def _stop_all(args: argparse.Namespace) -> int:
    with connect(database_url()) as conn, conn.transaction():
        loop.set_control(conn, paused=True, reason=args.reason, actor="cli")
    print(f"the loop is stopped everywhere: {args.reason}")
    return 0


def _resume_all(args: argparse.Namespace) -> int:
    with connect(database_url()) as conn, conn.transaction():
        loop.set_control(conn, paused=False, reason=None, actor="cli")
    print("the loop runs again")
    return 0
