"""The maintenance pass over real partitions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.support.factories import make_log, make_tenant
from workers.maintenance.tasks import run_once


def test_maintenance_pass_creates_rescues_and_drops(conn):
    t = make_tenant(conn)
    future = make_log(conn, tenant_id=t["id"], created_at=datetime.now(UTC) + timedelta(weeks=30))
    ancient = make_log(conn, tenant_id=t["id"], created_at=datetime.now(UTC) - timedelta(days=400))
    report = run_once(conn, weeks_ahead=6, retention_days=90)
    assert len(report.created) >= 1
    assert len(report.rescued) == 1
    where = conn.execute(
        "SELECT tableoid::regclass::text AS p FROM obs.inference_log WHERE id = %s", (future["id"],)
    ).fetchone()["p"]
    assert where == "obs." + report.rescued[0]
    gone = conn.execute(
        "SELECT count(*) AS n FROM obs.inference_log WHERE id = %s", (ancient["id"],)
    )
    assert gone.fetchone()["n"] == 0
    # A second pass has nothing to do.
    again = run_once(conn, weeks_ahead=6, retention_days=90)
    assert (again.created, again.rescued, again.dropped) == ([], [], [])
