"""One maintenance pass over obs.inference_log's partitions (SQL does the work)."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.core.db import Connection


@dataclass
class MaintenanceReport:
    """What one pass changed."""

    created: list[str] = field(default_factory=list)
    rescued: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def run_once(conn: Connection, *, weeks_ahead: int, retention_days: int) -> MaintenanceReport:
    """Create partitions ahead, give DEFAULT's rows partitions, drop those past retention."""
    keep = f"{int(retention_days)} days"
    report = MaintenanceReport()
    with conn.transaction():
        rows = conn.execute("SELECT * FROM obs.create_partitions_v1(%s)", (weeks_ahead,))
        report.created = [next(iter(r.values())) for r in rows]
    with conn.transaction():
        rows = conn.execute("SELECT * FROM obs.move_default_rows_v1(%s::interval)", (keep,))
        report.rescued = [next(iter(r.values())) for r in rows]
    with conn.transaction():
        rows = conn.execute("SELECT * FROM obs.drop_partitions_v1(%s::interval)", (keep,))
        report.dropped = [next(iter(r.values())) for r in rows]
    return report
