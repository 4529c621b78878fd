"""The neighbour search from several sessions stores the same edges as from one, and the
embedder's backlog gauges follow the queues (real PostgreSQL + pgvector, no model: vectors are
built so that clusters of near duplicates exist)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from app.core.metrics import REGISTRY
from tests.support.factories import make_log, make_route, make_tenant
from workers.embedder.metrics import backlog
from workers.embedder.model import to_halfvec
from workers.embedder.service import link_parallel, link_pending

RADIUS, K = 0.2, 10


def _unit(v: list[float]) -> list[float]:
    norm = sum(x * x for x in v) ** 0.5
    return [x / norm for x in v]


def _traffic(conn: Any) -> None:
    """30 clusters of 1-6 near-duplicate prompts on two routes of one tenant."""
    rnd = random.Random(26)
    tenant = make_tenant(conn)
    routes = [make_route(conn, tenant_id=tenant["id"])["name"] for _ in range(2)]
    now = datetime.now(UTC)
    i = 0
    for c in range(30):
        centre = [rnd.gauss(0, 1) for _ in range(384)]
        for _ in range(rnd.randint(1, 6)):
            vec = _unit([x + rnd.gauss(0, 0.15) for x in centre])
            make_log(
                conn,
                tenant_id=tenant["id"],
                route=routes[c % 2],
                embedding=to_halfvec(vec),
                created_at=now - timedelta(minutes=i),
                fb_explicit=1,  # a dataset signal: only such rows are searched
            )
            i += 1


def _edges(conn: Any) -> set[tuple[int, int, float]]:
    rows = conn.execute("SELECT a_id, b_id, distance FROM obs.prompt_neighbour").fetchall()
    return {(r["a_id"], r["b_id"], round(r["distance"], 4)) for r in rows}


def _gauge(name: str, queue: str) -> float:
    value = REGISTRY.get_sample_value(name, {"queue": queue})
    assert value is not None
    return value


def test_parallel_sessions_store_the_same_edges_and_gauges_follow(conn, db_url):
    _traffic(conn)
    queued = conn.execute("SELECT count(*) AS n FROM obs.prompt_neighbour_scan").fetchone()["n"]
    before = backlog(conn)
    assert before["neighbours_rows"] == queued > 60
    assert before["neighbours_age"] >= 60 * (queued - 1)  # the oldest row, logged that long ago
    assert _gauge("cft_embedder_backlog_rows", "neighbours") == queued

    # batch_size 7: several batches per session, so the sessions really share the queue.
    n = link_parallel(db_url, radius=RADIUS, neighbours=K, sessions=3, batch_size=7)
    assert n == queued
    parallel = _edges(conn)
    assert len(parallel) > 30
    after = backlog(conn)
    assert after["neighbours_rows"] == 0 and after["neighbours_age"] == 0
    assert _gauge("cft_embedder_backlog_age_seconds", "neighbours") == 0

    # The same queue searched again from one session, in batches of another size.
    conn.execute("DELETE FROM obs.prompt_neighbour")
    conn.execute(
        "UPDATE obs.prompt_neighbour_scan SET radius = NULL, max_neighbours = NULL,"
        " prompt_hash = NULL, scanned_at = NULL"
    )
    assert link_pending(conn, radius=RADIUS, neighbours=K, batch_size=50) == queued
    assert _edges(conn) == parallel
