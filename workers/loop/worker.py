"""`cft worker loop` (or `python -m workers.loop`): start the cycles that are due and drive them.

Every --interval seconds, and when woken by NOTIFY cft_loop (a cycle started, a training run or
an eval request ended) or cft_adapter, a pass: start due cycles (loop.start_due_cycles: triggers
and limits in SQL), then claim due cycles one at a time and run one step each
(app.loop.steps.drive_one). The candidate views are refreshed every --refresh seconds so the
volume trigger sees new feedback. Several workers may run: claims skip each other's cycles, and
a worker that dies is replaced after its --lease (which must outlast the longest step, a
snapshot of the largest route).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row

from app.core.metrics import LOOP_CYCLES_STARTED
from app.datasets import service as datasets
from app.loop import cycles, steps

log = logging.getLogger("cft.loop")

CHANNELS = ("cft_loop", "cft_adapter")
MAX_STEPS_PER_PASS = 100


def _connect(url: str, *, autocommit: bool = False) -> psycopg.Connection[Any]:
    return psycopg.connect(
        url, autocommit=autocommit, row_factory=dict_row, application_name="cft-loop"
    )


class LoopWorker:
    """One loop worker process."""

    def __init__(
        self, db_url: str, *, worker_id: str = "", lease_s: float = 120.0, refresh_s: float = 60.0
    ) -> None:
        self.db_url = db_url
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.lease_s = lease_s
        self.refresh_s = refresh_s
        self.stop = threading.Event()
        self._refreshed = 0.0

    def run_once(self) -> int:
        """One pass: refresh views if due, start due cycles, step every due cycle; steps run."""
        n = 0
        with _connect(self.db_url) as conn:
            if self.refresh_s >= 0 and time.monotonic() - self._refreshed >= self.refresh_s:
                with conn.transaction():
                    datasets.refresh_candidates(conn)
                self._refreshed = time.monotonic()
            with conn.transaction():
                for c in cycles.start_due(conn):
                    LOOP_CYCLES_STARTED.labels(c.trigger).inc()
                    log.info("cycle %s of %s started by %s", c.id, c.route, c.trigger)
            while n < MAX_STEPS_PER_PASS and not self.stop.is_set():
                if steps.drive_one(conn, worker_id=self.worker_id, lease_s=self.lease_s) is None:
                    break
                n += 1
        return n

    def run_forever(self, interval: float) -> None:
        """Passes until stop is set: on NOTIFY, or every interval seconds."""
        listener = _connect(self.db_url, autocommit=True)
        try:
            for channel in CHANNELS:
                listener.execute(f"LISTEN {channel}")
            while not self.stop.is_set():
                try:
                    self.run_once()
                except psycopg.Error as exc:
                    log.warning("loop pass failed: %s", exc)
                for _ in listener.notifies(timeout=interval, stop_after=1):
                    pass
        finally:
            listener.close()
