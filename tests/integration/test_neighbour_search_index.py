"""The neighbour search's own index (obs.prompt_embedding, one HNSW index over copies of the
log's embeddings): its edges are the exact within-radius kNN edges, and every way a log row
leaves (forgetting, retention pruning, tenant offboarding, a removed embedding) takes the copy
with it (real PostgreSQL + pgvector, no model)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.support.factories import make_log, make_route, make_tenant
from workers.embedder.model import to_halfvec
from workers.embedder.service import link_pending
from workers.maintenance.tasks import run_once

RADIUS, K = 0.2, 4


def _unit(v: list[float]) -> list[float]:
    norm = sum(x * x for x in v) ** 0.5
    return [x / norm for x in v]


def _copies(conn: Any, tenant_id: int) -> int:
    row = conn.execute(
        "SELECT count(*) AS n FROM obs.prompt_embedding WHERE tenant_id = %s", (tenant_id,)
    ).fetchone()
    return int(row["n"])


def _exact_edges(conn: Any) -> set[tuple[int, int]]:
    """Brute force over the stored embeddings: each row's K nearest of its tenant and route
    (itself excluded) within RADIUS, as (older, newer) pairs."""
    rows = conn.execute(
        "SELECT id, created_at, tenant_id, route, embedding::real[] AS v FROM obs.inference_log"
        " WHERE embedding IS NOT NULL"
    ).fetchall()
    edges = set()
    for q in rows:
        near = []
        for n in rows:
            if n["id"] == q["id"] or (n["tenant_id"], n["route"]) != (q["tenant_id"], q["route"]):
                continue
            dot = sum(a * b for a, b in zip(q["v"], n["v"], strict=True))
            norms = (sum(a * a for a in q["v"]) * sum(b * b for b in n["v"])) ** 0.5
            near.append((1 - dot / norms, n))
        near.sort(key=lambda x: x[0])
        for dist, n in near[:K]:
            if dist < RADIUS:
                ends = sorted([q, n], key=lambda r: (r["created_at"], r["id"]))
                edges.add((ends[0]["id"], ends[1]["id"]))
    return edges


def test_edges_equal_the_exact_within_radius_knn(conn):
    """Clusters of 1-8 near duplicates (some larger than K, so the k cut matters), on two routes
    of one tenant and, with the very same vectors, a second tenant: no edge crosses them."""
    rnd = random.Random(611)
    tenants = [make_tenant(conn) for _ in range(2)]
    routes = {
        t["id"]: [make_route(conn, tenant_id=t["id"])["name"] for _ in range(2)] for t in tenants
    }
    now = datetime.now(UTC)
    i = 0
    for c in range(16):
        centre = [rnd.gauss(0, 1) for _ in range(384)]
        spread = rnd.choice([0.05, 0.1, 0.15])
        for _ in range(rnd.randint(1, 8)):
            vec = to_halfvec(_unit([x + rnd.gauss(0, spread) for x in centre]))
            for t in tenants:
                make_log(
                    conn,
                    tenant_id=t["id"],
                    route=routes[t["id"]][c % 2],
                    embedding=vec,
                    created_at=now - timedelta(minutes=i),
                    fb_explicit=1,
                )
            i += 1
    assert link_pending(conn, radius=RADIUS, neighbours=K, batch_size=16) == 2 * i
    stored = conn.execute("SELECT a_id, b_id, distance FROM obs.prompt_neighbour").fetchall()
    exact = _exact_edges(conn)
    assert len(exact) > 40
    assert {(r["a_id"], r["b_id"]) for r in stored} == exact
    assert all(r["distance"] < RADIUS for r in stored)


def test_the_copy_follows_the_log_row(conn):
    """Inserted with an embedding or embedded later: copied; re-embedded: replaced; embedding
    removed: gone (and a queued row is then marked with no edges); row deleted: gone."""
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])["name"]
    a, b = to_halfvec(_unit([1.0] * 384)), to_halfvec(_unit([1.0] * 383 + [2.0]))
    first = make_log(conn, tenant_id=t["id"], route=r, embedding=a, fb_explicit=1)
    later = make_log(conn, tenant_id=t["id"], route=r, fb_explicit=-1)
    assert _copies(conn, t["id"]) == 1
    key = (later["id"], later["created_at"])
    conn.execute(
        "UPDATE obs.inference_log SET embedding = %s WHERE id = %s AND created_at = %s", (a, *key)
    )
    assert _copies(conn, t["id"]) == 2
    conn.execute(
        "UPDATE obs.inference_log SET embedding = %s WHERE id = %s AND created_at = %s", (b, *key)
    )
    copied = conn.execute(
        "SELECT e.embedding = l.embedding AS same FROM obs.prompt_embedding e"
        " JOIN obs.inference_log l ON l.id = e.log_id AND l.created_at = e.created_at"
        " WHERE e.log_id = %s",
        (later["id"],),
    ).fetchone()
    assert copied["same"]
    conn.execute(
        "UPDATE obs.inference_log SET embedding = NULL WHERE id = %s AND created_at = %s", key
    )
    assert _copies(conn, t["id"]) == 1
    assert link_pending(conn, radius=RADIUS, neighbours=K) == 2
    assert conn.execute("SELECT count(*) AS n FROM obs.prompt_neighbour").fetchone()["n"] == 0
    conn.execute(
        "DELETE FROM obs.inference_log WHERE id = %s AND created_at = %s",
        (first["id"], first["created_at"]),
    )
    assert _copies(conn, t["id"]) == 0


def test_pruning_and_offboarding_remove_the_copies(conn):
    """A dropped partition's rows (maintenance prunes their scan rows) and an offboarded
    tenant's rows leave no embedding behind."""
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])["name"]
    vec = to_halfvec(_unit([1.0] * 384))
    old = datetime.now(UTC) - timedelta(days=120)
    conn.execute("SELECT obs.create_partitions(0, %s)", (old,))
    make_log(conn, tenant_id=t["id"], route=r, embedding=vec, created_at=old, fb_edited=True)
    make_log(conn, tenant_id=t["id"], route=r, embedding=vec, fb_regen=True)
    assert _copies(conn, t["id"]) == 2
    report = run_once(conn, weeks_ahead=1, retention_days=90)
    assert report.dropped and report.neighbours_pruned >= 1
    assert _copies(conn, t["id"]) == 1

    conn.execute("SELECT auth.offboard_tenant_prepare(%s, 'test')", (t["id"],))
    conn.execute("SELECT auth.offboard_tenant(%s, 'test', true)", (t["id"],))
    assert _copies(conn, t["id"]) == 0


def _scan(conn: Any, row: dict[str, Any]) -> dict[str, Any] | None:
    return conn.execute(  # type: ignore[no-any-return]
        "SELECT candidate, radius FROM obs.prompt_neighbour_scan WHERE log_id = %s",
        (row["id"],),
    ).fetchone()


def _set(conn: Any, row: dict[str, Any], assignments: str, *args: Any) -> None:
    conn.execute(
        f"UPDATE obs.inference_log SET {assignments} WHERE id = %s AND created_at = %s",
        (*args, row["id"], row["created_at"]),
    )


def test_only_prompts_a_dataset_can_use_are_searched(conn):
    """Embedded rows without a dataset signal (no thumbs, edit or regeneration, or a PII flag)
    are neither queued nor indexed; a signal that arrives after the embedding (feedback, a
    regeneration link), or an embedding that arrives after the signal, queues the row, and its
    search finds the earlier candidates, never a row without a signal."""
    t = make_tenant(conn)
    r = make_route(conn, tenant_id=t["id"])["name"]
    vec = to_halfvec(_unit([1.0] * 384))
    near = to_halfvec(_unit([1.0] * 383 + [1.1]))
    plain = make_log(conn, tenant_id=t["id"], route=r, embedding=vec)
    neutral = make_log(conn, tenant_id=t["id"], route=r, embedding=vec, fb_explicit=0)
    pii = make_log(conn, tenant_id=t["id"], route=r, embedding=vec, fb_explicit=1, pii_flags=1)
    thumbs = make_log(conn, tenant_id=t["id"], route=r, embedding=near, fb_explicit=-1)
    for row in (plain, neutral, pii):
        assert _scan(conn, row) == {"candidate": False, "radius": None}
    assert _scan(conn, thumbs) == {"candidate": True, "radius": None}
    assert _copies(conn, t["id"]) == 1
    from workers.embedder.metrics import backlog

    assert backlog(conn)["neighbours_rows"] == 1
    assert link_pending(conn, radius=RADIUS, neighbours=K) == 1
    assert conn.execute("SELECT count(*) AS n FROM obs.prompt_neighbour").fetchone()["n"] == 0

    # The user regenerates the plain row's answer: it becomes a DPO prompt, queued and indexed,
    # and its search finds the thumbs row (not the neutral or PII rows, which are nearer).
    _set(conn, plain, "fb_regen = true")
    assert _scan(conn, plain) == {"candidate": True, "radius": None}
    assert _copies(conn, t["id"]) == 2
    assert link_pending(conn, radius=RADIUS, neighbours=K) == 1
    edges = conn.execute("SELECT a_id, b_id FROM obs.prompt_neighbour").fetchall()
    assert {(e["a_id"], e["b_id"]) for e in edges} == {(plain["id"], thumbs["id"])}

    # Feedback first, the embedding later (the embedder's UPDATE): queued then.
    later = make_log(conn, tenant_id=t["id"], route=r, fb_edited=True)
    assert _scan(conn, later) is None
    _set(conn, later, "embedding = %s", vec)
    assert _scan(conn, later) == {"candidate": True, "radius": None}
    # Signal and embedding in one UPDATE: queued once.
    both = make_log(conn, tenant_id=t["id"], route=r)
    _set(conn, both, "embedding = %s, fb_explicit = 1", vec)
    assert _scan(conn, both) == {"candidate": True, "radius": None}
    assert link_pending(conn, radius=RADIUS, neighbours=K) == 2
    assert _copies(conn, t["id"]) == 4
    # A thumb taken back leaves the row as it is (a superset is harmless); the PII row
    # unflagged becomes a candidate.
    _set(conn, thumbs, "fb_explicit = 0")
    assert _scan(conn, thumbs)["candidate"] is True
    _set(conn, pii, "pii_flags = 0")
    assert _scan(conn, pii) == {"candidate": True, "radius": None}
    assert backlog(conn)["neighbours_rows"] == 1
