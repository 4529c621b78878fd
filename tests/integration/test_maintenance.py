"""The maintenance passes: real partitions, orphan artefacts in a local and an S3 store (moto)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest

from app.core.artefacts import LocalStore, S3Store
from tests.support.factories import make_adapter, make_log, make_route, make_tenant
from tests.support.servers import free_port
from workers.maintenance.tasks import run_once, sweep_orphan_artefacts


def _partition_of(conn, log_id: int) -> str:
    return conn.execute(
        "SELECT tableoid::regclass::text AS p FROM obs.inference_log WHERE id = %s", (log_id,)
    ).fetchone()["p"]


def test_maintenance_pass_creates_rescues_and_drops(conn):
    t = make_tenant(conn)
    past = make_log(conn, tenant_id=t["id"], created_at=datetime.now(UTC) - timedelta(days=30))
    future = make_log(conn, tenant_id=t["id"], created_at=datetime.now(UTC) + timedelta(weeks=30))
    ancient = make_log(conn, tenant_id=t["id"], created_at=datetime.now(UTC) - timedelta(days=400))
    report = run_once(conn, weeks_ahead=6, retention_days=90)
    assert len(report.created) >= 1
    assert len(report.rescued) == 1
    assert _partition_of(conn, past["id"]) == "obs." + report.rescued[0]
    # 30 weeks ahead is past the window: no partition for it, the row waits in DEFAULT.
    assert _partition_of(conn, future["id"]) == "obs.inference_log_default"
    gone = conn.execute(
        "SELECT count(*) AS n FROM obs.inference_log WHERE id = %s", (ancient["id"],)
    )
    assert gone.fetchone()["n"] == 0
    # The row deleted from DEFAULT leaves a marker for the snapshots (stale candidate views).
    markers = conn.execute("SELECT log_id FROM obs.deleted_log").fetchall()
    assert ancient["id"] in [r["log_id"] for r in markers]
    # A second pass has nothing to do.
    again = run_once(conn, weeks_ahead=6, retention_days=90)
    assert (again.created, again.rescued, again.dropped) == ([], [], [])


def _embedded_log(conn, tenant_id: int, created_at: str) -> int:
    """A log row with an embedding (the insert trigger queues it for the neighbour search)."""
    return conn.execute(  # type: ignore[no-any-return]
        f"""INSERT INTO obs.inference_log (request_id, tenant_id, route, adapter_id, messages,
                                          completion, embedding, created_at)
            VALUES (gen_random_uuid(), %s, 'route', 'base', '[]', 'a',
                    array_fill(0.1, ARRAY[384])::halfvec(384), {created_at})
            RETURNING id""",
        (tenant_id,),
    ).fetchone()["id"]


def test_maintenance_pass_prunes_neighbours_of_dropped_rows(conn):
    t = make_tenant(conn)
    ancient = _embedded_log(conn, t["id"], "now() - interval '400 days'")
    # Older than the cutoff, but its week reaches past it: the partition and the row stay.
    kept_old = _embedded_log(conn, t["id"], "obs.week_start(now() - interval '90 days')")
    recent = _embedded_log(conn, t["id"], "now() - interval '1 day'")
    edges = [(ancient, recent), (kept_old, recent)]
    for a, b in edges:
        conn.execute(
            """INSERT INTO obs.prompt_neighbour
                 (tenant_id, route, a_id, a_created_at, b_id, b_created_at, distance)
               SELECT %s, 'route', a.id, a.created_at, b.id, b.created_at, 0.01
                 FROM obs.inference_log a, obs.inference_log b WHERE a.id = %s AND b.id = %s""",
            (t["id"], a, b),
        )
    marks = "SELECT log_id FROM obs.prompt_neighbour_scan WHERE tenant_id = %s ORDER BY log_id"
    assert [r["log_id"] for r in conn.execute(marks, (t["id"],))] == [ancient, kept_old, recent]

    report = run_once(conn, weeks_ahead=6, retention_days=90)
    assert report.neighbours_pruned == 2  # the ancient row's mark and its edge
    assert [r["log_id"] for r in conn.execute(marks, (t["id"],))] == [kept_old, recent]
    left = conn.execute(
        "SELECT a_id, b_id FROM obs.prompt_neighbour WHERE tenant_id = %s", (t["id"],)
    ).fetchall()
    assert [(r["a_id"], r["b_id"]) for r in left] == [(kept_old, recent)]
    live = conn.execute(
        "SELECT count(*) AS n FROM obs.inference_log WHERE id = ANY(%s)", ([kept_old, recent],)
    ).fetchone()["n"]
    assert live == 2
    assert run_once(conn, weeks_ahead=6, retention_days=90).neighbours_pruned == 0


@pytest.fixture(scope="module")
def s3_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=(port := free_port()))
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def _version_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"w" * 64)
    (path / "adapter_config.json").write_text('{"r": 8}')
    (path / "manifest.json").write_text("{}")
    return path


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_orphan_artefacts_are_deleted_after_the_grace_period(conn, tmp_path, s3_url, backend):
    if backend == "local":
        store: LocalStore | S3Store = LocalStore(tmp_path / "store")
    else:
        client = boto3.client(
            "s3",
            endpoint_url=s3_url,
            aws_access_key_id="k",
            aws_secret_access_key="s",
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=(bucket := f"orphans-{uuid.uuid4().hex[:8]}"))
        store = S3Store(bucket, client)
    t = make_tenant(conn)
    route = make_route(conn, tenant_id=t["id"])
    src = _version_dir(tmp_path / "src")
    name = route["name"]
    registered = store.put_dir(src, name, f"{name}-registered")
    make_adapter(conn, route=route, id=f"{name}-registered", weights_uri=registered.uri)
    # A row without a URI yet still protects the version named after it.
    store.put_dir(src, name, f"{name}-named")
    make_adapter(conn, route=route, id=f"{name}-named")
    # Uploaded, then the worker died before the adapter row committed.
    orphan = store.put_dir(src, name, f"{name}-orphan")
    expected = {orphan.uri}
    if backend == "local":
        # A copy killed before its rename leaves a hidden temporary directory.
        partial = _version_dir(tmp_path / "store" / name / f".{name}-orphan2-x1y2")
        expected.add(partial.as_uri())
    assert {v.version for v in store.versions()} >= {f"{name}-registered", f"{name}-orphan"}

    # Inside the grace period nothing goes: the row may still be on its way.
    assert sweep_orphan_artefacts(conn, store, grace_hours=24) == []
    later = datetime.now(UTC) + timedelta(hours=25)
    assert set(sweep_orphan_artefacts(conn, store, grace_hours=24, now=later)) == expected
    left = {v.version for v in store.versions()}
    assert left == {f"{name}-registered", f"{name}-named"}
    assert not store.exists(name, f"{name}-orphan")
    fetched = store.fetch(registered.uri, tmp_path / "fetched")
    assert (fetched / "adapter_model.safetensors").read_bytes() == b"w" * 64
    # Idempotent: a second pass finds nothing.
    assert sweep_orphan_artefacts(conn, store, grace_hours=24, now=later) == []


def test_one_writer_cannot_multiply_partitions(conn):
    """A thousand rows a week apart (as a direct writer could insert: the API refuses such a
    created_at) give no partition beyond the window, and maintenance keeps working."""
    t = make_tenant(conn)
    before = conn.execute("SELECT count(*) AS n FROM obs.inference_log_partition").fetchone()["n"]
    conn.execute(
        """INSERT INTO obs.inference_log
                  (tenant_id, request_id, route, adapter_id, messages, created_at)
           SELECT %s, gen_random_uuid(), 'r', 'a', '[]', now() + make_interval(weeks => 10 + g)
             FROM generate_series(1, 1000) g""",
        (t["id"],),
    )
    for _ in range(2):
        report = run_once(conn, weeks_ahead=4, retention_days=90)
        assert report.rescued == []
    after = conn.execute("SELECT count(*) AS n FROM obs.inference_log_partition").fetchone()["n"]
    assert after - before <= 1  # at most the week that came into reach
    n = conn.execute("SELECT count(*) AS n FROM ONLY obs.inference_log_default").fetchone()["n"]
    assert n == 1000
