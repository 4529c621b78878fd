"""`cft run`: the whole platform on one machine, and the demo that shows the loop running itself.

Starts the embedded PostgreSQL (migrated), the local inference engine with the bundled
SmolLM2-135M-Instruct, the API (control plane + router, with the reconciler), and the trainer,
evaluator, embedder, maintenance, experiments and loop workers, each a supervised process with
its log under CFT_HOME/logs. With --demo (the default on a database with no tenants), a
simulated product then sends users and turns its route's loop on (see app/demo/loop.py); the
loop worker does the rest, and a report read from SQL is printed. Ctrl-C stops everything.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from app.core import embedded
from app.core.auth import create_key
from app.core.config import Settings, get_settings
from app.core.db import connect, database_url, migrate
from cft.run.supervisor import ServiceFailed, Supervisor

DEMO_TENANT = "demo"
WORKERS = ("train", "eval", "embed", "maintenance", "experiments", "loop")
# One machine, a handful of routes: the loop worker passes every second (a pass that finds
# nothing due costs a few ms) and refreshes the candidate views every 5 s, so a volume trigger
# sees new feedback within seconds (the worker's defaults, 5 s and 60 s, suit a large fleet).
WORKER_ARGS = {"loop": ["--interval", "1", "--refresh", "5"]}


def say(message: str) -> None:
    """Progress output of the main job."""
    print(message, flush=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `cft run`."""
    p.add_argument("--host", help="API address (default CFT_HOST)")
    p.add_argument("--port", type=int, help="API port (default CFT_PORT)")
    p.add_argument("--engine-port", type=int, default=None, help="local engine port (API port + 1)")
    demo = p.add_mutually_exclusive_group()
    demo.add_argument("--demo", action="store_true", default=None, help="run the demo loop")
    demo.add_argument(
        "--no-demo", dest="demo", action="store_false", help="only start the services"
    )
    p.add_argument(
        "--serve",
        action="store_true",
        default=None,
        help="keep serving after the demo (default: when run from a terminal)",
    )
    p.add_argument("--users", type=int, default=None, help="demo: users in the first phase")
    p.add_argument("--quick", action="store_true", help="demo: the shortened loop CI runs")
    p.add_argument(
        "--budget", type=float, default=None, help="demo: stop sending users after SECONDS"
    )
    p.add_argument("--report-json", type=Path, help="demo: also write the report as JSON here")


def _demo_keys(settings: Settings, url: str) -> tuple[dict[str, str], bool]:
    """The demo tenant's keys (created once, kept in CFT_HOME/demo-keys.json, mode 0600)."""
    path = settings.home.resolve() / "demo-keys.json"
    with connect(url) as conn:
        tenant = conn.execute("SELECT id FROM tenant WHERE name = %s", (DEMO_TENANT,)).fetchone()
        if tenant and path.exists():
            return json.loads(path.read_text()), False
        if tenant is None:
            tenant = conn.execute(
                "INSERT INTO tenant (name, consent_training) VALUES (%s, true) RETURNING id",
                (DEMO_TENANT,),
            ).fetchone()
        assert tenant is not None
        keys = {
            role: create_key(conn, tenant_id=tenant["id"], role=role, name="demo")
            for role in ("client", "ingest", "trainer", "release", "reader", "admin")
        }
        conn.commit()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(keys, f)
    return keys, True


def _next_route(url: str) -> str:
    with connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM serve.route r JOIN tenant t ON t.id = r.tenant_id"
            " WHERE t.name = %s",
            (DEMO_TENANT,),
        ).fetchone()
    n = int(row["n"]) if row else 0
    return "support" if n == 0 else f"support-{n + 1}"


def _demo(
    args: argparse.Namespace, api_url: str, url: str, all_keys: dict[str, str], sup: Supervisor
) -> int:
    """The simulated product's users, while the loop runs; 1 if no adapter got promoted."""
    # Imported here: only `cft run --demo` loads the simulator and its openai SDK (`demo` extra).
    try:
        from app.demo.loop import DemoConfig, DemoError, Keys, run_demo
        from app.demo.report import collect, format_report
    except ImportError as exc:
        say(f"[cft] the demo needs the demo extra (pip install 'cft[demo]'): {exc}")
        return 1

    cfg = DemoConfig.quick() if args.quick else DemoConfig()
    cfg.route = _next_route(url)
    cfg.experiment = f"{cfg.route}-house-style"
    if args.users:
        cfg.users = args.users
    if args.budget:
        cfg.budget_s = args.budget
    say(f"[cft] demo: a simulated support product on route '{cfg.route}'")
    start = time.time()
    try:
        run = run_demo(
            api_url, url, Keys(all_keys["client"], all_keys["trainer"], all_keys["release"]), cfg,
            say=say,
        )  # fmt: skip
    except DemoError as exc:
        sup.check()
        say(f"[cft] demo stopped: {exc}")
        return 1
    report = collect(
        url, tenant_id=run.tenant_id, route=cfg.route, held_out_chats=run.held_out_chats
    )
    say(format_report(report, run.calls))
    say(f"[cft] demo finished in {time.time() - start:.0f} s")
    if args.report_json:
        data = {"demo": dataclasses.asdict(run), "report": report,
                "demo_seconds": time.time() - start}  # fmt: skip
        args.report_json.write_text(json.dumps(data, indent=2, default=str))
    promoted = report["cycle"] is not None and report["cycle"]["state"] == "promoted"
    return 0 if promoted else 1


def main(args: argparse.Namespace) -> int:
    """Run the platform (and the demo) until done or Ctrl-C."""
    settings = get_settings()
    home = settings.home.resolve()
    started_db = False
    if settings.embedded:
        started_db = not embedded.status(settings.pgdata).running
        say(f"[cft] starting embedded PostgreSQL 18 + pgvector under {settings.pgdata}")
    url = database_url(settings)
    migrate(url)
    say("[cft] schema migrated")

    host = args.host or settings.host
    port = args.port or settings.port
    engine_port = args.engine_port or port + 1
    api_url = f"http://{host}:{port}"
    engine_url = f"http://127.0.0.1:{engine_port}"
    env = dict(os.environ) | {
        "CFT_HOME": str(home),
        "CFT_DATABASE_URL": url,
        "CFT_ENGINE_URLS": engine_url,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    sup = Supervisor(home / "logs", env)

    def _stop(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    py = sys.executable
    rc = 0
    try:
        say("[cft] preparing the bundled base model (first run converts SmolLM2-135M, ~30 s)")
        from workers import base_model

        base_model.resolve(settings.base_model, settings.models_path)
        engine = sup.start("engine", [py, "-m", "cft.engine", "--host", "127.0.0.1",
                                      "--port", str(engine_port), "--max-loras", "4"])  # fmt: skip
        api = sup.start("api", [py, "-m", "cft.cli", "serve", "--host", host,
                                "--port", str(port), "--no-migrate"])  # fmt: skip
        for name in WORKERS:
            sup.start(name, [py, "-m", "cft.cli", "worker", name, *WORKER_ARGS.get(name, [])])
        sup.wait_http(engine, f"{engine_url}/health", timeout=300)
        say(f"[cft] engine ready: {engine_url} (vLLM-compatible, base {settings.base_model})")
        sup.wait_http(api, f"{api_url}/healthz", timeout=120)
        say(f"[cft] API + router: {api_url}   dashboard: {api_url}/dashboard")
        say(f"[cft] workers: {', '.join(WORKERS)}; logs in {home / 'logs'}")

        all_keys, fresh = _demo_keys(settings, url)
        say(f"[cft] demo tenant '{DEMO_TENANT}': reader key {all_keys['reader']}")
        say(f"[cft]                      ingest key {all_keys['ingest']}")
        demo = args.demo if args.demo is not None else fresh
        if demo:
            rc = _demo(args, api_url, url, all_keys, sup)
        serve = args.serve if args.serve is not None else sys.stdin.isatty()
        if serve:
            say(f"[cft] serving at {api_url} (dashboard {api_url}/dashboard); Ctrl-C to stop")
            while True:
                sup.check()
                time.sleep(1)
    except KeyboardInterrupt:
        say("\n[cft] stopping")
    except ServiceFailed as exc:
        say(f"[cft] a service failed: {exc}")
        rc = 1
    finally:
        sup.stop()
        if started_db:
            embedded.stop(settings.pgdata)
            say("[cft] embedded PostgreSQL stopped")
    return rc
