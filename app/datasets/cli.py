"""`cft dataset snapshot|export|verify|refresh`: the datasets domain on the command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from app.core.db import connect, database_url
from app.core.errors import CftError
from app.datasets import formats
from app.datasets import service as datasets
from app.datasets.methods import METHODS


def register(subparsers: Any) -> None:
    """Add `cft dataset ...`."""
    p = subparsers.add_parser("dataset", help="dataset snapshots: snapshot, export, verify")
    sub = p.add_subparsers(dest="dataset_command", required=True)

    s = sub.add_parser("snapshot", help="freeze a route's traffic into a snapshot")
    s.add_argument("--tenant", required=True, help="tenant name or id")
    s.add_argument("--route", required=True)
    s.add_argument("--method", required=True, choices=METHODS)
    s.add_argument("--since", help="window start: ISO date/time or days back (e.g. 30d)")
    s.add_argument("--until", help="window end (exclusive): ISO date/time; default now")
    s.add_argument("--dedup-threshold", type=float, default=datasets.DEFAULT_DEDUP_THRESHOLD)
    s.add_argument("--eval-pct", type=int, default=datasets.DEFAULT_EVAL_PCT)
    s.add_argument("--neighbours", type=int, default=datasets.DEFAULT_NEIGHBOURS)
    s.add_argument("--no-refresh", action="store_true", help="use the views as last refreshed")
    s.set_defaults(func=_snapshot)

    e = sub.add_parser(
        "export",
        help="write a snapshot in a format a trainer reads (JSONL, or a Parquet folder)",
        description="Write one split as JSONL in --format, or (--format parquet) a folder of one"
        " Parquet file per split that datasets.load_dataset(FOLDER) reads.",
    )
    e.add_argument("snapshot_id")
    e.add_argument(
        "--format",
        choices=formats.FORMATS,
        default="cft",
        help="cft (stored TRL conversational examples), trl-conversational (sft), trl-preference"
        " (dpo, orpo, simpo), trl-unpaired-preference (kto), openai-chat (sft),"
        " openai-preference (dpo, orpo, simpo), parquet (every method)",
    )
    e.add_argument(
        "--split",
        choices=datasets.SPLITS,
        help="the split to write; default train (JSONL), every split (parquet)",
    )
    e.add_argument(
        "-o", "--output", help="file to write (a folder for parquet); default stdout (JSONL)"
    )
    e.set_defaults(func=_export)

    v = sub.add_parser("verify", help="recompute a snapshot's set hash and split")
    v.add_argument("snapshot_id")
    v.set_defaults(func=_verify)

    r = sub.add_parser("refresh", help="refresh the candidate views")
    r.add_argument(
        "--method",
        action="append",
        choices=METHODS,
        help="refresh only the view this method reads (repeatable); default: every view",
    )
    r.set_defaults(func=_refresh)


def parse_since(value: str | None) -> datetime | None:
    """`30d` (days back from now) or an ISO date/time (UTC when no zone is given)."""
    if not value:
        return None
    if value.endswith("d") and value[:-1].isdigit():
        return datetime.now(UTC) - timedelta(days=int(value[:-1]))
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _tenant_id(conn: Any, tenant: str) -> int:
    row = conn.execute(
        "SELECT id FROM tenant WHERE name = %s OR id::text = %s", (tenant, tenant)
    ).fetchone()
    if row is None:
        raise CftError(f"tenant {tenant!r} not found")
    return int(row["id"])


def _snapshot(args: argparse.Namespace) -> int:
    try:
        with connect(database_url()) as conn:
            snap = datasets.create_snapshot(
                conn,
                tenant_id=_tenant_id(conn, args.tenant),
                route=args.route,
                method=args.method,
                since=parse_since(args.since),
                until=parse_since(args.until),
                dedup_threshold=args.dedup_threshold,
                eval_pct=args.eval_pct,
                neighbours=args.neighbours,
                created_by="cli",
                refresh=not args.no_refresh,
            )
            conn.commit()
    except CftError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    out = {k: getattr(snap, k) for k in ("id", "method", "n_train", "n_eval", "set_hash", "counts")}
    print(json.dumps(out, default=str, indent=2))
    return 0


def _export(args: argparse.Namespace) -> int:
    if args.format == "parquet" and not args.output:
        print("error: --format parquet writes a folder: give it with -o", file=sys.stderr)
        return 2
    try:
        with connect(database_url()) as conn:
            if args.format == "parquet":
                counts = datasets.write_parquet(
                    conn,
                    snapshot_id=args.snapshot_id,
                    splits=[args.split] if args.split else datasets.SPLITS,
                    folder=Path(args.output),
                )
                written = ", ".join(f"{n} {split}" for split, n in counts.items()) or "nothing"
                print(f"wrote {written} examples to {args.output}", file=sys.stderr)
                return 0
            out = Path(args.output) if args.output else sys.stdout
            n = datasets.write_jsonl(
                conn,
                snapshot_id=args.snapshot_id,
                split=args.split or "train",
                out=out,
                fmt=args.format,
            )
    except CftError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    if args.output:
        print(f"wrote {n} examples to {args.output}", file=sys.stderr)
    return 0


def _verify(args: argparse.Namespace) -> int:
    try:
        with connect(database_url()) as conn:
            result = datasets.verify_snapshot(conn, snapshot_id=args.snapshot_id)
    except CftError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    print(json.dumps(dataclasses.asdict(result)))
    return 0 if result.ok else 1


def _refresh(args: argparse.Namespace) -> int:
    with connect(database_url()) as conn:
        datasets.refresh_candidates(conn, args.method)
        conn.commit()
    print(f"candidate views refreshed ({', '.join(args.method) if args.method else 'all'})")
    return 0
