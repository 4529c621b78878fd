"""Every `cft` command the images run works with only what the image installs.

The dev venv has `.[ml,dev,demo]`; the images have less (deploy/smoke/install.py computes what,
from pyproject.toml and the installed distributions' requirements). Each command runs in a
subprocess whose sitecustomize blocks every module the image lacks, so a new dev-only import on
a production path (the `openai` of the demo, once imported by every command) fails here. The
`core` image (control plane) has no ML stack: `cft migrate` and `cft serve` run for real there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from cft.cli import WORKERS
from deploy.smoke import install
from tests.support.db import with_database
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
CFT = [str(Path(sys.executable).with_name("cft"))]  # the console script the image runs
ML = {"torch", "transformers", "peft", "trl", "bitsandbytes", "accelerate", "datasets", "gguf"}
ML |= {"sentence_transformers", "safetensors"}
DEV = {"openai", "pytest", "moto", "playwright", "schemathesis", "mypy", "ruff"}


@pytest.fixture(scope="module")
def blockers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One blocker folder per image variant."""
    tmp = tmp_path_factory.mktemp("blockers")
    return {image: install.write_blocker(tmp / image, image) for image in install.IMAGE_EXTRAS}


def _env(blockers: dict[str, Path], image: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CFT_")}
    return install.blocker_env(env | {"CFT_HOME": str(ROOT / ".cft")} | extra, blockers[image])


def _run(blockers: dict[str, Path], image: str, argv: list[str], **extra: str) -> str:
    r = subprocess.run(
        argv, env=_env(blockers, image, **extra), capture_output=True, text=True, timeout=120,
        cwd=ROOT, check=False,
    )  # fmt: skip
    assert r.returncode == 0, f"`{shlex.join(argv)}` in the {image} image:\n{r.stderr[-3000:]}"
    return r.stdout


def _variant(service: dict[str, Any]) -> str:
    return str(service["build"]["args"]["VARIANT"])


def image_commands() -> list[tuple[str, str, list[str]]]:
    """(where, image variant, argv) of every cft command docker-compose.yml and the Dockerfile run."""
    out: list[tuple[str, str, list[str]]] = []
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name, service in services.items():
        command = service.get("command")
        if "build" not in service or command is None:
            continue
        argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        # A cuda image is the cpu one with other torch wheels: the same distributions here.
        image = "cpu" if _variant(service) == "cuda" else _variant(service)
        out.append((f"compose:{name}", image, argv))
    text = (ROOT / "Dockerfile").read_text()
    cmd = re.search(r"(?m)^CMD\s+(\[.*\])\s*$", text)
    assert cmd, "Dockerfile has no exec-form CMD"
    # The Dockerfile's CMD serves the control plane: it must run in the slimmest image.
    out.append(("Dockerfile:CMD", "core", json.loads(cmd.group(1))))
    return out


# The entry points a deployment starts (migrate, serve, engine, each worker); the ones compose or
# the Dockerfile runs are tried there.
ENTRY_POINTS = [
    ["--help"],
    ["migrate", "--help"],
    ["serve", "--help"],
    ["engine", "--help"],
    *[["worker", name, "--help"] for name in WORKERS],
]


def _key(args: list[str]) -> tuple[str, ...]:
    return tuple(args[:2]) if args[0] == "worker" else tuple(args[:1])


def help_commands() -> list[tuple[str, str, list[str]]]:
    """(id, image, cft arguments + --help): each image command in its image (a `core` image
    blocks more than `cpu`), then each other entry point in the cpu image, and bare `cft` in core."""
    out = [(w, image, [*argv[1:], "--help"]) for w, image, argv in image_commands()]
    covered = {_key(args) for _, _, args in out}
    for args in ENTRY_POINTS:
        if _key(args) not in covered:
            out.append(("cpu:cft " + " ".join(args), "cpu", args))
    out.append(("core:cft --help", "core", ["--help"]))
    return out


def test_the_blockers_block(blockers: dict[str, Path]) -> None:
    """A dev-only module fails in both images, an ML module in core only, cft's own never."""
    cpu, core = (json.loads((blockers[i] / "blocked.json").read_text()) for i in ("cpu", "core"))
    assert set(cpu["modules"]) >= DEV and not ML & set(cpu["modules"])
    assert set(core["modules"]) >= (DEV | ML)
    assert not {"app", "workers", "cft", "fastapi", "psycopg", "boto3"} & set(core["modules"])
    probe = "import importlib.metadata as m, importlib.util as u, sys;"
    probe += " assert u.find_spec(sys.argv[1]) is None; m.version(sys.argv[1])"
    for image, module in (("cpu", "openai"), ("core", "torch")):
        r = subprocess.run(
            [sys.executable, "-c", f"import {module}"], env=_env(blockers, image),
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, (image, module)
        r = subprocess.run(
            [sys.executable, "-c", probe, module], env=_env(blockers, image),
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert "PackageNotFoundError" in r.stderr, (image, module, r.stderr[-500:])
    _run(blockers, "core", [sys.executable, "-c", "import app.core.db, cft.cli"])


@pytest.mark.parametrize(
    "where,image,args", help_commands(), ids=[w for w, _, _ in help_commands()]
)
def test_every_command_parses_in_its_image(
    blockers: dict[str, Path], where: str, image: str, args: list[str]
) -> None:
    assert "usage: cft" in _run(blockers, image, [*CFT, *args]), where


def test_image_commands_are_cft_commands() -> None:
    for where, _, argv in image_commands():
        assert argv[0] == "cft", f"{where}: {argv}"


def test_core_image_migrates_and_serves(blockers: dict[str, Path], pg_server: str) -> None:
    """`cft migrate` on an empty database, then `cft serve` answers /healthz, with no ML stack."""
    dbname = f"core_{os.getpid()}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    url = with_database(pg_server, dbname)
    try:
        out = _run(blockers, "core", [*CFT, "migrate"], CFT_DATABASE_URL=url)
        assert "database created from sql/" in out
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT to_regclass('serve.adapter')").fetchone() == (
                "serve.adapter",
            )
        port = free_port()
        argv = [*CFT, "serve", "--host", "127.0.0.1", "--port", str(port), "--no-migrate"]
        proc = subprocess.Popen(
            argv, env=_env(blockers, "core", CFT_DATABASE_URL=url), cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, f"cft serve exited:\n{proc.stdout.read()[-3000:]}"  # type: ignore[union-attr]
                try:
                    r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline, "cft serve never answered /healthz"
                    time.sleep(0.2)
            assert r.status_code == 200, r.text
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
