"""Near duplicates found at embedding time (obs.prompt_neighbour) and used by snapshots, on real
PostgreSQL + pgvector with the real embedding model."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from app.datasets import service as datasets
from app.datasets.schemas import SnapshotOut
from tests.support.embeddings import encoder
from tests.support.factories import make_log, make_route, make_tenant
from workers.embedder.model import to_halfvec
from workers.embedder.service import embed_and_link, embed_pending, link_pending

RADIUS = 0.2
K = 10
PARAPHRASES = [
    "How do I reset my password?",
    "How can I reset my password?",
    "What's the way to reset my password?",
    "I forgot my password, how do I reset it?",
]
DISTINCT = [
    "What is the capital of France?",
    "How do I change my email address?",
    "Cancel my subscription please",
]
HNSW_SCANS = """SELECT coalesce(sum(s.idx_scan), 0) AS n FROM pg_stat_user_indexes s
                 JOIN pg_class c ON c.oid = s.indexrelid JOIN pg_am a ON a.oid = c.relam
                WHERE a.amname = 'hnsw' AND s.schemaname = 'obs'"""


def _user(text: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a support bot."},
        {"role": "user", "content": text},
    ]


def _traffic(conn: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[int]]:
    """Four paraphrases (only the oldest upvoted), three unrelated questions, and one
    paraphrase on another route of the same tenant."""
    tenant = make_tenant(conn)
    route = make_route(conn, tenant_id=tenant["id"])
    other = make_route(conn, tenant_id=tenant["id"])
    now = datetime.now(UTC)
    ids = []
    for i, text in enumerate(PARAPHRASES):
        row = make_log(
            conn,
            tenant_id=tenant["id"],
            route=route["name"],
            messages=_user(text),
            completion=f"p{i}",
            fb_explicit=1 if i == 0 else -1,
            created_at=now - timedelta(hours=10 - i),
        )
        ids.append(row["id"])
    for text in DISTINCT:
        make_log(
            conn,
            tenant_id=tenant["id"],
            route=route["name"],
            messages=_user(text),
            completion="d",
            fb_explicit=-1,
        )
    make_log(
        conn,
        tenant_id=tenant["id"],
        route=other["name"],
        messages=_user(PARAPHRASES[1]),
        completion="o",
        fb_explicit=1,
    )
    return tenant, route, other, ids


def _edges(conn: Any) -> set[tuple[int, int]]:
    return {(r["a_id"], r["b_id"]) for r in conn.execute("SELECT * FROM obs.prompt_neighbour")}


def _snapshot(conn: Any, tenant: dict[str, Any], route: dict[str, Any], **kw: Any) -> SnapshotOut:
    return datasets.create_snapshot(
        conn, tenant_id=tenant["id"], route=route["name"], method="kto", **kw
    )


def _kept(conn: Any, snap: SnapshotOut) -> dict[str, str]:
    examples = datasets.export_snapshot(conn, snapshot_id=str(snap.id), split="train")
    examples += datasets.export_snapshot(conn, snapshot_id=str(snap.id), split="eval")
    return {e["prompt"][-1]["content"]: e["completion"][0]["content"] for e in examples}


def _hnsw_scans(conn: Any) -> int:
    conn.execute("SELECT pg_stat_force_next_flush()")
    return int(conn.execute(HNSW_SCANS).fetchone()["n"])


def test_embed_worker_stores_paraphrase_edges_once(conn):
    tenant, route, _other, ids = _traffic(conn)
    assert embed_and_link(conn, encoder(), radius=RADIUS, neighbours=K, batch_size=3) == (8, 8)

    rows = conn.execute(
        "SELECT e.*, a.messages AS a_messages FROM obs.prompt_neighbour e"
        " JOIN obs.inference_log a ON a.id = e.a_id AND a.created_at = e.a_created_at"
    ).fetchall()
    # Every pair of the four paraphrases, once, older end first; nothing else is near.
    assert {(r["a_id"], r["b_id"]) for r in rows} == {
        (ids[i], ids[j]) for i in range(4) for j in range(i + 1, 4)
    }
    assert all(0 < r["distance"] < 0.1 for r in rows)
    assert all(r["tenant_id"] == tenant["id"] and r["route"] == route["name"] for r in rows)
    marks = conn.execute(
        "SELECT s.radius, s.max_neighbours, s.prompt_hash = train.prompt_hash(l.messages) AS ok"
        " FROM obs.prompt_neighbour_scan s"
        " JOIN obs.inference_log l ON l.id = s.log_id AND l.created_at = s.created_at"
    ).fetchall()
    assert len(marks) == 8 and all(
        m["radius"] == RADIUS and m["max_neighbours"] == K and m["ok"] for m in marks
    )

    # Idempotent: nothing pending; searching the same rows again adds no edge.
    before = _edges(conn)
    assert embed_and_link(conn, encoder(), radius=RADIUS, neighbours=K) == (0, 0)
    conn.execute("UPDATE obs.prompt_neighbour_scan SET radius = NULL")
    assert link_pending(conn, radius=RADIUS, neighbours=K) == 8
    assert _edges(conn) == before


def test_a_crash_between_embedding_and_search_is_picked_up(conn):
    _tenant, _route, _other, ids = _traffic(conn)
    # The embeddings are committed, the search never ran (the worker died in between).
    assert embed_pending(conn, encoder(), batch_size=4) == 8
    pending = conn.execute(
        "SELECT count(*) AS n FROM obs.prompt_neighbour_scan WHERE radius IS NULL"
    ).fetchone()
    assert pending["n"] == 8 and _edges(conn) == set()
    # The next pass has nothing to embed but takes the queue.
    assert embed_and_link(conn, encoder(), radius=RADIUS, neighbours=K) == (0, 8)
    assert len(_edges(conn)) == 6 and {ids[0], ids[3]} <= {i for e in _edges(conn) for i in e}


def test_snapshot_drops_the_worse_paraphrases_through_edges_without_probes(conn):
    tenant, route, _other, _ids = _traffic(conn)
    embed_and_link(conn, encoder(), radius=RADIUS, neighbours=K)
    datasets.refresh_candidates(conn)

    before = _hnsw_scans(conn)
    snap = _snapshot(conn, tenant, route, dedup_threshold=0.1, refresh=False)
    assert _hnsw_scans(conn) == before  # no index probe at snapshot time
    counts = snap.counts
    assert counts["exact_dedup"] == 7 and counts["semantic_dedup"] == 4
    assert counts["probed_live"] == 0 and counts["searched_rows"] == 7
    assert _kept(conn, snap) == {PARAPHRASES[0]: "p0", **{t: "d" for t in DISTINCT}}
    assert "FROM obs.prompt_neighbour e" in snap.params["semantic_dedup"]

    # A threshold below every stored distance keeps all seven, still without probes.
    strict = _snapshot(conn, tenant, route, dedup_threshold=0.004, refresh=False)
    assert strict.counts["semantic_dedup"] == 7 and strict.counts["probed_live"] == 0


def test_an_edge_to_an_exact_duplicate_counts_for_its_survivor(conn):
    tenant, route, _other, ids = _traffic(conn)
    embed_and_link(conn, encoder(), radius=RADIUS, neighbours=K)
    # Keep only the edges of the worst paraphrase, then add an exact duplicate (case and spaces
    # differ) of the best one: the survivor of that group is the new row, which has no edge.
    conn.execute("DELETE FROM obs.prompt_neighbour WHERE b_id <> %s", (ids[3],))
    make_log(
        conn,
        tenant_id=tenant["id"],
        route=route["name"],
        messages=_user("how do I  RESET my password?"),
        completion="dup",
        fb_explicit=1,
    )
    conn.execute("UPDATE obs.prompt_neighbour_scan SET radius = %s", (RADIUS,))
    snap = _snapshot(conn, tenant, route, dedup_threshold=0.1)
    assert snap.counts["exact_dedup"] == 7
    kept = _kept(conn, snap)
    assert "dup" in kept.values() and PARAPHRASES[3] not in kept


def test_rows_not_searched_fall_back_to_live_probes(conn):
    tenant, route, _other, _ids = _traffic(conn)
    embed_and_link(conn, encoder(), radius=RADIUS, neighbours=K)
    # A better-rated paraphrase logged with its own embedding (a client may send one): queued,
    # not searched. Its live probe must still drop the worse paraphrase that has edges.
    text = "How do I reset my password, please?"
    vector = to_halfvec(encoder()([text])[0])
    make_log(
        conn,
        tenant_id=tenant["id"],
        route=route["name"],
        messages=_user(text),
        completion="fresh",
        fb_explicit=1,
        embedding=vector,
    )
    queued = conn.execute(
        "SELECT count(*) AS n FROM obs.prompt_neighbour_scan WHERE radius IS NULL"
    ).fetchone()
    assert queued["n"] == 1
    before = _hnsw_scans(conn)
    snap = _snapshot(conn, tenant, route, dedup_threshold=0.1)
    assert _hnsw_scans(conn) > before
    assert snap.counts["probed_live"] == 1 and snap.counts["searched_rows"] == 7
    kept = _kept(conn, snap)
    assert kept == {text: "fresh", **{t: "d" for t in DISTINCT}}

    # A threshold above the stored radius cannot trust the edges: every survivor is probed.
    wide = _snapshot(conn, tenant, route, dedup_threshold=0.3)
    assert wide.counts["probed_live"] == wide.counts["exact_dedup"] == 8
    assert wide.counts["searched_rows"] == 0


def test_deleting_log_rows_deletes_their_edges_and_marks(conn):
    _tenant, _route, _other, ids = _traffic(conn)
    embed_and_link(conn, encoder(), radius=RADIUS, neighbours=K)
    conn.execute("DELETE FROM obs.inference_log WHERE id = %s", (ids[0],))
    assert all(ids[0] not in e for e in _edges(conn)) and len(_edges(conn)) == 3
    left = conn.execute(
        "SELECT count(*) AS n FROM obs.prompt_neighbour_scan WHERE log_id = %s", (ids[0],)
    ).fetchone()
    assert left["n"] == 0
