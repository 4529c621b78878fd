"""Maintenance passes: obs.inference_log's partitions (SQL does the work), orphan artefacts."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import psycopg

from app.core.artefacts import ArtefactStore
from app.core.db import Connection

log = logging.getLogger("cft.maintenance")


@dataclass
class MaintenanceReport:
    """What one pass changed."""

    created: list[str] = field(default_factory=list)
    rescued: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    neighbours_pruned: int = 0
    errors: list[str] = field(default_factory=list)  # "step: error" of steps that failed


# Everything older than this is gone from obs.inference_log after obs.drop_partitions: the
# retention cutoff, or earlier when the oldest remaining partition starts before it (a partition
# is dropped only when its whole week is past the cutoff, so its older rows stay).
_PRUNE_NEIGHBOURS_SQL = """
SELECT obs.prune_prompt_neighbours(least(
         now() - %s::interval,
         (SELECT min(from_at) FROM obs.inference_log_partition))) AS n
"""


def run_once(conn: Connection, *, weeks_ahead: int, retention_days: int) -> MaintenanceReport:
    """Create partitions ahead, give DEFAULT's rows partitions, drop those past retention.

    Each step is a transaction of its own, and a step that fails (e.g. out of lock slots) is
    logged in the report without stopping the next: retention runs whatever the others do.
    Dropping a partition fires no trigger, so the near-duplicate marks and edges of its rows
    (obs.prompt_neighbour_scan / obs.prompt_neighbour) are pruned in the same transaction."""
    keep = f"{int(retention_days)} days"
    report = MaintenanceReport()

    def names(sql: str, *params: object) -> list[str]:
        return [next(iter(r.values())) for r in conn.execute(sql, params)]

    def create() -> None:
        report.created = names("SELECT * FROM obs.create_partitions(%s)", weeks_ahead)

    def rescue() -> None:
        report.rescued = names(
            "SELECT * FROM obs.move_default_rows(%s::interval, %s)", keep, weeks_ahead
        )

    def drop() -> None:
        report.dropped = names("SELECT * FROM obs.drop_partitions(%s::interval)", keep)
        pruned = conn.execute(_PRUNE_NEIGHBOURS_SQL, (keep,)).fetchone()
        report.neighbours_pruned = int(next(iter(pruned.values()))) if pruned else 0

    for step in (create, rescue, drop):
        try:
            with conn.transaction():
                step()
        except psycopg.Error as exc:
            log.error("maintenance step %s failed: %s", step.__name__, exc)
            report.errors.append(f"{step.__name__}: {exc}")
    return report


def sweep_orphan_artefacts(
    conn: Connection,
    store: ArtefactStore,
    *,
    grace_hours: float,
    now: datetime | None = None,
) -> list[str]:
    """Delete stored versions no adapter row references, once older than the grace period.

    Such a version is an upload whose registration never committed (a worker killed between
    put_dir and the adapter row's COMMIT, or a rolled-back registration). The worker uploads
    seconds before it commits, so a version younger than the grace period is left alone: its
    row may still be on its way. A version counts as referenced when an adapter row names its
    URI or has its version as id (the worker names the version after the adapter). Returns the
    URIs deleted.
    """
    cutoff = (now or datetime.now(UTC)) - timedelta(hours=grace_hours)
    rows = conn.execute("SELECT id, weights_uri FROM serve.adapter").fetchall()
    ids = {r["id"] for r in rows}
    uris = {r["weights_uri"] for r in rows if r["weights_uri"]}
    deleted = []
    for version in store.versions():
        if version.modified_at > cutoff:
            continue
        if not version.partial and (version.uri in uris or version.version in ids):
            continue
        store.delete(version)
        log.info("deleted orphan artefact %s (last written %s)", version.uri, version.modified_at)
        deleted.append(version.uri)
    return deleted
