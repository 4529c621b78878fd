"""Near duplicates found at embedding time (obs.prompt_neighbour) and used by snapshots, on real
PostgreSQL + pgvector with the real embedding model."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from app.core.db import downgrade, migrate
from app.datasets import service as datasets
from tests.support import db as testdb
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


def _snapshot(conn: Any, tenant: dict[str, Any], route: dict[str, Any], **kw: Any) -> Any:
    return datasets.create_snapshot(
        conn, tenant_id=tenant["id"], route=route["name"], method="kto", **kw
    )


def _kept(conn: Any, snap: dict[str, Any]) -> dict[str, str]:
    examples = datasets.export_snapshot(conn, snapshot_id=snap["id"], split="train")
    examples += datasets.export_snapshot(conn, snapshot_id=snap["id"], split="eval")
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
        "SELECT s.radius, s.max_neighbours, s.prompt_hash = train.prompt_hash_v1(l.messages) AS ok"
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
    counts = snap["counts"]
    assert counts["exact_dedup"] == 7 and counts["semantic_dedup"] == 4
    assert counts["probed_live"] == 0 and counts["searched_rows"] == 7
    assert _kept(conn, snap) == {PARAPHRASES[0]: "p0", **{t: "d" for t in DISTINCT}}
    assert "FROM obs.prompt_neighbour e" in snap["params"]["semantic_dedup"]

    # A threshold below every stored distance keeps all seven, still without probes.
    strict = _snapshot(conn, tenant, route, dedup_threshold=0.004, refresh=False)
    assert strict["counts"]["semantic_dedup"] == 7 and strict["counts"]["probed_live"] == 0


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
    assert snap["counts"]["exact_dedup"] == 7
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
    assert snap["counts"]["probed_live"] == 1 and snap["counts"]["searched_rows"] == 7
    kept = _kept(conn, snap)
    assert kept == {text: "fresh", **{t: "d" for t in DISTINCT}}

    # A threshold above the stored radius cannot trust the edges: every survivor is probed.
    wide = _snapshot(conn, tenant, route, dedup_threshold=0.3)
    assert wide["counts"]["probed_live"] == wide["counts"]["exact_dedup"] == 8
    assert wide["counts"]["searched_rows"] == 0


def _frozen(
    conn: Any, version: str, tenant: Any, route: Any, until: datetime, threshold: float, method: str
) -> tuple[Any, list[Any]]:
    """A snapshot through create_snapshot_<version>, and its examples as stored."""
    snap = conn.execute(
        f"SELECT * FROM train.create_snapshot_{version}(%s, %s, %s, p_until => %s,"
        " p_dedup_threshold => %s)",
        (tenant["id"], route["name"], method, until, threshold),
    ).fetchone()
    examples = conn.execute(
        "SELECT example_hash, split, example::text AS example FROM train.dataset_example"
        " WHERE snapshot_id = %s ORDER BY example_hash",
        (snap["id"],),
    ).fetchall()
    return snap, examples


def _counts_add_up(snap: Any) -> None:
    c = snap["counts"]
    assert c["view_rows"] >= c["in_window"] >= c["live_ok"] >= c["exact_dedup"]
    assert c["exact_dedup"] >= c["semantic_dedup"] == snap["n_train"] + snap["n_eval"]
    assert c["searched_rows"] + c["probed_live"] + c["without_embedding"] == c["exact_dedup"] or (
        snap["params"]["dedup_threshold"] == 0
    )
    assert set(snap["params"]["step_ms"]) == {
        "candidates",
        "exact_dedup",
        "edges",
        "live_probes",
        "semantic_dedup",
        "write",
    }


def test_v6_over_the_example_views_builds_the_snapshots_v5_built(conn, db_url):
    """0015 moved each candidate's example into the candidate views: the same traffic frozen
    by v5 over the 0014 views (examples built at the write) and by v6 over the 0015 views
    (examples copied) gives the same counts, split, set_hash and stored examples."""
    downgrade(db_url, "0014")
    tenant, route, _other, _ids = _traffic(conn)
    embed_and_link(conn, encoder(), radius=RADIUS, neighbours=K)
    # An exact duplicate of the best paraphrase and a row with no embedding join in.
    make_log(
        conn,
        tenant_id=tenant["id"],
        route=route["name"],
        messages=_user("how do I  RESET my password?"),
        completion="dup",
        fb_explicit=1,
    )
    # Edits with no embedding (their prompt hash is computed from the view row): two with the
    # same normalised prompt (exact dedup keeps one), one more.
    for text, edit in [("Fix my invoice", "a"), ("fix my  INVOICE", "b"), ("Other", "c")]:
        make_log(
            conn,
            tenant_id=tenant["id"],
            route=route["name"],
            messages=_user(text),
            completion="draft",
            fb_edited=True,
            edited_completion=f"edited {edit}",
        )
    conn.execute("SELECT train.refresh_dataset_candidates_v2()")  # (what 0014 has)
    until = datetime.now(UTC) + timedelta(seconds=1)
    # KTO: edges only; then a threshold above the search radius (every survivor probed live);
    # then no semantic dedup at all. SFT and DPO from the edits.
    runs = [("kto", 0.1), ("kto", 0.3), ("kto", 0.0), ("sft", 0.1), ("dpo", 0.1)]
    old = {r: _frozen(conn, "v5", tenant, route, until, r[1], r[0]) for r in runs}
    migrate(db_url)  # 0015: the views are rebuilt from the same log
    fields = ("counts", "n_train", "n_eval", "set_hash", "method", "route", "tenant_id")
    results = {}
    for r in runs:
        (v5, v5_examples), (v6, v6_examples) = (
            old[r],
            _frozen(conn, "v6", tenant, route, until, *r[::-1]),
        )
        assert {f: v6[f] for f in fields} == {f: v5[f] for f in fields}, r
        assert v6_examples == v5_examples and v6_examples, r
        _counts_add_up(v6)
        assert datasets.verify_snapshot(conn, snapshot_id=v6["id"])["set_hash_ok"]
        results[r] = v6["counts"]
    assert results["kto", 0.1]["semantic_dedup"] == 4 and results["kto", 0.1]["probed_live"] == 0
    assert results["kto", 0.3]["probed_live"] == 6 and results["kto", 0.3]["without_embedding"] == 1
    assert results["kto", 0.3]["semantic_dedup"] == 4
    assert results["kto", 0.0]["semantic_dedup"] == results["kto", 0.0]["exact_dedup"] == 7
    for method in ("sft", "dpo"):
        counts = results[method, 0.1]
        assert (counts["live_ok"], counts["exact_dedup"], counts["without_embedding"]) == (3, 2, 2)


def test_deleting_log_rows_deletes_their_edges_and_marks(conn):
    _tenant, _route, _other, ids = _traffic(conn)
    embed_and_link(conn, encoder(), radius=RADIUS, neighbours=K)
    conn.execute("DELETE FROM obs.inference_log WHERE id = %s", (ids[0],))
    assert all(ids[0] not in e for e in _edges(conn)) and len(_edges(conn)) == 3
    left = conn.execute(
        "SELECT count(*) AS n FROM obs.prompt_neighbour_scan WHERE log_id = %s", (ids[0],)
    ).fetchone()
    assert left["n"] == 0


def test_migration_down_and_up_again(pg_server):
    query = (
        "SELECT to_regclass('obs.prompt_neighbour') IS NOT NULL,"
        " to_regclass('obs.prompt_neighbour_scan') IS NOT NULL,"
        " (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'inference_log_%embedded'"
        "   OR tgname = 'inference_log_forget_neighbours')"
    )
    up, down, up_again = testdb.migration_round_trip(pg_server, "0010", query)
    assert up[:2] == up_again[:2] == (True, True)
    assert down == (False, False, 0)
