"""docker-compose.yml read as Compose reads it, for running its services as local processes.

Interpolation (`${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?error}`, `${VAR:+alt}`,
`$$`, nested) from a .env file, YAML anchors and merge keys (PyYAML), `env_file` +
`environment`, the image's own `ENV` lines (Dockerfile runtime stage), named volumes and bind
mounts mapped to host folders, and service host names mapped to loopback ports. What this
cannot show (image builds, GPUs, Docker networks) is listed in docs/deployment.md.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXPR = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])(.*))?$", re.DOTALL)
_ENV_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)$")


class ComposeError(ValueError):
    """The compose file cannot be resolved (a required variable is unset, a bad expression)."""


def _braced(text: str, start: int) -> tuple[int, str]:
    """The expression inside `${...}` beginning at start, and the index after its `}`."""
    depth, i = 1, start
    while i < len(text):
        if text.startswith("${", i):
            depth, i = depth + 1, i + 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1, text[start:i]
        i += 1
    raise ComposeError(f"unclosed ${{ in {text!r}")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """text with Compose's variable syntax expanded from env."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("${", i):
            i, expr = _braced(text, i + 2)
            out.append(_expand(expr, env))
        elif text[i] == "$" and (m := _NAME.match(text, i + 1)):
            out.append(env.get(m.group(0), ""))
            i = m.end()
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _expand(expr: str, env: Mapping[str, str]) -> str:
    m = _EXPR.match(expr)
    if not m:
        raise ComposeError(f"bad variable expression ${{{expr}}}")
    name, op, rest = m.group(1), m.group(2), m.group(3) or ""
    value = env.get(name)
    is_set = value is not None and (value != "" or not (op or "").startswith(":"))
    if op is None:
        return value or ""
    if op in (":-", "-"):
        return value if is_set and value is not None else interpolate(rest, env)
    if op in (":?", "?"):
        if not is_set or value is None:
            raise ComposeError(f"{name}: {interpolate(rest, env) or 'required'}")
        return value
    return interpolate(rest, env) if is_set else ""  # :+ and +


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a .env file (comments and blanks skipped, quotes removed)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        m = _ENV_LINE.match(line)
        if m:
            value = m.group(2).strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            out[m.group(1)] = value
    return out


def _resolve(value: Any, env: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return interpolate(value, env)
    if isinstance(value, list):
        return [_resolve(v, env) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v, env) for k, v in value.items()}
    return value


def dockerfile_env(dockerfile: Path) -> dict[str, str]:
    """The `ENV` settings of the Dockerfile's last stage (the image that runs)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    runtime = re.split(r"(?im)^FROM\s", text)[-1]
    out: dict[str, str] = {}
    for line in runtime.splitlines():
        m = re.match(r"^\s*ENV\s+(.*)$", line)
        if m:
            for pair in shlex.split(m.group(1)):
                key, _, value = pair.partition("=")
                out[key] = value
    return out


def dockerfile_workdir(dockerfile: Path) -> str:
    """The last `WORKDIR` of the Dockerfile's last stage (where its processes start)."""
    runtime = re.split(r"(?im)^FROM\s", dockerfile.read_text())[-1]
    found = re.findall(r"(?m)^\s*WORKDIR\s+(\S+)", runtime)
    return found[-1] if found else "/"


@dataclass
class Service:
    """One compose service, resolved: what to run, with which environment and mounts."""

    name: str
    raw: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, Path] = field(default_factory=dict)  # container path -> host path

    @property
    def image(self) -> str:
        """The image name (empty for a service with no image)."""
        return str(self.raw.get("image", ""))

    @property
    def variant(self) -> str | None:
        """The cft image variant this service builds (cpu, cuda, core), None if not cft's."""
        build = self.raw.get("build")
        return str(build["args"]["VARIANT"]) if isinstance(build, dict) else None

    @property
    def command(self) -> list[str]:
        """The command as an argument list."""
        cmd = self.raw.get("command") or []
        return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]

    @property
    def one_shot(self) -> bool:
        """True for a service that runs to completion (restart: "no")."""
        return str(self.raw.get("restart", "no")) == "no"

    @property
    def depends_on(self) -> dict[str, str]:
        """Services this one waits for, with the condition."""
        deps = self.raw.get("depends_on") or {}
        if isinstance(deps, list):
            return dict.fromkeys(deps, "service_started")
        return {k: str((v or {}).get("condition", "service_started")) for k, v in deps.items()}

    def container_ports(self) -> list[int]:
        """Container ports it publishes (`host:container` or `addr:host:container`)."""
        return [int(str(p).rsplit(":", 1)[-1].split("/")[0]) for p in self.raw.get("ports") or []]

    def host_path(self, container_path: str, root: Path) -> Path:
        """Where a container path lives on the host: in a mount, else in the service's root."""
        path = PurePosixPath(container_path)
        best: tuple[int, Path] | None = None
        for target, host in self.mounts.items():
            t = PurePosixPath(target)
            if (path == t or t in path.parents) and (best is None or len(t.parts) > best[0]):
                best = (len(t.parts), host / path.relative_to(t))
        if best:
            return best[1]
        return root / "containers" / self.name / str(path).lstrip("/")


@dataclass
class Project:
    """docker-compose.yml resolved with a .env file, for a project folder."""

    compose_file: Path
    project_dir: Path
    variables: dict[str, str]
    services: dict[str, Service]

    def order(self) -> list[str]:
        """Service names so that each comes after the services it depends on."""
        done: list[str] = []

        def visit(name: str, path: tuple[str, ...]) -> None:
            if name in done:
                return
            if name in path:
                raise ComposeError(f"dependency cycle: {' -> '.join((*path, name))}")
            for dep in self.services[name].depends_on:
                if dep in self.services:
                    visit(dep, (*path, name))
            done.append(name)

        for name in self.services:
            visit(name, ())
        return done


def load(
    compose_file: Path, project_dir: Path, *, image_env: Mapping[str, str] | None = None
) -> Project:
    """Resolve compose_file with project_dir/.env; services with profiles are left out
    (`docker compose up` without --profile). Volumes map to project_dir/volumes/NAME."""
    variables = read_env_file(project_dir / ".env")
    raw: dict[str, Any] = yaml.safe_load(compose_file.read_text())
    services: dict[str, Service] = {}
    for name, spec in raw["services"].items():
        if spec.get("profiles"):
            continue
        spec = _resolve({k: v for k, v in spec.items() if not k.startswith("x-")}, variables)
        svc = Service(name, spec)
        env: dict[str, str] = dict(image_env or {}) if svc.variant else {}
        for env_file in (
            [spec["env_file"]]
            if isinstance(spec.get("env_file"), str)
            else (spec.get("env_file") or [])
        ):
            env |= read_env_file(project_dir / env_file)
        environment = spec.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(e.split("=", 1) for e in environment)
        env |= {k: "" if v is None else str(v) for k, v in environment.items()}
        svc.env = env
        for volume in spec.get("volumes") or []:
            source, target = str(volume).split(":")[:2]
            if source.startswith((".", "/")):
                host = (compose_file.parent / source).resolve()
            else:
                host = project_dir / "volumes" / source
            svc.mounts[target] = host
        services[name] = svc
    return Project(compose_file, project_dir, variables, services)
