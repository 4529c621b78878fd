"""One embedding pass: claim rows without an embedding, embed their prompts, write them back;
then search the near duplicates of the newly embedded rows (obs.compute_prompt_neighbours)."""

from __future__ import annotations

import threading

from app.core.db import Connection, connect
from workers.embedder.metrics import EMBEDDER_ROWS
from workers.embedder.model import Encoder, prompt_text, to_halfvec

# Newest first: fresh traffic is what the next snapshot needs. SKIP LOCKED lets several
# embedders share the backlog; `embedding IS NULL` in the UPDATE keeps a pass idempotent.
_CLAIM = """
SELECT id, created_at, messages FROM obs.inference_log
 WHERE embedding IS NULL
 ORDER BY created_at DESC
 LIMIT %s
 FOR UPDATE SKIP LOCKED
"""
_WRITE = """
UPDATE obs.inference_log l SET embedding = v.embedding
  FROM unnest(%s::bigint[], %s::timestamptz[], %s::halfvec[]) AS v(id, created_at, embedding)
 WHERE l.id = v.id AND l.created_at = v.created_at AND l.embedding IS NULL
"""


def embed_batch(conn: Connection, encoder: Encoder, *, batch_size: int) -> int:
    """Embed up to batch_size pending rows in one transaction; returns how many were written."""
    with conn.transaction():
        rows = conn.execute(_CLAIM, (batch_size,)).fetchall()
        if not rows:
            return 0
        vectors = encoder([prompt_text(r["messages"]) for r in rows])
        cur = conn.execute(
            _WRITE,
            (
                [r["id"] for r in rows],
                [r["created_at"] for r in rows],
                [to_halfvec(v) for v in vectors],
            ),
        )
    EMBEDDER_ROWS.labels("embedded").inc(cur.rowcount)
    return cur.rowcount


def embed_pending(
    conn: Connection, encoder: Encoder, *, batch_size: int = 256, limit: int | None = None
) -> int:
    """Embed batches until nothing is pending (or limit rows are done); returns the total."""
    total = 0
    while limit is None or total < limit:
        size = batch_size if limit is None else min(batch_size, limit - total)
        n = embed_batch(conn, encoder, batch_size=size)
        if n == 0:
            break
        total += n
    return total


def link_batch(conn: Connection, *, radius: float, neighbours: int, batch_size: int) -> int:
    """Search the neighbours of up to batch_size queued rows in one transaction (one statement);
    returns how many rows were marked searched."""
    with conn.transaction():
        row = conn.execute(
            "SELECT obs.compute_prompt_neighbours(%s, %s, %s) AS n",
            (radius, neighbours, batch_size),
        ).fetchone()
    n = int(row["n"] if isinstance(row, dict) else row[0]) if row else 0
    EMBEDDER_ROWS.labels("searched").inc(n)
    return n


def link_pending(conn: Connection, *, radius: float, neighbours: int, batch_size: int = 256) -> int:
    """Drain the neighbour queue (rows embedded but not searched); returns the total."""
    total = 0
    while n := link_batch(conn, radius=radius, neighbours=neighbours, batch_size=batch_size):
        total += n
    return total


def link_parallel(
    url: str, *, radius: float, neighbours: int, sessions: int, batch_size: int = 256
) -> int:
    """Drain the neighbour queue from `sessions` connections at once; returns the total.

    Each session claims its own rows (FOR UPDATE SKIP LOCKED) and commits each batch; edges
    are inserted in one global order, so sessions sharing an edge cannot deadlock. The HNSW
    probes are CPU-bound in PostgreSQL: sessions up to the server's cores add throughput."""
    done: list[int] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with connect(url, autocommit=True) as conn:
                done.append(
                    link_pending(conn, radius=radius, neighbours=neighbours, batch_size=batch_size)
                )
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(max(1, sessions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(done)


def embed_and_link(
    conn: Connection,
    encoder: Encoder,
    *,
    radius: float,
    neighbours: int,
    batch_size: int = 256,
    limit: int | None = None,
) -> tuple[int, int]:
    """Embed a batch, commit, search its neighbours, repeat until nothing is pending.

    The search runs after the embeddings are committed (so two concurrent embedders cannot
    miss each other's rows) and also takes rows a crash or an earlier pass left queued.
    Returns (rows embedded, rows searched)."""
    embedded = linked = 0
    while True:
        size = batch_size if limit is None else min(batch_size, limit - embedded)
        n = embed_batch(conn, encoder, batch_size=size) if size > 0 else 0
        m = link_batch(conn, radius=radius, neighbours=neighbours, batch_size=batch_size)
        embedded += n
        linked += m
        if n == 0 and m == 0:
            return embedded, linked
