"""Dataset snapshot benchmark: KTO and DPO snapshots (exact + semantic dedup) over synthetic
traffic with embeddings, next to a plain `COPY (SELECT ...) TO` of the same rows (the floor).

    .venv/bin/python bench/datasets.py                 # 1,000,000 log rows
    .venv/bin/python bench/datasets.py --rows 100000
    .venv/bin/python bench/datasets.py --rows 100000 --pgdata /tmp/b100k
        # keep the loaded database; a second run with the same --pgdata skips the setup

Setup, timed apart from the snapshots: bulk load (rows arrive with their embeddings, so the
insert trigger queues those with a dataset signal for the neighbour search), HNSW build, then
the embedder's neighbour search (workers.embedder.service.link_pending, the SQL function the
worker runs after each batch): what ingest pays per row, reported in rows/s.

Rows: ~90% distinct prompts with random 384-d embeddings; the rest are exact duplicates (same
text up to case) or paraphrases (other text, embedding within ~0.01 cosine distance). 40% carry
thumbs (KTO), 10% were regenerated and have a child row (DPO pairs).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.core import embedded
from app.core.db import migrate
from app.datasets import service as datasets
from workers.embedder.service import link_pending

LOAD = """
CREATE TEMP TABLE base AS
  SELECT k, (SELECT array_agg((random() - 0.5)::real) FROM generate_series(1, 384) WHERE k > 0) AS v
    FROM generate_series(1, %(k)s) k;
INSERT INTO obs.inference_log (request_id, tenant_id, route, adapter_id, messages, completion,
                               tokens_out, fb_explicit, fb_regen, embedding, created_at)
SELECT gen_random_uuid(), %(tenant)s, %(route)s, 'base',
       jsonb_build_array(jsonb_build_object('role', 'user', 'content', txt)),
       'answer ' || i || ' ' || repeat('x', 20 + i %% 50),
       10 + i %% 30,
       CASE WHEN i %% 10 < 3 THEN 1 WHEN i %% 10 = 3 THEN -1 END,
       i %% 10 = 5,
       (SELECT array_agg(b.v[d] + CASE WHEN para THEN ((random() - 0.5) * 0.05)::real ELSE 0 END
                         ORDER BY d)
          FROM generate_series(1, 384) d)::halfvec(384),
       now() - make_interval(days => i %% 50, secs => i %% 86400)
  FROM (SELECT i,
               CASE WHEN i <= %(k)s THEN i ELSE 1 + (i::bigint * 7919) %% %(k)s END AS src,
               i > %(k)s AND i %% 2 = 1 AS para,
               CASE WHEN i <= %(k)s THEN 'Question number ' || i || ' about the product'
                    WHEN i %% 2 = 0 THEN 'QUESTION NUMBER ' || (1 + (i::bigint * 7919) %% %(k)s) || ' about  the product'
                    ELSE 'Question ' || (1 + (i::bigint * 7919) %% %(k)s) || ', asked again in other words (' || i || ')'
               END AS txt
          FROM generate_series(1, %(n)s) i) s
  JOIN base b ON b.k = s.src;
INSERT INTO obs.inference_log (request_id, tenant_id, route, adapter_id, messages, completion,
                               tokens_out, parent_id, embedding, created_at)
SELECT gen_random_uuid(), tenant_id, route, 'base', messages, 'better ' || completion,
       tokens_out + 2, id, embedding, created_at + interval '1 minute'
  FROM obs.inference_log WHERE fb_regen;
"""

# The floor: the same candidate rows, with the columns a snapshot needs to build, rank and
# trace each example (ids, created_at, rating, prompt, completion(s), label), read from the log
# with the same filters (route, signal, pii_flags = 0, 60-day window). The snapshot additionally
# reads the candidate view, rechecks consent, and writes what it read.
FLOOR_KTO = """COPY (SELECT id, created_at, messages, completion, fb_explicit AS rating,
       fb_explicit > 0 AS label
  FROM obs.inference_log
 WHERE tenant_id = %(tenant)s AND route = %(route)s AND fb_explicit <> 0 AND pii_flags = 0
   AND created_at >= now() - interval '60 days') TO STDOUT"""
FLOOR_DPO = """COPY (SELECT rej.id, rej.created_at, cho.id, cho.created_at, rej.messages,
       cho.completion, rej.completion, coalesce(cho.fb_explicit, 0) AS rating
  FROM obs.inference_log rej JOIN obs.inference_log cho ON cho.parent_id = rej.id
 WHERE rej.tenant_id = %(tenant)s AND rej.route = %(route)s AND rej.fb_regen
   AND rej.pii_flags = 0 AND cho.pii_flags = 0
   AND rej.created_at >= now() - interval '60 days') TO STDOUT"""
FLOOR_COLUMNS = {
    "kto": "id, created_at, messages, completion, rating, label",
    "dpo": "ids, created_ats, messages, chosen, rejected, rating",
}


def copy_seconds(conn: psycopg.Connection, sql: str, params: dict) -> tuple[float, int, int]:
    t = time.perf_counter()
    rows = nbytes = 0
    with conn.cursor() as cur, cur.copy(sql, params) as copy:
        for data in copy:
            nbytes += len(data)
            rows += bytes(data).count(b"\n")
    return time.perf_counter() - t, rows, nbytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="log rows (children come on top)")
    ap.add_argument("--threshold", type=float, default=0.1, help="semantic dedup distance")
    ap.add_argument("--radius", type=float, default=0.2, help="neighbour search radius")
    ap.add_argument("--neighbours", type=int, default=10, help="neighbours stored per row (k)")
    ap.add_argument(
        "--link-workers", type=int, default=1, help="parallel neighbour-search sessions"
    )
    ap.add_argument("--repeat", type=int, default=1, help="floor + snapshot pairs per method")
    ap.add_argument(
        "--snapshot-function",
        default=datasets.SNAPSHOT_FUNCTION,
        help="the SQL function the snapshots run (an older version, to compare)",
    )
    ap.add_argument(
        "--database-url", help="an empty database to use (default: a temp embedded one)"
    )
    ap.add_argument(
        "--pgdata",
        type=Path,
        help="a data directory to keep: loaded the first time, reused (setup skipped) after",
    )
    args = ap.parse_args()

    url = args.database_url
    pgdata = args.pgdata
    if not url:
        pgdata = pgdata or Path(tempfile.mkdtemp(prefix="cft-bench-")) / "pg"
        url = embedded.start(
            pgdata,
            tuning={
                "fsync": "off",
                "synchronous_commit": "off",
                "full_page_writes": "off",
                # An HNSW build is fast only while its graph fits here (~1.2 KB a row).
                "maintenance_work_mem": "4GB" if args.rows > 400_000 else "1GB",
                "max_parallel_maintenance_workers": "2",
                "work_mem": "64MB",
                # A KTO snapshot at 1M rows writes ~200 MB of WAL (384k examples): with the
                # 1 GB default a checkpoint falls inside every fifth snapshot.
                "max_wal_size": "8GB",
            },
        )
    try:
        return run(url, args)
    finally:
        if pgdata is not None:  # the temp server outlives this process unless stopped
            embedded.stop(pgdata, mode="fast")


def run(url: str, args: argparse.Namespace) -> int:
    """Load, snapshot, compare."""
    migrate(url)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        route = "bench-route"
        loaded = conn.execute("SELECT id FROM tenant WHERE name = 'bench'").fetchone()
        if loaded:  # --pgdata from an earlier run: the same data, setup skipped
            tenant = loaded["id"]
            p = {"tenant": tenant, "route": route}
            total = conn.execute("SELECT count(*) AS n FROM obs.inference_log").fetchone()["n"]
            print(f"reusing {total} log rows (setup skipped)", flush=True)
            finish_setup(conn, url, args)
        else:
            tenant = setup(conn, url, args, route)
            p = {"tenant": tenant, "route": route}
        run_snapshots(conn, args, tenant, route, p)
    return 0


def setup(conn: psycopg.Connection, url: str, args: argparse.Namespace, route: str) -> int:
    """Load the synthetic traffic, build the HNSW index, search neighbours, refresh views."""
    tenant: int = conn.execute(
        "INSERT INTO tenant (name, consent_training) VALUES ('bench', true) RETURNING id"
    ).fetchone()["id"]
    conn.execute(
        "INSERT INTO serve.route (name, tenant_id, base_model) VALUES (%s, %s, 'm')",
        (route, tenant),
    )
    p = {"tenant": tenant, "route": route, "n": args.rows, "k": int(args.rows * 0.9)}

    t = time.perf_counter()
    # Bulk load without the HNSW index, then build it once (as a backfill would).
    conn.execute("DROP INDEX obs.inference_log_embedding_idx")
    for statement in LOAD.split(";\n"):
        if statement.strip():
            conn.execute(statement, p)
    total = conn.execute("SELECT count(*) AS n FROM obs.inference_log").fetchone()["n"]
    print(
        f"loaded {total} log rows with embeddings in {time.perf_counter() - t:.1f} s",
        flush=True,
    )
    build_index(conn)
    link_and_refresh(conn, url, args)
    return tenant


def build_index(conn: psycopg.Connection) -> None:
    t = time.perf_counter()
    conn.execute(
        "CREATE INDEX inference_log_embedding_idx ON obs.inference_log USING hnsw (embedding halfvec_cosine_ops)"
    )
    conn.execute("VACUUM ANALYZE obs.inference_log")
    print(f"HNSW index built in {time.perf_counter() - t:.1f} s", flush=True)


def finish_setup(conn: psycopg.Connection, url: str, args: argparse.Namespace) -> None:
    """An interrupted setup (--pgdata) goes on where it stopped: index, then the queue."""
    if not conn.execute(
        "SELECT 1 FROM pg_indexes WHERE schemaname = 'obs'"
        " AND indexname = 'inference_log_embedding_idx'"
    ).fetchone():
        build_index(conn)
    pending = conn.execute(
        "SELECT count(*) AS n FROM obs.prompt_neighbour_scan WHERE radius IS NULL AND candidate"
    ).fetchone()["n"]
    if pending:
        print(f"{pending} rows still queued for the neighbour search", flush=True)
        link_and_refresh(conn, url, args)


def link_and_refresh(conn: psycopg.Connection, url: str, args: argparse.Namespace) -> None:
    t = time.perf_counter()
    linked = link_all(url, args)
    t_link = time.perf_counter() - t
    edges = conn.execute("SELECT count(*) AS n FROM obs.prompt_neighbour").fetchone()["n"]
    conn.execute("VACUUM ANALYZE obs.prompt_neighbour, obs.prompt_neighbour_scan")
    print(
        f"neighbour search (ingest cost, {args.link_workers} session(s)): {linked} rows in"
        f" {t_link:.1f} s = {linked / t_link:.0f} rows/s; {edges} edges within"
        f" {args.radius}, k {args.neighbours}",
        flush=True,
    )

    t = time.perf_counter()
    datasets.refresh_candidates(conn)
    conn.execute("ANALYZE train.kto_candidate, train.pair_candidate")
    print(f"candidate views refreshed in {time.perf_counter() - t:.1f} s", flush=True)


def settle(conn: psycopg.Connection) -> None:
    """Untimed, before each floor + snapshot pair: write out what the previous pair dirtied.

    A KTO snapshot at 1M rows writes ~380 MB (heap, index, WAL). Left in the page cache, its
    writeback by the kernel (2 shared cores here) could land on any later pair; settled, each
    pair starts from the same state. (Back-to-back committed snapshots grew from 3.3 s to
    4.6 s without it; settled runs still slowed once a COPY had run on the server, so the
    writeback is not the whole cause: see BENCHMARKS.md.) In production the checkpointer writes
    data pages in the background too; the bench's server runs with fsync off, so neither side
    pays an fsync.
    """
    # (--database-url without the right to CHECKPOINT: the sync still settles a local server)
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        conn.execute("CHECKPOINT")
    os.sync()


def run_snapshots(
    conn: psycopg.Connection, args: argparse.Namespace, tenant: int, route: str, p: dict
) -> None:
    """Each method: the COPY floor, then the snapshot, in the same run."""
    datasets.SNAPSHOT_FUNCTION = args.snapshot_function
    # One untimed pass of each floor first: on a freshly started server the first COPY reads
    # cold pages and would make the first ratio look better than the rest.
    for floor_sql in (FLOOR_KTO, FLOOR_DPO):
        copy_seconds(conn, floor_sql, p)
    results = []
    for method, floor_sql in [("kto", FLOOR_KTO), ("dpo", FLOOR_DPO)] * args.repeat:
        settle(conn)
        t_floor, floor_rows, floor_bytes = copy_seconds(conn, floor_sql, p)
        t = time.perf_counter()
        snap = datasets.create_snapshot(
            conn,
            tenant_id=tenant,
            route=route,
            method=method,
            dedup_threshold=args.threshold,
            refresh=False,
        )
        t_snap = time.perf_counter() - t
        results.append((method, t_snap, t_floor, floor_rows, floor_bytes, snap))

    print()
    print(f"{'method':6} {'floor rows':>10} {'COPY s':>8} {'snapshot s':>10} {'ratio':>6}  counts")
    for method, t_snap, t_floor, floor_rows, _, snap in results:
        c = snap.counts
        steps = " -> ".join(
            f"{k} {c[k]}"
            for k in ("view_rows", "in_window", "live_ok", "exact_dedup", "semantic_dedup")
        )
        print(
            f"{method:6} {floor_rows:>10} {t_floor:>8.3f} {t_snap:>10.3f} {t_snap / t_floor:>5.1f}x  {steps}"
        )
    for method in ("kto", "dpo"):
        ratios = sorted(r[1] / r[2] for r in results if r[0] == method)
        print(f"{method}: median ratio {statistics.median(ratios):.1f}x of {len(ratios)} run(s)")
    for method, _, _, _, floor_bytes, snap in results[:2]:
        c = snap.counts
        ms = ", ".join(f"{k} {v}" for k, v in snap.params["step_ms"].items())
        print(
            f"{method}: COPY {floor_bytes / 1e6:.1f} MB; searched_rows {c['searched_rows']},"
            f" probed_live {c['probed_live']}; ms per step: {ms}"
        )
    for method, columns in FLOOR_COLUMNS.items():
        print(f"{method} floor: COPY of the candidate rows' {columns}")
    print(
        f"(threshold {args.threshold}; snapshots via {datasets.SNAPSHOT_FUNCTION}; each pair"
        " after an untimed CHECKPOINT + sync)"
    )
    # What the API's default (refresh=true) adds before a snapshot: a refresh of the view the
    # method reads (all tenants and routes); then of every view (`cft dataset refresh`).
    floors = {m: statistics.median(r[2] for r in results if r[0] == m) for m in ("kto", "dpo")}
    for label, methods in (
        ("the KTO view", ["kto"]),
        ("the pair view", ["dpo"]),
        ("every view", None),
    ):
        t = time.perf_counter()
        datasets.refresh_candidates(conn, methods)
        t_refresh = time.perf_counter() - t
        floor = methods[0] if methods else "kto"
        print(
            f"refresh of {label} (CONCURRENTLY): {t_refresh:.2f} s ="
            f" {t_refresh / floors[floor]:.1f}x the {floor.upper()} floor"
        )
    print("(a snapshot with refresh=true, the API's default, refreshes its method's view first)")


def link_all(url: str, args: argparse.Namespace) -> int:
    """Drain the neighbour queue from --link-workers sessions (SKIP LOCKED shares it)."""
    done: list[int] = []

    def work() -> None:
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as c:
            done.append(
                link_pending(c, radius=args.radius, neighbours=args.neighbours, batch_size=1000)
            )

    threads = [threading.Thread(target=work) for _ in range(args.link_workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sum(done)


if __name__ == "__main__":
    raise SystemExit(main())
