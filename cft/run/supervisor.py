"""A small process supervisor for `cft run`: start, watch, stop a group of services."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class Service:
    """One supervised child process."""

    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes]

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc.poll() is None

    def tail(self, lines: int = 20) -> str:
        """The end of its log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the supervisor dies (Linux), so no service is orphaned."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ServiceFailed(RuntimeError):
    """A supervised service exited or never became ready."""


class Supervisor:
    """Children in their own process group; logs under log_dir; stopped together."""

    def __init__(self, log_dir: Path, env: dict[str, str]):
        self.log_dir = log_dir
        self.env = env
        self.services: list[Service] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(
        self, name: str, argv: list[str], *, extra_env: dict[str, str] | None = None
    ) -> Service:
        """Start a service; its output goes to <log_dir>/<name>.log."""
        log_path = self.log_dir / f"{name}.log"
        log = log_path.open("ab")
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env | (extra_env or {}),
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        log.close()
        svc = Service(name, argv, log_path, proc)
        self.services.append(svc)
        return svc

    def wait_http(self, svc: Service, url: str, timeout: float) -> None:
        """Wait until url answers below 500, or fail with the service's log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not svc.alive():
                raise ServiceFailed(f"{svc.name} exited ({svc.proc.returncode}):\n{svc.tail()}")
            try:
                if httpx.get(url, timeout=2).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise ServiceFailed(f"{svc.name} not ready after {timeout:.0f} s:\n{svc.tail()}")

    def check(self) -> None:
        """Raise if any service died."""
        for svc in self.services:
            if not svc.alive():
                raise ServiceFailed(f"{svc.name} exited ({svc.proc.returncode}):\n{svc.tail()}")

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM every service (newest first), then SIGKILL what is left after grace."""
        for svc in reversed(self.services):
            if svc.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(svc.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for svc in reversed(self.services):
            remaining = max(0.0, deadline - time.monotonic())
            try:
                svc.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(svc.proc.pid, signal.SIGKILL)
                svc.proc.wait(timeout=5)
        self.services.clear()
