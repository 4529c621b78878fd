"""`cft tenant ...`, `cft key ...` and `cft operator key ...`: tenants, their keys, operators."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from typing import Any

from app.core.auth import ROLES
from app.core.config import get_settings
from app.core.db import connect
from app.core.errors import CftError
from app.tenants import offboard, service
from app.tenants.schemas import KeyOut


def _tenant(args: argparse.Namespace) -> int:
    with connect() as conn:
        if args.action == "delete":
            return _delete(conn, args)
        if args.action == "consent":
            t = service.set_consent(conn, args.name, consent_training=args.value == "on")
            conn.commit()
            print(f"tenant {t.name}: consent_training={t.consent_training}")
        elif args.action == "create":
            row = service.create_tenant(
                conn, name=args.name, consent_training=args.consent_training
            )
            conn.commit()
            print(f"tenant {row.name} (id {row.id}, consent_training={row.consent_training})")
        else:
            for t in service.list_tenants(conn):
                print(
                    f"{t.id:>5}  {t.name:<32} consent_training={t.consent_training!s:<5}"
                    f"  live_keys={t.live_keys}"
                )
    return 0


def _delete(conn: Any, args: argparse.Namespace) -> int:
    if not args.yes:
        if not sys.stdin.isatty():
            print(
                "error: offboarding deletes everything of the tenant: pass --yes", file=sys.stderr
            )
            return 2
        typed = input(
            f"This deletes every row and artefact of tenant {args.name!r}. Type its name: "
        )
        if typed.strip() != args.name:
            print("not confirmed: nothing deleted", file=sys.stderr)
            return 2
    out = offboard.offboard(
        conn,
        tenant=args.name,
        actor=f"cli {getpass.getuser()}",
        settings=get_settings(),
        force=args.force,
        unload_timeout=args.unload_timeout,
    )
    print(json.dumps(out.model_dump(), indent=2, default=str))
    if out.status != "done":
        print("artefacts are still pending: run the same command again", file=sys.stderr)
        return 1
    return 0


def _operator(args: argparse.Namespace) -> int:
    with connect() as conn:
        if args.action == "create":
            row, key = service.create_operator_key(conn, name=args.name)
            conn.commit()
            print(key)
            print(
                f"(operator key id {row.id}, prefix {row.prefix}: shown once, only its"
                " sha256 is stored; it administers tenants over /v1/tenants)",
                file=sys.stderr,
            )
        elif args.action == "revoke":
            row = service.revoke_key(conn, args.ref)
            conn.commit()
            print(f"revoked key {row.prefix} (id {row.id})")
        else:
            for k in service.list_operator_keys(conn):
                state = f"revoked {k.revoked_at:%Y-%m-%d}" if k.revoked_at else "live"
                print(f"{k.id:>5}  {k.prefix}  {state:<18} {_used(k)}  {k.name or ''}")
    return 0


def _used(key: KeyOut) -> str:
    """When a listed key last authenticated a request (to the minute), or that it never did."""
    used = key.last_used_at
    return f"used {used:%Y-%m-%d %H:%M}" if used else f"{'never used':<21}"


def _key(args: argparse.Namespace) -> int:
    with connect() as conn:
        if args.action == "create":
            row, key = service.create_key(conn, tenant=args.tenant, role=args.role, name=args.name)
            conn.commit()
            print(key)
            print(
                f"(key id {row.id}, prefix {row.prefix}, role {row.role}: shown once,"
                " only its sha256 is stored)",
                file=sys.stderr,
            )
        elif args.action == "revoke":
            row = service.revoke_key(conn, args.ref)
            conn.commit()
            print(f"revoked key {row.prefix} (id {row.id})")
        else:
            for k in service.list_keys(conn, tenant=args.tenant):
                state = f"revoked {k.revoked_at:%Y-%m-%d}" if k.revoked_at else "live"
                print(f"{k.id:>5}  {k.prefix}  {k.role:<8} {state:<18} {_used(k)}  {k.name or ''}")
    return 0


def _guard(func: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            rc: int = func(args)
        except CftError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            return 2
        return rc

    return run


def register(sub: Any) -> None:
    """Add the tenant and key subcommands."""
    p = sub.add_parser("tenant", help="tenants: create, list, consent, delete")
    tsub = p.add_subparsers(dest="action", required=True)
    c = tsub.add_parser("create", help="create a tenant")
    c.add_argument("name")
    c.add_argument(
        "--consent-training", action="store_true", help="its traffic may enter training sets"
    )
    tsub.add_parser("list", help="list tenants")
    c = tsub.add_parser("consent", help="give (on) or withdraw (off) consent to training")
    c.add_argument("name")
    c.add_argument("value", choices=("on", "off"))
    d = tsub.add_parser(
        "delete",
        help="offboard a tenant: unload its adapters, delete all its rows and artefacts"
        " (an audit row stays); run again to finish an interrupted one",
    )
    d.add_argument("name")
    d.add_argument("--yes", action="store_true", help="do not ask for the name again")
    d.add_argument(
        "--force", action="store_true", help="delete even if an engine still has its adapters"
    )
    d.add_argument(
        "--unload-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for the reconciler to unload its adapters (default 30)",
    )
    p.set_defaults(func=_guard(_tenant))

    p = sub.add_parser("operator", help="operator keys (platform-wide): create, revoke, list")
    osub = p.add_subparsers(dest="what", required=True)
    k = osub.add_parser("key", help="operator keys")
    oksub = k.add_subparsers(dest="action", required=True)
    c = oksub.add_parser("create", help="create an operator key and print it (once)")
    c.add_argument("--name", help="a label, e.g. who holds it")
    r = oksub.add_parser("revoke", help="revoke an operator key")
    r.add_argument("ref", metavar="PREFIX_OR_ID")
    oksub.add_parser("list", help="list operator keys")
    p.set_defaults(func=_guard(_operator))

    p = sub.add_parser("key", help="API keys: create, revoke, list")
    ksub = p.add_subparsers(dest="action", required=True)
    c = ksub.add_parser("create", help="create a key and print it (once)")
    c.add_argument("--tenant", required=True, help="tenant name or id")
    c.add_argument("--role", required=True, choices=ROLES)
    c.add_argument("--name", help="a label, e.g. the service that uses the key")
    r = ksub.add_parser("revoke", help="revoke a key")
    r.add_argument("ref", metavar="PREFIX_OR_ID")
    ls = ksub.add_parser("list", help="list a tenant's keys")
    ls.add_argument("--tenant", required=True)
    p.set_defaults(func=_guard(_key))
