"""`cft worker train --devices …`: one claiming trainer process per device group, supervised.

Each child is `python -m workers.trainer --device-group G` pinned to its GPUs with
CUDA_VISIBLE_DEVICES (empty for CPU workers). A child that exits non-zero is reported with its
devices, pid and exit code or signal, and restarted after a short backoff; one that dies more than
`max_restarts` times within `window_s` makes the supervisor stop the others and exit 1. A child
that exits 0 (its --once run done) is not restarted; when every child has, the supervisor exits
0. SIGTERM or SIGINT stops every child (SIGTERM, then SIGKILL after `grace_s`) and exits 0. A run
that a killed child held is reclaimed by another worker once its lease expires.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from workers.trainer.devices import DeviceGroup

log = logging.getLogger(__name__)


@dataclass
class Child:
    """One supervised trainer process and its recent deaths."""

    group: DeviceGroup
    label: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    deaths: deque[float] = field(default_factory=deque)
    done: bool = False
    restart_at: float = 0.0


def describe_exit(rc: int) -> str:
    """`exit code 3` or `killed by SIGKILL`."""
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


class Supervisor:
    """Starts and watches one trainer process per device group."""

    def __init__(
        self,
        groups: list[DeviceGroup],
        child_args: list[str],
        *,
        max_restarts: int = 3,
        window_s: float = 600.0,
        backoff_s: float = 2.0,
        grace_s: float = 30.0,
    ) -> None:
        parent_visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.children = []
        for g in groups:
            env = g.env(parent_visible)
            label = env["CUDA_VISIBLE_DEVICES"] if g.kind == "cuda" else g.label
            self.children.append(Child(g, label, env))
        self.child_args = child_args
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.backoff_s = backoff_s
        self.grace_s = grace_s
        self.stop = threading.Event()

    def _start(self, child: Child) -> None:
        cmd = [sys.executable, "-m", "workers.trainer", "--device-group", child.label]
        child.proc = subprocess.Popen(cmd + self.child_args, env=os.environ | child.env)
        log.info(
            "trainer for devices %s started (pid %d, CUDA_VISIBLE_DEVICES=%r)",
            child.label,
            child.proc.pid,
            child.env["CUDA_VISIBLE_DEVICES"],
        )

    def run(self) -> int:
        """Supervise until every child is done, one keeps dying (1), or stop is set (0)."""
        for child in self.children:
            self._start(child)
        try:
            while not self.stop.is_set():
                if all(c.done for c in self.children):
                    log.info("every trainer finished")
                    return 0
                failed = self._check()
                if failed is not None:
                    return failed
                self.stop.wait(0.5)
            return 0
        finally:
            self._stop_all()

    def _check(self) -> int | None:
        now = time.monotonic()
        for child in self.children:
            if child.done:
                continue
            if child.proc is None:
                if now >= child.restart_at:
                    self._start(child)
                continue
            rc = child.proc.poll()
            if rc is None:
                continue
            if rc == 0:
                log.info("trainer for devices %s (pid %d) exited 0", child.label, child.proc.pid)
                child.done = True
                continue
            child.deaths.append(now)
            while child.deaths and now - child.deaths[0] > self.window_s:
                child.deaths.popleft()
            if len(child.deaths) > self.max_restarts:
                log.error(
                    "trainer for devices %s (pid %d) died: %s; it died %d times in %.0f s"
                    " (more than --max-restarts %d): stopping every trainer",
                    child.label,
                    child.proc.pid,
                    describe_exit(rc),
                    len(child.deaths),
                    self.window_s,
                    self.max_restarts,
                )
                return 1
            log.error(
                "trainer for devices %s (pid %d) died: %s; restarting it (%d of %d restarts"
                " in %.0f s); a run it held is reclaimed when its lease expires",
                child.label,
                child.proc.pid,
                describe_exit(rc),
                len(child.deaths),
                self.max_restarts,
                self.window_s,
            )
            child.proc = None
            child.restart_at = now + self.backoff_s * len(child.deaths)
        return None

    def _stop_all(self) -> None:
        live = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for proc in live:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.warning(
                    "trainer pid %d ignored SIGTERM for %.0f s: SIGKILL", proc.pid, self.grace_s
                )
                proc.kill()
                proc.wait()


def install_signals(sup: Supervisor) -> None:
    """SIGTERM and SIGINT stop the supervisor (and so every child)."""

    def _stop(*_: Any) -> None:
        sup.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
