"""Prometheus metrics of the embedder (`cft worker embed --metrics-port`): rows done and the
two backlogs (rows waiting for an embedding, rows waiting for a neighbour search) and their age."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge

from app.core.db import Connection
from app.core.metrics import REGISTRY

EMBEDDER_ROWS = Counter(
    "cft_embedder_rows_total",
    "Log rows done by the embedder, by stage (embedded, searched: neighbours stored)",
    ["stage"],
    registry=REGISTRY,
)
EMBEDDER_BACKLOG = Gauge(
    "cft_embedder_backlog_rows",
    "Log rows waiting, by queue (embedding: no embedding yet; neighbours: embedded, their"
    " near duplicates not searched yet, obs.prompt_neighbour_scan with radius NULL)",
    ["queue"],
    registry=REGISTRY,
)
EMBEDDER_BACKLOG_AGE = Gauge(
    "cft_embedder_backlog_age_seconds",
    "Age (since it was logged) of the oldest row waiting in each queue; 0 when it is empty",
    ["queue"],
    registry=REGISTRY,
)

# Both counts read the queues' partial indexes (inference_log_embedding_pending_idx,
# prompt_neighbour_scan_pending_idx): O(backlog), never the whole log.
_BACKLOG = """
SELECT (SELECT count(*) FROM obs.inference_log WHERE embedding IS NULL) AS embedding_rows,
       (SELECT extract(epoch FROM now() - min(created_at)) FROM obs.inference_log
         WHERE embedding IS NULL) AS embedding_age,
       (SELECT count(*) FROM obs.prompt_neighbour_scan WHERE radius IS NULL AND candidate)
         AS neighbours_rows,
       (SELECT extract(epoch FROM now() - min(created_at)) FROM obs.prompt_neighbour_scan
         WHERE radius IS NULL AND candidate) AS neighbours_age
"""


def backlog(conn: Connection) -> dict[str, Any]:
    """The two queues' lengths and the age in seconds of their oldest rows (0 when empty)."""
    row = conn.execute(_BACKLOG).fetchone()
    assert row is not None
    out = {k: float(v or 0) for k, v in row.items()}
    for queue in ("embedding", "neighbours"):
        EMBEDDER_BACKLOG.labels(queue).set(out[f"{queue}_rows"])
        EMBEDDER_BACKLOG_AGE.labels(queue).set(out[f"{queue}_age"])
    return out
