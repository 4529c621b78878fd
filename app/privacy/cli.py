"""`cft user forget --tenant T USER`: the right to be forgotten on the command line."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from app.core.db import as_tenant, connect
from app.core.errors import CftError
from app.core.pseudonym import user_secret
from app.privacy import service
from app.tenants import service as tenants


def _forget(args: argparse.Namespace) -> int:
    try:
        with connect() as conn:
            tenant = tenants.get_tenant_or_raise(conn, args.tenant)
            as_tenant(conn, tenant.id)
            row = service.forget_user(conn, user=args.user, secret=user_secret())
            conn.commit()
    except CftError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    print(
        f"forgot user {row.user_hash[:16]}… of tenant {tenant.name}:"
        f" {row.logs_deleted} log rows and {row.request_keys_deleted} request keys deleted,"
        f" {row.snapshots_tainted} snapshots and {row.adapters_tainted} adapters tainted"
        f" (forget request {row.id})"
    )
    return 0


def register(sub: Any) -> None:
    """Add `cft user forget`."""
    p = sub.add_parser("user", help="end users of a tenant: forget")
    usub = p.add_subparsers(dest="action", required=True)
    f = usub.add_parser(
        "forget", help="delete a user's logs; taint snapshots/adapters built on them"
    )
    f.add_argument("--tenant", required=True, help="tenant name or id")
    f.add_argument("user", help="the user id the product sent as `user` (hashed, never stored)")
    f.set_defaults(func=_forget)
