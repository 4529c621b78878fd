"""The dedup pipeline next to ingest, in one run: POST /v1/logs rows/s, the embedder's rows/s
(the bundled all-MiniLM-L6-v2 on CPU, and an OpenAI-compatible /v1/embeddings endpoint), and the
neighbour search's rows/s (obs.compute_prompt_neighbours from 1 and from --sessions sessions).

    .venv/bin/python bench/dedup.py                  # 20,000 rows ingested
    .venv/bin/python bench/dedup.py --rows 100000 --model-rows 2000 --endpoint-rows 20000
    .venv/bin/python bench/dedup.py --search-rows 100000 --skip-pipeline   # the search at scale

One fresh embedded PostgreSQL. The rows are ingested through the API without embeddings (as a
product logs them); the embedder then embeds --model-rows of them with the bundled model and
--endpoint-rows through an endpoint. The endpoint is a local stub (a deterministic vector per
text, built in Python in this process), so its figure is the embedder without a model: the HTTP
round trip, the database writes and the HNSW inserts (and the stub's own CPU on the same
cores). The endpoint's rows are embedded in alternating rounds with the enqueue trigger before
migration 20261213 (every embedded row queued and copied into obs.prompt_embedding and its HNSW
index) and now (a scan row; the queue and the copy wait for a dataset signal). Then half the
embedded rows get feedback (bench/datasets.py's mix: thumbs up or down, regenerations), which
queues and copies those; the first half of the queue is searched from one session, the rest
from --sessions, and the search's rate is also given per logged row.

--search-rows N: the neighbour search at scale, on the same data, before (every embedded row
queued and searched over an index of every row: the function migration 20261213 replaced, as
bench_old.compute_prompt_neighbours over bench_old.prompt_embedding), "oldidx" (the signalled
rows searched over that index of every row: the smaller index's share) and now (the signalled
rows over obs.prompt_embedding, which holds those alone): N rows of bench/datasets.py's
synthetic traffic (+10% children; ~45 % with a dataset signal) with random embeddings
bulk-loaded in SQL (no model; the HNSW indexes built after the load), then
alternating rounds of `BEGIN; SELECT fn(0.2, 10, --search-batch); ROLLBACK` from 1 and from
--sessions sessions (each round searches the same newest queued rows), with the edges each
found compared, and with the exact (sequential-scan) kNN edges of the newest
--exact-sample rows. --ef 80,120 adds the new search with those hnsw.ef_search floors;
--bq 2,4:80 adds the search over an HNSW index on the binary quantisation
(`binary_quantize(embedding)::bit(384)`, Hamming distance) whose M * (k + 1) nearest are
re-ranked by the exact cosine distance (M:EF: hnsw.ef_search EF), prints that index's build
time and size, and times --insert-rows new embeddings inserted with only the halfvec index,
only the bit index, or neither (the embedder's HNSW insert). --split adds the function with the kNN's rows dropped
(claim, log row read, prompt hash, marking) and prints the time per row besides the kNN.
--pgdata keeps the loaded
database for a second run. --weekly gives the loaded rows weekly
partitions first (the maintenance worker's obs.move_default_rows; without it, rows older than
last week stay in DEFAULT).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

ROOT = Path(__file__).resolve().parents[1]
# Not bench/ itself on the path: bench/datasets.py would hide the `datasets` package that
# sentence-transformers imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from app.core import auth, embedded  # noqa: E402
from app.core.config import Settings  # noqa: E402
from app.core.db import connect, migrate  # noqa: E402
from app.core.sqlfiles import render  # noqa: E402
from bench.datasets import LOAD  # noqa: E402
from bench.ingest import api_ingest, free_port  # noqa: E402
from workers.embedder.metrics import backlog  # noqa: E402
from workers.embedder.model import load_encoder  # noqa: E402
from workers.embedder.service import embed_pending, link_batch, link_parallel  # noqa: E402

TOPICS = ["password", "invoice", "refund", "shipping", "account", "plan", "email", "card"]
ASKS = [
    "How do I change my {t}?",
    "How can I update my {t}?",
    "I need help with my {t}, order {n}",
    "Where do I find the {t} settings for store {n}?",
    "My {t} does not work since update {n}",
]


def make_records(n: int) -> list[dict[str, Any]]:
    """Support questions: templates x topics x numbers, so some prompts are paraphrases."""
    return [
        {
            "request_id": str(uuid.uuid4()),
            "route": "support",
            "messages": [
                {"role": "system", "content": "You are a support assistant."},
                {
                    "role": "user",
                    "content": ASKS[i % len(ASKS)].format(
                        t=TOPICS[(i // 5) % len(TOPICS)], n=(i * 7919) % max(n // 3, 1)
                    ),
                },
            ],
            "completion": "Go to Settings and follow the steps.",
            "tokens_out": 8,
            "user": f"user-{i % 5000}",
        }
        for i in range(n)
    ]


# The SQL migration 20261213 replaced (its downgrade text), read from the commit before the
# migrations were rebased: the "before" of the A/B rounds, every embedded row searched and
# indexed (20261211-20261212), against now: only the rows with a dataset signal
# (obs.is_dataset_prompt).
MIGRATION = "445784a:migrations/versions/20261213_dataset_prompt_search.py"


def _block(sql: str, start: str, end: str) -> str:
    """The text from `start` through the first `end` after it."""
    i = sql.index(start)
    return sql[i : sql.index(end, i) + len(end)]


def _before_20261213() -> str:
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", MIGRATION], capture_output=True, text=True, check=True
    ).stdout
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "DOWNGRADE_SQL":
            return str(ast.literal_eval(node.value))
    raise LookupError(f"no DOWNGRADE_SQL in {MIGRATION}")


OLD_SQL = _before_20261213()
# The search of every queued row over a copy of every embedded row (bench_old.prompt_embedding,
# its own HNSW index), under another name.
OLD_SEARCH = (
    _block(OLD_SQL, "CREATE OR REPLACE FUNCTION obs.compute_prompt_neighbours(", "$fn$;\n")
    .replace("obs.compute_prompt_neighbours(", "bench_old.compute_prompt_neighbours(", 1)
    .replace("obs.prompt_embedding", "bench_old.prompt_embedding")
)
OLD_COPY = """CREATE TABLE bench_old.prompt_embedding AS
SELECT id AS log_id, created_at, tenant_id, route, embedding FROM obs.inference_log
 WHERE embedding IS NOT NULL;
ALTER TABLE bench_old.prompt_embedding ADD PRIMARY KEY (log_id, created_at);
CREATE INDEX ON bench_old.prompt_embedding USING hnsw (embedding halfvec_cosine_ops)"""
# The enqueue trigger's function: queue and copy every embedded row (before), or only those
# with a dataset signal (now; the others get their scan row).
ENQUEUE = "CREATE OR REPLACE FUNCTION obs.prompt_neighbour_enqueue()"
OLD_ENQUEUE = _block(OLD_SQL, ENQUEUE, "$$;\n")
NEW_ENQUEUE = _block(render("obs/prompt_neighbour.sql", embedding_dim=384), ENQUEUE, "$$;\n")
# Rows embedded while the old trigger ran, brought to what now keeps (the migration's backfill).
RESYNC = """UPDATE obs.prompt_neighbour_scan s
   SET candidate = obs.is_dataset_prompt(l.fb_explicit, l.fb_regen, l.fb_edited, l.pii_flags)
  FROM obs.inference_log l
 WHERE l.id = s.log_id AND l.created_at = s.created_at;
DELETE FROM obs.prompt_embedding e USING obs.prompt_neighbour_scan s
 WHERE s.log_id = e.log_id AND s.created_at = e.created_at AND NOT s.candidate"""
# The feedback a product's users give, after the rows are embedded (as the embedder runs within
# seconds and feedback comes later): bench/datasets.py's mix, 30 % thumbs up, 10 % down, 10 %
# regenerated: half the rows get a dataset signal (the trigger then queues and copies them).
SIGNAL = """UPDATE obs.inference_log
   SET fb_explicit = CASE WHEN id % 10 < 3 THEN 1 WHEN id % 10 = 3 THEN -1 END,
       fb_regen = id % 10 = 5
 WHERE embedding IS NOT NULL AND id % 10 IN (0, 1, 2, 3, 5)"""
# The signalled rows alone searched over the index of every row: the index's share of the gain
# (and of the edges found), apart from searching fewer rows.
OLD_CLAIM = "     WHERE s.radius IS NULL\n"
assert OLD_CLAIM in OLD_SEARCH
OLDIDX_SEARCH = OLD_SEARCH.replace(
    "bench_old.compute_prompt_neighbours(", "bench_oldidx.compute_prompt_neighbours(", 1
).replace(OLD_CLAIM, "     WHERE s.radius IS NULL AND s.candidate\n")
SEARCH = {
    "before": "bench_old.compute_prompt_neighbours",
    "oldidx": "bench_oldidx.compute_prompt_neighbours",
    "now": "obs.compute_prompt_neighbours",
}
NEW_SEARCH = _block(
    render("obs/compute_prompt_neighbours.sql", embedding_dim=384),
    "CREATE OR REPLACE FUNCTION obs.compute_prompt_neighbours(",
    "$fn$;\n",
)


def ef_variant(ef: int) -> tuple[str, str]:
    """The search as now with another hnsw.ef_search floor: (name, its CREATE FUNCTION)."""
    name = f"bench_ef{ef}.compute_prompt_neighbours"
    sql = (
        NEW_SEARCH.replace("obs.compute_prompt_neighbours(", name + "(", 1)
        .replace("SET hnsw.ef_search = 40", f"SET hnsw.ef_search = {ef}")
        .replace("greatest(2 * p_neighbours, 40)", f"greatest(2 * p_neighbours, {ef})")
    )
    return name, sql


# --split: the search as now with the kNN's rows dropped (the claim, the log row read, the
# prompt hash, the marking UPDATE and an empty edge INSERT): what a row costs besides its
# HNSW search, in the same alternating rounds.
NOSEARCH_FILTER = "WHERE q.embedding IS NOT NULL AND nb.dist < p_radius"


def nosearch_variant() -> tuple[str, str]:
    """The search as now without the kNN: (name, its CREATE FUNCTION)."""
    name = "bench_nosearch.compute_prompt_neighbours"
    assert NOSEARCH_FILTER in NEW_SEARCH
    sql = NEW_SEARCH.replace("obs.compute_prompt_neighbours(", name + "(", 1).replace(
        NOSEARCH_FILTER, "WHERE false AND nb.dist < p_radius"
    )
    return name, sql


# Binary quantisation (--bq): an HNSW index over the sign bits of the embedding (48 B a vector
# at 384 dims, Hamming distance), its c nearest re-ranked by the exact cosine distance.
BQ_INDEX = "bench_bq_idx"
BQ_DDL = (
    f"CREATE INDEX {BQ_INDEX} ON obs.prompt_embedding"
    " USING hnsw ((binary_quantize(embedding)::bit(384)) bit_hamming_ops)"
)
HALFVEC_LATERAL = """        SELECT n.log_id AS id, n.created_at, n.embedding <=> q.embedding AS dist
          FROM obs.prompt_embedding n
         WHERE n.tenant_id = q.tenant_id AND n.route = q.route
         ORDER BY n.embedding <=> q.embedding
         LIMIT p_neighbours + 1) nb"""
BQ_LATERAL = """        SELECT cand.id, cand.created_at, cand.dist FROM (
          SELECT n.log_id AS id, n.created_at, n.embedding <=> q.embedding AS dist
            FROM obs.prompt_embedding n
           WHERE n.tenant_id = q.tenant_id AND n.route = q.route
           ORDER BY binary_quantize(n.embedding)::bit(384)
                    <~> binary_quantize(q.embedding)::bit(384)
           LIMIT {mult} * (p_neighbours + 1)) cand
         ORDER BY cand.dist
         LIMIT p_neighbours + 1) nb"""


def bq_variant(spec: str) -> tuple[str, str, str]:
    """The search over the bit index, spec "M" or "M:EF": c = M * (k + 1) Hamming candidates,
    hnsw.ef_search max(EF or c, 40); returns (label, function name, its CREATE FUNCTION)."""
    mult, _, ef = spec.partition(":")
    label = f"bq{mult}" + (f"e{ef}" if ef else "")
    name = f"bench_{label}.compute_prompt_neighbours"
    floor = ef or f"{int(mult)} * (p_neighbours + 1)"
    assert HALFVEC_LATERAL in NEW_SEARCH
    sql = (
        NEW_SEARCH.replace("obs.compute_prompt_neighbours(", name + "(", 1)
        .replace(HALFVEC_LATERAL, BQ_LATERAL.format(mult=int(mult)))
        .replace("greatest(2 * p_neighbours, 40)", f"greatest({floor}, 40)")
    )
    return label, name, sql


def insert_cost(conn: Any, rows: int, rounds: int) -> None:
    """The embedder's HNSW insert: `rows` new random embeddings into obs.prompt_embedding with
    only the halfvec index, only the bit index, or neither (each rolled back), alternating."""
    tenant = conn.execute("SELECT id FROM tenant WHERE name = 'bench-search'").fetchone()["id"]
    conn.execute(
        """CREATE TEMP TABLE bench_ins AS
           SELECT -g::bigint AS log_id, now() + g * interval '1 ms' AS created_at,
                  %s::int AS tenant_id, 'bench-route'::text AS route,
                  (SELECT array_agg((random() - 0.5)::real) FROM generate_series(1, 384)
                    WHERE g > 0)::halfvec(384) AS embedding
             FROM generate_series(1, %s) g""",
        (tenant, rows),
    )
    drop = {
        "halfvec": [BQ_INDEX],
        "bit": ["prompt_embedding_embedding_idx"],
        "none": [BQ_INDEX, "prompt_embedding_embedding_idx"],
    }
    took: dict[str, list[float]] = {}
    kinds = list(drop)
    for r in range(rounds):
        for kind in kinds[r % 3 :] + kinds[: r % 3]:
            try:
                with conn.transaction():
                    for idx in drop[kind]:
                        conn.execute(f"DROP INDEX obs.{idx}")
                    conn.execute(
                        "INSERT INTO obs.prompt_neighbour_scan (log_id, created_at, tenant_id,"
                        " route) SELECT log_id, created_at, tenant_id, route FROM bench_ins"
                    )
                    t = time.perf_counter()
                    conn.execute("INSERT INTO obs.prompt_embedding SELECT * FROM bench_ins")
                    took.setdefault(kind, []).append(time.perf_counter() - t)
                    raise psycopg.Rollback()
            except psycopg.Rollback:
                pass
    none = statistics.median(took["none"])
    print(
        f"insert of {rows} rows into obs.prompt_embedding, median of {rounds} (load {load_avg()}):"
    )
    for kind in kinds:
        sec = statistics.median(took[kind])
        print(
            f"  index {kind:>7}: {rows / sec:>6.0f} rows/s ({1000 * sec / rows:.2f} ms/row,"
            f" the index's own {1000 * (sec - none) / rows:.2f} ms/row)"
            f"  rounds {', '.join(f'{x:.2f}' for x in took[kind])} s"
        )


def load_avg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


class _StubEmbeddings(BaseHTTPRequestHandler):
    dim = 384

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = []
        for i, text in enumerate(body["input"]):
            seed = hashlib.sha256(text.encode()).digest()
            raw = [(seed[(j * 7) % 32] ^ j) / 255 - 0.5 for j in range(self.dim)]
            norm = sum(x * x for x in raw) ** 0.5
            data.append({"index": i, "embedding": [x / norm for x in raw]})
        out = json.dumps({"data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


def embed_rounds(
    conn: Any, enc: Any, *, rows: int, rounds: int, batch: int
) -> dict[str, tuple[int, float]]:
    """Embed `rows` rows in 2 x rounds alternating rounds, the enqueue trigger as before
    20261213 (queue + copy + HNSW insert of every row) and now (a scan row; the queue and the
    copy wait for a dataset signal); returns (rows, s) per kind."""
    out = {"now": (0, 0.0), "before": (0, 0.0)}
    per = max(1, rows // (2 * rounds))
    for r in range(rounds):
        for kind in ("now", "before") if r % 2 == 0 else ("before", "now"):
            conn.execute(NEW_ENQUEUE if kind == "now" else OLD_ENQUEUE)
            t = time.perf_counter()
            done = embed_pending(conn, enc, batch_size=batch, limit=per)
            n, sec = out[kind]
            out[kind] = (n + done, sec + time.perf_counter() - t)
    conn.execute(NEW_ENQUEUE)
    for statement in RESYNC.split(";\n"):
        conn.execute(statement)
    return out


def load_search_scale(conn: Any, rows: int, *, weekly: bool) -> str:
    """Bulk-load `rows` rows (+ children) with embeddings, then build both HNSW indexes."""
    tenant = conn.execute(
        "INSERT INTO tenant (name, consent_training) VALUES ('bench-search', true) RETURNING id"
    ).fetchone()["id"]
    conn.execute(
        "INSERT INTO serve.route (name, tenant_id, base_model) VALUES ('bench-route', %s, 'm')",
        (tenant,),
    )
    t = time.perf_counter()
    conn.execute("DROP INDEX obs.inference_log_embedding_idx")
    conn.execute("DROP INDEX obs.prompt_embedding_embedding_idx")
    p = {"tenant": tenant, "route": "bench-route", "n": rows, "k": int(rows * 0.9)}
    for statement in LOAD.split(";\n"):
        if statement.strip():
            conn.execute(statement, p)
    if weekly:
        conn.execute("SELECT obs.move_default_rows()")
    loaded = time.perf_counter() - t
    builds = []
    for ddl in (
        "CREATE INDEX inference_log_embedding_idx ON obs.inference_log"
        " USING hnsw (embedding halfvec_cosine_ops)",
        "CREATE INDEX prompt_embedding_embedding_idx ON obs.prompt_embedding"
        " USING hnsw (embedding halfvec_cosine_ops)",
    ):
        t = time.perf_counter()
        conn.execute(ddl)
        builds.append(time.perf_counter() - t)
    t = time.perf_counter()
    conn.execute("CREATE SCHEMA IF NOT EXISTS bench_old")
    for statement in OLD_COPY.split(";\n"):
        conn.execute(statement)
    builds.append(time.perf_counter() - t)
    conn.execute(
        "VACUUM ANALYZE obs.inference_log, obs.prompt_neighbour_scan, obs.prompt_embedding,"
        " bench_old.prompt_embedding"
    )
    n = conn.execute("SELECT count(*) AS n FROM obs.prompt_embedding").fetchone()["n"]
    everyone = conn.execute("SELECT count(*) AS n FROM bench_old.prompt_embedding").fetchone()["n"]
    parts = conn.execute(
        "SELECT count(DISTINCT tableoid) AS n FROM obs.inference_log WHERE embedding IS NOT NULL"
    ).fetchone()["n"]
    size = conn.execute(
        "SELECT pg_table_size('obs.prompt_embedding') AS heap,"
        " pg_relation_size('obs.prompt_embedding_embedding_idx') AS hnsw,"
        " pg_indexes_size('obs.prompt_embedding') AS idx"
    ).fetchone()
    return (
        f"loaded {everyone} rows with embeddings in {loaded:.0f} s, in {parts} partitions of the"
        f" log, {n} ({100 * n / everyone:.0f} %) with a dataset signal; HNSW builds: log"
        f" {builds[0]:.0f} s, obs.prompt_embedding (the signalled rows) {builds[1]:.0f} s,"
        f" bench_old.prompt_embedding (every row, as before) with its copy {builds[2]:.0f} s\n"
        f"obs.prompt_embedding: heap {size['heap'] / n:.0f} B/row, HNSW {size['hnsw'] / n:.0f}"
        f" B/row, all its indexes {size['idx'] / n:.0f} B/row"
    )


def build_bq_index(conn: Any) -> str:
    """Build the bit HNSW index of --bq on obs.prompt_embedding (unless there); its size."""
    t = time.perf_counter()
    if not conn.execute("SELECT to_regclass(%s) AS r", (f"obs.{BQ_INDEX}",)).fetchone()["r"]:
        conn.execute(BQ_DDL)
        conn.execute("ANALYZE obs.prompt_embedding")
    built = time.perf_counter() - t
    size = conn.execute(
        "SELECT count(*) AS n, pg_relation_size('obs.prompt_embedding_embedding_idx') AS hv,"
        f" pg_relation_size('obs.{BQ_INDEX}') AS bq FROM obs.prompt_embedding"
    ).fetchone()
    return (
        f"bit HNSW index (binary_quantize(embedding)::bit(384) bit_hamming_ops): built in"
        f" {built:.0f} s, {size['bq'] / size['n']:.0f} B/row ({size['bq'] / 2**20:.1f} MiB);"
        f" halfvec HNSW {size['hv'] / size['n']:.0f} B/row ({size['hv'] / 2**20:.1f} MiB)"
    )


def search_round(url: str, fn: str, sessions: int, batch: int) -> tuple[int, float, set[Any]]:
    """`sessions` concurrent `BEGIN; SELECT fn(0.2, 10, batch); ROLLBACK`: rows, wall s, edges."""
    start = threading.Barrier(sessions)
    marked: list[int] = []
    spans: list[tuple[float, float]] = []
    edges: set[Any] = set()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with psycopg.connect(url) as c:
                start.wait()
                t = time.perf_counter()
                row = c.execute(f"SELECT {fn}(0.2, 10, %s)", (batch,)).fetchone()
                spans.append((t, time.perf_counter()))
                marked.append(int(row[0]) if row else 0)
                edges.update(c.execute("SELECT a_id, b_id FROM obs.prompt_neighbour").fetchall())
                # Rolled back at once: holding the transaction until the other sessions are
                # done could deadlock (an edge two sessions both insert waits for the first).
                c.rollback()
        except BaseException as exc:
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=work, daemon=True) for _ in range(sessions)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return sum(marked), max(e for _, e in spans) - min(b for b, _ in spans), edges


def exact_edges(conn: Any, batch: int, sample: int) -> tuple[list[int], dict[Any, float]]:
    """The exact (sequential-scan) edges of the `sample` newest queued rows: k = 10, r = 0.2,
    each with its distance."""
    with conn.transaction():
        conn.execute("SET LOCAL enable_indexscan = off")
        conn.execute("SET LOCAL enable_bitmapscan = off")
        rows = conn.execute(
            """SELECT q.log_id AS q, nb.log_id AS n, nb.dist, q.created_at < nb.created_at
                      OR (q.created_at = nb.created_at AND q.log_id < nb.log_id) AS older
                 FROM (SELECT s.log_id, s.created_at FROM obs.prompt_neighbour_scan s
                        WHERE s.radius IS NULL AND s.candidate
                        ORDER BY s.created_at DESC LIMIT %s) c
                 JOIN obs.prompt_embedding q USING (log_id, created_at)
                 CROSS JOIN LATERAL (
                   SELECT n.log_id, n.created_at, n.embedding <=> q.embedding AS dist
                     FROM obs.prompt_embedding n
                    WHERE n.tenant_id = q.tenant_id AND n.route = q.route
                    ORDER BY n.embedding <=> q.embedding LIMIT 11) nb
                WHERE nb.dist < 0.2 AND nb.log_id <> q.log_id""",
            (min(batch, sample),),
        ).fetchall()
        qs = conn.execute(
            """SELECT log_id FROM obs.prompt_neighbour_scan WHERE radius IS NULL AND candidate
                ORDER BY created_at DESC LIMIT %s""",
            (min(batch, sample),),
        ).fetchall()
    pairs = {((r["q"], r["n"]) if r["older"] else (r["n"], r["q"])): r["dist"] for r in rows}
    return [r["log_id"] for r in qs], pairs


def search_at_scale(url: str, args: argparse.Namespace) -> None:
    """Before/after rows/s of the neighbour search on the same bulk-loaded data."""
    search = dict(SEARCH)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        if conn.execute("SELECT 1 FROM tenant WHERE name = 'bench-search'").fetchone():
            print("reusing the loaded rows (--pgdata)", flush=True)
        else:
            print(load_search_scale(conn, args.search_rows, weekly=args.weekly), flush=True)
        conn.execute("CREATE SCHEMA IF NOT EXISTS bench_old")
        conn.execute(OLD_SEARCH)
        conn.execute("CREATE SCHEMA IF NOT EXISTS bench_oldidx")
        conn.execute(OLDIDX_SEARCH)
        for ef in args.ef:
            name, sql = ef_variant(ef)
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {name.split('.')[0]}")
            conn.execute(sql)
            search[f"ef{ef}"] = name
        if args.split:
            name, sql = nosearch_variant()
            conn.execute("CREATE SCHEMA IF NOT EXISTS bench_nosearch")
            conn.execute(sql)
            search["nosearch"] = name
        if args.bq:
            print(build_bq_index(conn), flush=True)
        for spec in args.bq:
            label, name, sql = bq_variant(spec)
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {name.split('.')[0]}")
            conn.execute(sql)
            search[label] = name
        queue = conn.execute(
            "SELECT count(*) AS everyone, count(*) FILTER (WHERE candidate) AS signalled"
            " FROM obs.prompt_neighbour_scan WHERE radius IS NULL"
        ).fetchone()
        signalled = {
            r["log_id"]
            for r in conn.execute("SELECT log_id FROM obs.prompt_neighbour_scan WHERE candidate")
        }
        t = time.perf_counter()
        ids, exact = exact_edges(conn, args.search_batch, args.exact_sample)
        print(f"exact kNN of {len(ids)} rows (sequential scan): {time.perf_counter() - t:.0f} s")
    # Logged rows per searched row: before, every embedded row is searched; now, those with a
    # dataset signal.
    per_search = {
        k: 1.0 if k == "before" else queue["everyone"] / queue["signalled"] for k in search
    }
    print(
        f"queued: {queue['everyone']} embedded rows before, {queue['signalled']} with a signal now;"
        f" each round: the {args.search_batch} newest queued rows per session"
    )
    for fn in search.values():  # warm-up: the indexes in the cache
        search_round(url, fn, 1, args.search_batch)
    rates: dict[tuple[str, int], list[float]] = {}
    found: dict[str, set[Any]] = {}
    print(f"{'round':>5} {'search':>7} {'sessions':>8} {'rows':>6} {'s':>6} {'rows/s':>7}  load")
    kinds = list(search)
    for r in range(args.search_rounds):
        for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:  # rotate the order
            for sessions in sorted({1, args.sessions}):
                n, sec, edges = search_round(url, search[kind], sessions, args.search_batch)
                rates.setdefault((kind, sessions), []).append(n / sec)
                if sessions == 1:
                    found[kind] = edges
                print(
                    f"{r + 1:>5} {kind:>7} {sessions:>8} {n:>6} {sec:>6.2f} {n / sec:>7.0f}"
                    f"  {load_avg()}",
                    flush=True,
                )
    for sessions in sorted({1, args.sessions}):
        b = statistics.median(rates[("before", sessions)])
        for kind in kinds[1:]:
            a = statistics.median(rates[(kind, sessions)])
            logged = a * per_search[kind]
            print(
                f"median, {sessions} session(s): before {b:.0f} rows/s, {kind} {a:.0f} searched"
                f" rows/s (x{a / b:.2f}) = {logged:.0f} logged rows/s kept up with (x{logged / b:.2f})"
            )
    for sessions in sorted({1, args.sessions}):
        b = statistics.median(rates[("now", sessions)])
        for kind in kinds[3:]:
            a = statistics.median(rates[(kind, sessions)])
            print(
                f"median, {sessions} session(s): now {b:.0f} rows/s, {kind} {a:.0f}: x{a / b:.2f}"
            )
    if args.split:
        for sessions in sorted({1, args.sessions}):
            now = 1000 / statistics.median(rates[("now", sessions)])
            rest = 1000 / statistics.median(rates[("nosearch", sessions)])
            print(
                f"split, {sessions} session(s): {now:.3f} ms/row in all, {rest:.3f} besides the"
                f" kNN ({100 * rest / now:.1f}%), the kNN {now - rest:.3f} ms/row"
            )
        del found["nosearch"]
    # "before" searched other rows (the newest embedded, signalled or not); "oldidx" the same
    # signalled rows as now, over the index of every row: its edges between signalled rows
    # against now's are the effect of the smaller index on what is found.
    del found["before"]
    old = {e for e in found["oldidx"] if e[0] in signalled and e[1] in signalled}
    new = found["now"]
    print(
        f"edges between signalled rows of one batch: over every row's index {len(old)}, over"
        f" the signalled rows' (now) {len(new)}, both {len(old & new)}, only the first"
        f" {len(old - new)}, only now {len(new - old)}"
    )
    found["oldidx"] = old
    # Identical embeddings (distance 0: the same prompt text, which exact dedup by prompt hash
    # already merges; a snapshot ignores edges between equal hashes) apart from near ones.
    same = {e for e, d in exact.items() if d == 0}
    near = set(exact) - same
    print(
        f"exact kNN edges of the {len(ids)} newest rows: {len(exact)}"
        f" ({len(same)} between identical embeddings, {len(near)} near: 0 < distance < 0.2)"
    )
    for kind, edges in found.items():
        print(
            f"  found by {kind:>7}: identical {len(same & edges)}/{len(same)},"
            f" near {len(near & edges)}/{len(near)},"
            f" all {100 * len(set(exact) & edges) / max(len(exact), 1):.1f}%"
        )
    if args.bq and args.insert_rows:
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            insert_cost(conn, args.insert_rows, args.insert_rounds)


def main() -> int:
    """Run the pipeline stages and print their rates side by side."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000, help="rows ingested through the API")
    ap.add_argument("--model-rows", type=int, default=1_000, help="rows embedded by the model")
    ap.add_argument("--endpoint-rows", type=int, default=6_000, help="rows via the endpoint")
    ap.add_argument("--embed-rounds", type=int, default=3, help="endpoint rounds per trigger")
    ap.add_argument("--sessions", type=int, default=2, help="parallel neighbour-search sessions")
    ap.add_argument("--batch", type=int, default=256, help="embedder batch size")
    ap.add_argument("--skip-pipeline", action="store_true", help="only --search-rows")
    ap.add_argument("--search-rows", type=int, default=0, help="bulk rows for the search A/B")
    ap.add_argument("--search-batch", type=int, default=500, help="rows per session per round")
    ap.add_argument("--search-rounds", type=int, default=4, help="rounds per search version")
    ap.add_argument("--weekly", action="store_true", help="weekly partitions for loaded rows")
    ap.add_argument(
        "--ef",
        type=lambda v: [int(x) for x in v.split(",") if x],
        default=[],
        help="also the new search with these hnsw.ef_search floors, e.g. 60,80",
    )
    ap.add_argument(
        "--bq",
        type=lambda v: [x for x in v.split(",") if x],
        default=[],
        help="also the search over a bit (binary-quantised) HNSW index with an exact re-rank:"
        " M or M:EF per variant, M * (k + 1) candidates, e.g. 2,4,4:80",
    )
    ap.add_argument(
        "--split",
        action="store_true",
        help="also the search without its kNN (claim, log read, hash, marking): the share of"
        " a row's time besides the HNSW search",
    )
    ap.add_argument("--insert-rows", type=int, default=2_000, help="rows per --bq insert round")
    ap.add_argument("--insert-rounds", type=int, default=3, help="--bq insert rounds per index")
    ap.add_argument("--exact-sample", type=int, default=500, help="rows checked by brute force")
    ap.add_argument("--pgdata", type=Path, help="a data directory to keep and reuse")
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="cft-bench-dedup-"))
    pgdata = args.pgdata or home / "pg"
    url = embedded.start(
        pgdata,
        tuning={
            "max_connections": "100",
            "timezone": "UTC",
            # The HNSW builds of --search-rows (~1.2 KB a row must fit).
            "maintenance_work_mem": "1GB",
            "max_parallel_maintenance_workers": "2",
        },
    )
    os.environ["CFT_HOME"] = str(home)
    try:
        migrate(url)
        if not args.skip_pipeline:
            pipeline(url, home, args)
        if args.search_rows:
            search_at_scale(url, args)
    finally:
        embedded.stop(pgdata, mode="fast")
    return 0


def pipeline(url: str, home: Path, args: argparse.Namespace) -> None:
    """Ingest through the API, embed (model, endpoint), search; print the rates."""
    env = os.environ | {"CFT_HOME": str(home), "CFT_DATABASE_URL": url}
    with psycopg.connect(url, autocommit=True) as conn:
        tid = conn.execute("INSERT INTO tenant (name) VALUES ('bench') RETURNING id").fetchone()
        assert tid is not None
        key = auth.create_key(conn, tenant_id=int(tid[0]), role="ingest")  # type: ignore[arg-type]
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--host",
         "127.0.0.1", "--port", str(port), "--workers", "2", "--log-level", "warning",
         "--no-access-log"],
        cwd=ROOT,
        env=env,
    )  # fmt: skip
    stub = ThreadingHTTPServer(("127.0.0.1", 0), _StubEmbeddings)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    rates: dict[str, tuple[int, float]] = {}
    loads: dict[str, str] = {}
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        api_ingest(base, key, make_records(1_000), 500, 4)  # warm-up (embedded below too)
        label = "ingest: POST /v1/logs (batches of 500, 4 clients)"
        rates[label] = (args.rows, api_ingest(base, key, make_records(args.rows), 500, 4))
        loads[label] = load_avg()
        server.terminate()
        server.wait(timeout=30)

        model = load_encoder(Settings(home=home))
        model(["warm-up"])
        endpoint = load_encoder(
            Settings(home=home, embedding_url=f"http://127.0.0.1:{stub.server_port}")
        )
        with connect(url, autocommit=True) as conn:
            label = "embed: bundled all-MiniLM-L6-v2 (CPU)"
            t = time.perf_counter()
            done = embed_pending(conn, model, batch_size=args.batch, limit=args.model_rows)
            rates[label] = (done, time.perf_counter() - t)
            loads[label] = load_avg()
            ab = embed_rounds(
                conn, endpoint, rows=args.endpoint_rows, rounds=args.embed_rounds, batch=args.batch
            )
            for kind, what in (("before", "queue + copy, every row"), ("now", "scan row")):
                label = f"embed: endpoint (local stub), {what} ({kind})"
                rates[label] = ab[kind]
                loads[label] = load_avg()
            label = "feedback on 50 % (queue + copy of those)"
            t = time.perf_counter()
            signalled = conn.execute(SIGNAL).rowcount
            rates[label] = (signalled, time.perf_counter() - t)
            loads[label] = load_avg()
            embedded = conn.execute(
                "SELECT count(*) AS n FROM obs.prompt_neighbour_scan"
            ).fetchone()
            assert embedded is not None
            queued = int(backlog(conn)["neighbours_rows"])
            t = time.perf_counter()
            one = 0
            while one < queued // 2:
                m = link_batch(conn, radius=0.2, neighbours=10, batch_size=args.batch)
                if not m:
                    break
                one += m
            rates["neighbour search: 1 session"] = (one, time.perf_counter() - t)
            loads["neighbour search: 1 session"] = load_avg()
            t = time.perf_counter()
            rest = link_parallel(
                url, radius=0.2, neighbours=10, sessions=args.sessions, batch_size=args.batch
            )
            label = f"neighbour search: {args.sessions} sessions"
            rates[label] = (rest, time.perf_counter() - t)
            loads[label] = load_avg()
            left = backlog(conn)
            edges = conn.execute("SELECT count(*) AS n FROM obs.prompt_neighbour").fetchone()
            assert edges is not None
    finally:
        stub.shutdown()
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=30)

    ingest_rate = args.rows / rates["ingest: POST /v1/logs (batches of 500, 4 clients)"][1]
    print(f"machine: {os.cpu_count()} cores; log rows in the table: {args.rows + 1_000}")
    print(f"{'stage':52} {'rows':>7} {'s':>7} {'rows/s':>8} {'/ ingest':>8}  load")
    for label, (n, sec) in rates.items():
        rate = n / sec if sec else 0.0
        print(
            f"{label:52} {n:>7} {sec:>7.1f} {rate:>8,.0f} {rate / ingest_rate:>8.2f}  {loads[label]}"
        )
    searched = [(n, sec) for label, (n, sec) in rates.items() if "neighbour search" in label]
    share = queued / max(embedded["n"], 1)
    for n, sec in searched:
        print(
            f"neighbour search per logged row: {n / sec / share:,.0f} rows/s"
            f" ({n / sec:,.0f} searched rows/s; {100 * share:.0f} % of the embedded rows have a"
            " dataset signal)"
        )
    print(
        f"edges stored: {edges['n']}; backlog left: {left['embedding_rows']:.0f} rows to embed,"
        f" {left['neighbours_rows']:.0f} to search (the gauges cft_embedder_backlog_rows)",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
