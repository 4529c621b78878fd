"""Snapshot rules: freeze candidates into train.dataset_snapshot and export them.

The work happens in SQL (sql/train/create_snapshot.sql); this module calls it in the
caller's transaction (a savepoint, retried when a concurrent refresh moved the candidates)
and reads the frozen rows back. Example formats (TRL conversational):
sft `{"messages"}`, dpo/orpo/simpo `{"prompt", "chosen", "rejected"}`, kto
`{"prompt", "completion", "label"}`; exports also write the formats other trainers read
(formats.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import psycopg

from app.core.db import Connection
from app.core.errors import BadRequest, Conflict, Forbidden, NotFound
from app.datasets import formats
from app.datasets.methods import METHODS
from app.datasets.schemas import SnapshotOut

SPLITS = ("train", "eval")
DEFAULT_DEDUP_THRESHOLD = 0.1
DEFAULT_EVAL_PCT = 10
DEFAULT_NEIGHBOURS = 10
SNAPSHOT_FUNCTION = "train.create_snapshot"
# A snapshot not taken with refresh=True reads its candidate view twice (keys, then the
# survivors' rows); a REFRESH ... CONCURRENTLY committed in between is detected and reported as
# serialization_failure, nothing kept. Taken again, it reads the refreshed view.
SNAPSHOT_ATTEMPTS = 3

_SNAPSHOT_COLUMNS = (
    "id, tenant_id, route, method, query_sql, params, counts, n_train, n_eval, set_hash,"
    " created_by, created_at, tainted_at, tainted_reason"
)


@dataclass(frozen=True)
class SnapshotCheck:
    """A snapshot's stored examples checked again (train.verify_snapshot): each *_ok says
    whether the recomputed value equals the stored one."""

    set_hash_ok: bool
    examples_ok: bool
    split_ok: bool
    n_examples: int

    @property
    def ok(self) -> bool:
        """Every check holds."""
        return self.set_hash_ok and self.examples_ok and self.split_ok


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise BadRequest(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")


def refresh_candidates(conn: Connection, methods: Sequence[str] | None = None) -> None:
    """Refresh the candidate materialised views the methods read, all of them when None
    (CONCURRENTLY: readers are not blocked)."""
    for method in methods or ():
        _check_method(method)
    conn.execute(
        "SELECT train.refresh_dataset_candidates(%s::text[])",
        (list(methods) if methods is not None else None,),
    )


def create_snapshot(
    conn: Connection,
    *,
    tenant_id: int,
    route: str,
    method: str,
    since: datetime | None = None,
    until: datetime | None = None,
    dedup_threshold: float = DEFAULT_DEDUP_THRESHOLD,
    eval_pct: int = DEFAULT_EVAL_PCT,
    neighbours: int = DEFAULT_NEIGHBOURS,
    created_by: str | None = None,
    refresh: bool = True,
) -> SnapshotOut:
    """Build, deduplicate, split and freeze one snapshot; returns its row (without examples)."""
    _check_method(method)
    args = (
        tenant_id,
        route,
        method,
        since,
        until,
        dedup_threshold,
        eval_pct,
        neighbours,
        created_by,
    )
    try:
        for attempt in range(1, SNAPSHOT_ATTEMPTS + 1):
            try:
                with conn.transaction():
                    if refresh:  # only the view this method reads
                        refresh_candidates(conn, [method])
                    row = conn.execute(
                        f"SELECT {_SNAPSHOT_COLUMNS} FROM {SNAPSHOT_FUNCTION}("
                        "%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        args,
                    ).fetchone()
                break
            except psycopg.errors.SerializationFailure as exc:
                if attempt == SNAPSHOT_ATTEMPTS:
                    raise Conflict(
                        f"{_first_line(exc)} ({attempt} attempts)", code="snapshot_conflict"
                    ) from exc
    except psycopg.errors.NoDataFound as exc:
        raise NotFound(_first_line(exc), code="route_not_found") from exc
    except psycopg.errors.InvalidParameterValue as exc:
        raise BadRequest(_first_line(exc), code="invalid_value") from exc
    except psycopg.errors.InsufficientPrivilege as exc:
        raise Forbidden(_first_line(exc)) from exc
    assert row is not None
    return SnapshotOut.model_validate(_as_dict(row))


def get_snapshot(conn: Connection, *, snapshot_id: str) -> SnapshotOut | None:
    """One snapshot (visible to the connection's tenant under RLS), or None."""
    try:
        row = conn.execute(
            f"SELECT {_SNAPSHOT_COLUMNS} FROM train.dataset_snapshot WHERE id = %s",
            (snapshot_id,),
        ).fetchone()
    except psycopg.errors.InvalidTextRepresentation:
        return None
    return SnapshotOut.model_validate(_as_dict(row)) if row else None


def get_snapshot_or_raise(
    conn: Connection, *, snapshot_id: str, tenant_id: int | None = None
) -> SnapshotOut:
    """One snapshot, or NotFound (also when it belongs to another tenant)."""
    snap = get_snapshot(conn, snapshot_id=snapshot_id)
    if snap is None or (tenant_id is not None and snap.tenant_id != tenant_id):
        raise NotFound(f"dataset snapshot {snapshot_id} not found", code="snapshot_not_found")
    return snap


def verify_snapshot(conn: Connection, *, snapshot_id: str) -> SnapshotCheck:
    """Recompute set_hash, example hashes and split from the stored examples."""
    row = conn.execute("SELECT * FROM train.verify_snapshot(%s)", (snapshot_id,)).fetchone()
    if row is None:
        raise NotFound(f"dataset snapshot {snapshot_id} not found", code="snapshot_not_found")
    return SnapshotCheck(**_as_dict(row))


def iter_examples(conn: Connection, *, snapshot_id: str, split: str) -> Iterator[dict[str, Any]]:
    """The examples of one split in a stable order (by example hash)."""
    if split not in SPLITS:
        raise BadRequest(f"unknown split {split!r}: choose train or eval")
    cur = conn.cursor()
    cur.execute(
        "SELECT example FROM train.dataset_example WHERE snapshot_id = %s AND split = %s"
        " ORDER BY example_hash",
        (snapshot_id, split),
    )
    for row in cur:
        example = row["example"] if isinstance(row, dict) else row[0]
        yield example


def export_snapshot(conn: Connection, *, snapshot_id: str, split: str) -> list[dict[str, Any]]:
    """The examples of one split of a snapshot, in TRL's conversational format."""
    get_snapshot_or_raise(conn, snapshot_id=str(snapshot_id))
    return list(iter_examples(conn, snapshot_id=str(snapshot_id), split=split))


def export_lines(
    conn: Connection,
    *,
    snapshot_id: str,
    split: str,
    fmt: str = "cft",
    tenant_id: int | None = None,
) -> list[str]:
    """One split as JSONL lines in fmt (BadRequest when fmt does not fit the snapshot)."""
    snap = get_snapshot_or_raise(conn, snapshot_id=str(snapshot_id), tenant_id=tenant_id)
    formats.check(fmt, snap.method)
    if fmt == "parquet":
        raise BadRequest("parquet is not a JSONL format", code="format_mismatch", param="format")
    examples = iter_examples(conn, snapshot_id=str(snapshot_id), split=split)
    return list(formats.jsonl_lines(fmt, examples))


def export_parquet(
    conn: Connection, *, snapshot_id: str, split: str, tenant_id: int | None = None
) -> bytes:
    """One split as a Parquet file."""
    get_snapshot_or_raise(conn, snapshot_id=str(snapshot_id), tenant_id=tenant_id)
    return formats.parquet_bytes(iter_examples(conn, snapshot_id=str(snapshot_id), split=split))


def write_jsonl(
    conn: Connection, *, snapshot_id: str, split: str, out: Path | IO[str], fmt: str = "cft"
) -> int:
    """Write one split as JSONL in fmt (a path or an open text file); returns the number of
    lines."""
    lines = export_lines(conn, snapshot_id=str(snapshot_id), split=split, fmt=fmt)
    if isinstance(out, Path):
        with out.open("w", encoding="utf-8") as fh:
            fh.writelines(lines)
    else:
        out.writelines(lines)
    return len(lines)


def write_parquet(
    conn: Connection, *, snapshot_id: str, splits: Sequence[str], folder: Path
) -> dict[str, int]:
    """Write the splits as a folder `datasets.load_dataset(folder)` reads (formats.py); returns
    the examples written per split (a split without examples is left out)."""
    get_snapshot_or_raise(conn, snapshot_id=str(snapshot_id))
    rows = {s: list(iter_examples(conn, snapshot_id=str(snapshot_id), split=s)) for s in splits}
    return formats.write_parquet_folder(folder, rows)


def _first_line(exc: BaseException) -> str:
    diag = getattr(exc, "diag", None)
    message = getattr(diag, "message_primary", None)
    return str(message or str(exc).splitlines()[0])


def _as_dict(row: Any) -> dict[str, Any]:
    return dict(row) if isinstance(row, dict) else dict(row._asdict())
