"""Dataset snapshots: the list, and one snapshot's page with the count after each filter and
dedup step (train.dataset_snapshot.counts, written by train.create_snapshot) and a browser over
its examples (train.dataset_example, keyset-paginated by example hash, text escaped)."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.dashboard.layout import PoolDep, login_page, not_found, page, reader, tenant
from app.dashboard.templating import num, url
from app.datasets import service as datasets
from app.datasets.schemas import SnapshotOut

router = APIRouter(include_in_schema=False)

ACTIVE = "/dashboard/snapshots"
PAGE_SIZE = 20
# The steps of train.create_snapshot, in order, with what each one drops.
STEPS = (
    ("view_rows", "candidate view rows (this route)"),
    ("in_window", "created in the window"),
    ("live_ok", "not deleted or flagged since"),
    ("exact_dedup", "after exact dedup (normalised prompt)"),
    ("semantic_dedup", "after semantic dedup (embedding neighbours)"),
)
EXTRA = ("without_embedding", "searched_rows", "probed_live")
SPLITS = ((None, "all"), ("train", "train"), ("eval", "eval"))


@router.get("/dashboard/snapshots")
def snapshots_page(request: Request, pool: PoolDep) -> Response:
    """The tenant's snapshots, newest first, with their first and last counts."""
    key = reader(request, pool)
    if key is None:
        return login_page(request)
    with tenant(key, pool) as conn:
        snaps = conn.execute(
            "SELECT id, route, method, counts, n_train, n_eval, set_hash, created_by, created_at,"
            " tainted_at FROM train.dataset_snapshot ORDER BY created_at DESC, id LIMIT 200"
        ).fetchall()
    return page(request, "snapshots.html", title="snapshots", active=ACTIVE, snaps=snaps)


def _funnel(snap: SnapshotOut) -> dict[str, Any]:
    """The count after each step of train.create_snapshot, what each dropped, how long it took."""
    counts, step_ms = snap.counts, (snap.params or {}).get("step_ms") or {}
    steps = [(k, label, counts.get(k)) for k, label in STEPS if k in counts]
    steps.append(("examples", "examples written (train + eval)", snap.n_train + snap.n_eval))
    top = max([int(n) for _, _, n in steps if n is not None] + [1])
    rows, prev = [], None
    for k, label, n in steps:
        dropped = "" if prev is None or n is None else f"−{prev - n}" if prev > n else "0"
        ms = step_ms.get(k)
        rows.append(
            {
                "key": k,
                "label": label,
                "n": n,
                "dropped": dropped,
                "width": f"{300 * (n or 0) / top:.0f}",
                "took": f"{ms} ms" if ms is not None else "",
            }
        )
        prev = n if n is not None else prev
    extra = " · ".join(f"{k} {num(counts[k])}" for k in EXTRA if k in counts)
    return {"rows": rows, "extra": extra}


def _messages(value: Any) -> str:
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value):
        return "\n".join(f"{m['role']}: {m.get('content', '')}" for m in value)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _example(row: dict[str, Any]) -> dict[str, Any]:
    """One example as shown: its hash, split, source log ids and each field's text."""
    ex = row["example"] if isinstance(row["example"], dict) else {"example": row["example"]}
    return {
        "hash": row["example_hash"].hex()[:12],
        "split": row["split"],
        "log_ids": str(row["log_ids"])[:80],
        "parts": [(k, _messages(v)) for k, v in ex.items()],
    }


def _page_of_examples(
    conn: Any, snapshot_id: str, split: str | None, after: bytes | None, before: bytes | None
) -> list[dict[str, Any]]:
    """One page in example-hash order, after or before a hash (keyset), PAGE_SIZE + 1 rows."""
    where, args = ["snapshot_id = %s"], [snapshot_id]
    if split:
        where.append("split = %s")
        args.append(split)
    if after is not None:
        where.append("example_hash > %s")
        args.append(after)  # type: ignore[arg-type]
    if before is not None:
        where.append("example_hash < %s")
        args.append(before)  # type: ignore[arg-type]
    order = "DESC" if before is not None else ""
    rows = conn.execute(
        "SELECT example_hash, split, log_ids, example FROM train.dataset_example"
        f" WHERE {' AND '.join(where)} ORDER BY example_hash {order} LIMIT {PAGE_SIZE + 1}",
        args,
    ).fetchall()
    return rows  # type: ignore[no-any-return]


def _hash(value: str | None) -> bytes | None:
    try:
        return bytes.fromhex(value) if value else None
    except ValueError:
        return None


@router.get("/dashboard/snapshots/{snapshot_id}")
def snapshot_page(
    snapshot_id: str,
    request: Request,
    pool: PoolDep,
    split: str | None = None,
    after: str | None = None,
    before: str | None = None,
) -> Response:
    """One snapshot: counts after each step, its parameters and query, a page of examples."""
    key = reader(request, pool)
    if key is None:
        return login_page(request)
    split = split if split in ("train", "eval") else None
    a, b = _hash(after), _hash(before)
    try:
        UUID(snapshot_id)
    except ValueError:
        return not_found(request, f"snapshot {snapshot_id}", ACTIVE)
    with tenant(key, pool) as conn:
        snap = datasets.get_snapshot(conn, snapshot_id=snapshot_id)
        if snap is None:
            return not_found(request, f"snapshot {snapshot_id}", ACTIVE)
        rows = _page_of_examples(conn, snapshot_id, split, a, None if a else b)
        runs = conn.execute(
            "SELECT id, status FROM train.training_run WHERE snapshot_id = %s ORDER BY created_at",
            (snapshot_id,),
        ).fetchall()
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    if b is not None and a is None:
        rows.reverse()  # fetched newest-first below `before`
    base = f"{ACTIVE}/{snapshot_id}"
    backward = b is not None and a is None
    has_prev = more if backward else a is not None
    has_next = True if backward else more
    pager = []
    if a is not None or b is not None:
        pager.append((url(base, split=split), "« first"))
    if rows and has_prev:
        pager.append((url(base, split=split, before=rows[0]["example_hash"].hex()), "‹ previous"))
    if rows and has_next:
        pager.append((url(base, split=split, after=rows[-1]["example_hash"].hex()), "next ›"))
    return page(
        request,
        "snapshot.html",
        title=f"snapshot {str(snap.id)[:8]}",
        active=ACTIVE,
        snap=snap,
        params=snap.params or {},
        runs=runs,
        funnel=_funnel(snap),
        splits=[(url(base, split=v), label) for v, label in SPLITS],
        examples=[_example(r) for r in rows],
        pager=pager,
    )
