"""`cft tenant ...` and `cft key ...`: administer tenants and API keys."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from app.core.auth import ROLES
from app.core.db import connect
from app.core.errors import CftError
from app.tenants import service


def _tenant(args: argparse.Namespace) -> int:
    with connect() as conn:
        if args.action == "create":
            row = service.create_tenant(
                conn, name=args.name, consent_training=args.consent_training
            )
            conn.commit()
            print(
                f"tenant {row['name']} (id {row['id']}, consent_training={row['consent_training']})"
            )
        else:
            for t in service.list_tenants(conn):
                print(
                    f"{t['id']:>5}  {t['name']:<32} consent_training={t['consent_training']!s:<5}"
                    f"  live_keys={t['live_keys']}"
                )
    return 0


def _key(args: argparse.Namespace) -> int:
    with connect() as conn:
        if args.action == "create":
            row, key = service.create_key(conn, tenant=args.tenant, role=args.role, name=args.name)
            conn.commit()
            print(key)
            print(
                f"(key id {row['id']}, prefix {row['prefix']}, role {row['role']}: shown once,"
                " only its sha256 is stored)",
                file=sys.stderr,
            )
        elif args.action == "revoke":
            row = service.revoke_key(conn, args.ref)
            conn.commit()
            print(f"revoked key {row['prefix']} (id {row['id']})")
        else:
            for k in service.list_keys(conn, tenant=args.tenant):
                state = f"revoked {k['revoked_at']:%Y-%m-%d}" if k["revoked_at"] else "live"
                print(f"{k['id']:>5}  {k['prefix']}  {k['role']:<8} {state:<18} {k['name'] or ''}")
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
    p = sub.add_parser("tenant", help="tenants: create, list")
    tsub = p.add_subparsers(dest="action", required=True)
    c = tsub.add_parser("create", help="create a tenant")
    c.add_argument("name")
    c.add_argument(
        "--consent-training", action="store_true", help="its traffic may enter training sets"
    )
    tsub.add_parser("list", help="list tenants")
    p.set_defaults(func=_guard(_tenant))

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
