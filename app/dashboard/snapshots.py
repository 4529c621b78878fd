"""Dataset snapshots: the list, and one snapshot's page with the count after each filter and
dedup step (train.dataset_snapshot.counts, written by train.create_snapshot) and a browser over
its examples (train.dataset_example, keyset-paginated by example hash, text escaped)."""

from __future__ import annotations

import json
from html import escape
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.dashboard.layout import (
    PoolDep,
    link,
    login_page,
    not_found,
    num,
    page,
    pill,
    reader,
    tenant,
    when,
)
from app.datasets import service as datasets

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


@router.get("/dashboard/snapshots")
def snapshots_page(request: Request, pool: PoolDep) -> Response:
    """The tenant's snapshots, newest first, with their first and last counts."""
    key = reader(request, pool)
    if key is None:
        return login_page()
    with tenant(key, pool) as conn:
        snaps = conn.execute(
            "SELECT id, route, method, counts, n_train, n_eval, set_hash, created_by, created_at,"
            " tainted_at FROM train.dataset_snapshot ORDER BY created_at DESC, id LIMIT 200"
        ).fetchall()
    rows = "".join(
        f'<tr class="snapshot"><td>{link(ACTIVE, str(s["id"]), text=str(s["id"])[:8])}</td>'
        f"<td>{escape(s['route'])}</td><td>{escape(s['method'])}</td>"
        f"<td class=n>{num(s['counts'].get('view_rows'))}</td><td class=n>{s['n_train']}</td>"
        f"<td class=n>{s['n_eval']}</td><td>{when(s['created_at'])}</td>"
        f"<td>{escape(s['created_by'] or '')}</td>"
        f"<td>{pill('failed') + ' tainted' if s['tainted_at'] else ''}</td></tr>"
        for s in snaps
    )
    body = (
        "<section><h2>Dataset snapshots</h2><table><tr><th>snapshot</th><th>route</th>"
        "<th>method</th><th class=n>candidates</th><th class=n>train</th><th class=n>eval</th>"
        "<th>created</th><th>by</th><th></th></tr>"
        f"{rows or '<tr><td colspan=9>no snapshots</td></tr>'}</table></section>"
    )
    return page("snapshots", body, active=ACTIVE)


def _funnel(snap: dict[str, Any]) -> str:
    counts, step_ms = snap["counts"], (snap["params"] or {}).get("step_ms") or {}
    steps = [(k, label, counts.get(k)) for k, label in STEPS if k in counts]
    steps.append(("examples", "examples written (train + eval)", snap["n_train"] + snap["n_eval"]))
    top = max([int(n) for _, _, n in steps if n is not None] + [1])
    rows, prev = [], None
    for k, label, n in steps:
        dropped = "" if prev is None or n is None else f"−{prev - n}" if prev > n else "0"
        width = 300 * (n or 0) / top
        ms = step_ms.get(k)
        rows.append(
            f'<tr class="step" data-step="{k}"><td>{escape(k)}</td><td>{escape(label)}</td>'
            f'<td class=n>{num(n)}</td><td class=n>{dropped}</td><td><span class="bar" '
            f'style="width:{width:.0f}px"></span></td>'
            f"<td class=n>{f'{ms} ms' if ms is not None else ''}</td></tr>"
        )
        prev = n if n is not None else prev
    extra = " · ".join(f"{k} {num(counts[k])}" for k in EXTRA if k in counts)
    return (
        "<table id=funnel><tr><th>step</th><th>rows left</th><th class=n>count</th>"
        f"<th class=n>dropped</th><th></th><th class=n>took</th></tr>{''.join(rows)}</table>"
        + (f'<p class="muted">{extra}</p>' if extra else "")
    )


def _messages(value: Any) -> str:
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value):
        return "\n".join(f"{m['role']}: {m.get('content', '')}" for m in value)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _example(row: dict[str, Any]) -> str:
    ex = row["example"] if isinstance(row["example"], dict) else {"example": row["example"]}
    parts = "".join(
        f'<div><b>{escape(k)}</b><pre class="text">{escape(_messages(v))}</pre></div>'
        for k, v in ex.items()
    )
    return (
        f'<tr class="example"><td><code>{row["example_hash"].hex()[:12]}</code></td>'
        f"<td>{escape(row['split'])}</td><td class=muted>{escape(str(row['log_ids'])[:80])}</td>"
        f"<td>{parts}</td></tr>"
    )


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
        return login_page()
    split = split if split in ("train", "eval") else None
    a, b = _hash(after), _hash(before)
    try:
        UUID(snapshot_id)
    except ValueError:
        return not_found(f"snapshot {snapshot_id}", ACTIVE)
    with tenant(key, pool) as conn:
        snap = datasets.get_snapshot(conn, snapshot_id=snapshot_id)
        if snap is None:
            return not_found(f"snapshot {snapshot_id}", ACTIVE)
        rows = _page_of_examples(conn, snapshot_id, split, a, None if a else b)
        runs = conn.execute(
            "SELECT id, status FROM train.training_run WHERE snapshot_id = %s ORDER BY created_at",
            (snapshot_id,),
        ).fetchall()
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    if b is not None and a is None:
        rows.reverse()  # fetched newest-first below `before`
    params = snap["params"] or {}
    facts = [
        ("route", escape(snap["route"])),
        ("method", escape(snap["method"])),
        ("train / eval", f"{snap['n_train']} / {snap['n_eval']}"),
        (
            "window",
            f"{escape(str(params.get('since', '–'))[:19])} → "
            f"{escape(str(params.get('until', '–'))[:19])}",
        ),
        ("dedup threshold", num(params.get("dedup_threshold"))),
        ("eval share", f"{num(params.get('eval_pct'))} %"),
        ("set hash", f"<code>{escape((snap['set_hash'] or '–')[:16])}</code>"),
        ("created", f"{when(snap['created_at'])} by {escape(snap['created_by'] or '?')}"),
        (
            "training runs",
            " ".join(link("/dashboard/runs", str(r["id"]), text=str(r["id"])[:8]) for r in runs)
            or "–",
        ),
    ]
    if snap["tainted_at"]:
        facts.append(
            ("tainted", f"{when(snap['tainted_at'])}: {escape(snap['tainted_reason'] or '')}")
        )
    base = f"{ACTIVE}/{snapshot_id}"
    splits = " · ".join(
        link(base, text=label, split=v)
        for v, label in ((None, "all"), ("train", "train"), ("eval", "eval"))
    )
    backward = b is not None and a is None
    has_prev = more if backward else a is not None
    has_next = True if backward else more
    pager = []
    if a is not None or b is not None:
        pager.append(link(base, text="« first", split=split))
    if rows and has_prev:
        pager.append(
            link(base, text="‹ previous", split=split, before=rows[0]["example_hash"].hex())
        )
    if rows and has_next:
        pager.append(link(base, text="next ›", split=split, after=rows[-1]["example_hash"].hex()))
    body = (
        f'<section><h2>Snapshot {escape(str(snap["id"]))}</h2><div class="facts">'
        + "".join(f"<div><b>{k}</b> {v}</div>" for k, v in facts)
        + f"</div></section><section><h2>Filter and dedup steps</h2>{_funnel(snap)}"
        f"<details><summary>candidate query</summary><pre class=text>{escape(snap['query_sql'])}"
        f"</pre></details></section><section><h2>Examples</h2><p>{splits}</p>"
        "<table id=examples><tr><th>hash</th><th>split</th><th>log ids</th><th>example</th></tr>"
        + ("".join(_example(r) for r in rows) or "<tr><td colspan=4>no examples</td></tr>")
        + f'</table><div class="pager">{"".join(pager)}</div></section>'
    )
    return page(f"snapshot {str(snap['id'])[:8]}", body, active=ACTIVE)
