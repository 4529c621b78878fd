"""The whole loop, through the router, on the six simulated products of bench/products.py.

One platform for every product, started as `cft run --no-demo --serve` does (a fresh CFT_HOME
under /work/loopbench-runs/, embedded PostgreSQL, the engine with the bundled SmolLM2-135M,
the API and router, every worker including `cft worker loop`); one route per product; the
products run one after another (the trainer takes one run at a time on a small machine), each
until its cycle ends (promoted, rejected, rolled back or failed) or its time budget runs out.

Each product is driven by the demo's own machinery (app/demo/loop.py `run_demo`, `Traffic`):
its setup creates the route, its task suite when it has one (a check of its rule on held-out
questions), and sends ONE `PUT /v1/routes/{route}/loop`: `enabled`, `min_new_examples` (sized
for the simulation), the canary's budget (`canary_pct`, `canary_max_duration`) and, with the
demo tenant's release key, the demo's small decision fields (`decision_min_n` 5,
`watch_window` 30 s, `watch_min_n` 20; the defaults, 100 rows per arm and a 1 h watch, need
hours of traffic). No method and no hyperparameters: choosing and checking them is the
platform's. From then on the bench only sends users (chat through the router with the OpenAI
SDK, thumbs, edits, regenerates in the product's feedback mix) and reads `loop.cycle` to pace
them. Before the first user, a probe of new users asks the held-out questions once with no
feedback (nothing the loop could learn from): the base's held-out acceptance.

Per product it prints: the method chosen and why (loop.cycle.method_reason); every setting
tried with its held-out numbers and which was kept (loop.cycle.settings_tried); the decision
(decision, decision_code, decision_reason); feedback-to-live (the route's first feedback to the
first call the promoted adapter served as prod, app/demo/report.py); held-out acceptance, the
share of new users' first answers on held-out questions that follow the product's rule: the
base (the probe) -> the promoted adapter (users after the promotion, answers it served, by the
X-Cft-Adapter header), or "route unchanged" when nothing was promoted. The table and the JSON
are rewritten after every product.

Targets: every product whose base acceptance is below 20 % gains >= +30 points on held-out
users and questions, decided by the always-valid rule; median feedback-to-live < 300 s; a
product whose rule the model cannot learn ends with the route unchanged.

    PYTHONPATH=. .venv/bin/python bench/loop_products.py [--products bank,acme] [--quick]
        [--budget 900] [--report-json bench/results/loop_products.json]
        [--markdown bench/results/loop_products.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# bench/datasets.py would shadow the datasets package: drop bench/ from the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from app.core import embedded  # noqa: E402
from app.demo.loop import DemoConfig, DemoError, Keys, Traffic, demo_policy, run_demo  # noqa: E402
from app.demo.report import collect  # noqa: E402
from bench.products import BANK_PREFIX, PRODUCTS, TRIAGE_ALLOWED, TRIAGE_KEYS  # noqa: E402

RUNS = Path("/work/loopbench-runs")
# Edit-heavy first: the products most likely to learn within a short session.
ORDER = ["bank", "acme", "triage", "hotel", "policy", "quiz"]
# Task suites (a check of the product's rule on held-out questions), for some products only;
# the others are checked by the loop on its snapshots' held-out answers alone.
SUITES: dict[str, tuple[str, Any]] = {
    "bank": ("regex", r"^\s*" + BANK_PREFIX.replace(".", r"\.")),
    "triage": (
        "json_schema",
        {
            "type": "object",
            "properties": {k: {"enum": list(TRIAGE_ALLOWED[k])} for k in TRIAGE_KEYS},
            "required": list(TRIAGE_KEYS),
            "additionalProperties": False,
        },
    ),
    "acme": ("regex", r"— Team Acme\s*$"),
}


def say(message: str) -> None:
    print(message, flush=True)


def tagged(name: str, message: str) -> None:
    """A line of one product's progress, tagged with its name (after any blank lines)."""
    body = message.lstrip("\n")
    say("\n" * (len(message) - len(body)) + f"[{name}] {body}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Platform:
    """`cft run --no-demo --serve` in a fresh CFT_HOME: every service, no demo."""

    def __init__(self, home: Path, models: Path | None, env_extra: dict[str, str]):
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        if models and models.exists() and not (home / "models").exists():
            (home / "models").symlink_to(models)
        self.port = free_port()
        self.api = f"http://127.0.0.1:{self.port}"
        self.log = home / "cft-run.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CFT_")}
        env |= {"CFT_HOME": str(home), "CFT_PORT": str(self.port), "CFT_HOST": "127.0.0.1",
                "PYTHONPATH": str(ROOT)} | env_extra  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cft.cli", "run", "--no-demo", "--serve"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self.log.open("w"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def wait(self, timeout: float = 900) -> tuple[Keys, str]:
        """Wait for the API and the demo tenant's keys; the keys and the database URL."""
        deadline = time.time() + timeout
        keys_file = self.home / "demo-keys.json"
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cft run exited: {self.log.read_text()[-3000:]}")
            text = self.log.read_text()
            if keys_file.exists() and "ingest key" in text:
                keys = json.loads(keys_file.read_text())
                url = embedded.status(self.home / "pgdata").url
                assert url, "embedded PostgreSQL is not running"
                return Keys(keys["client"], keys["trainer"], keys["release"]), url
            time.sleep(2)
        raise RuntimeError(f"cft run not ready after {timeout:.0f} s")

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"cft run exited: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            # cft run stops its services on SIGTERM (SIGINT may be ignored in a background job)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def config(name: str, args: argparse.Namespace) -> DemoConfig:
    """The demo's sizes, the product's generation budget and suite, the bench's policy."""
    p = PRODUCTS[name]
    policy = demo_policy(min_new_examples=args.min_new_examples)
    policy["canary_max_duration"] = args.canary_max_duration
    policy["canary_max_users"] = args.canary_max_users
    cfg = DemoConfig(
        route=name, experiment=f"{name}-loop", max_tokens=p.max_tokens, budget_s=args.budget,
        suite=SUITES.get(name), suite_name="rule", policy=policy,
    )  # fmt: skip
    if args.quick:
        cfg.users, cfg.round_users, cfg.held_out_users, cfg.suite_cases = 32, 30, 20, 10
    return cfg


def rate(tally: dict[str, list[int]], adapter: str | None = None) -> dict[str, Any]:
    """[followed, answers] over every adapter (or one): the acceptance."""
    rows = [v for k, v in tally.items() if adapter is None or k == adapter]
    ok, n = sum(r[0] for r in rows), sum(r[1] for r in rows)
    return {"followed": ok, "n": n, "rate": ok / n if n else None}


def pct(r: dict[str, Any] | None) -> str:
    if not r or r.get("rate") is None:
        return "n/a"
    return f"{r['rate']:.0%} ({r['followed']}/{r['n']})"


def summarise(name: str, run: Any, report: dict[str, Any], seconds: float) -> dict[str, Any]:
    """What the table shows for one product, from the run (client side) and the report (SQL)."""
    c = report.get("cycle") or {}
    acc = run.accepted
    adapter = c.get("adapter_id")
    promoted = c.get("state") == "promoted" and report.get("prod_now") == adapter
    after = rate(acc.get("held_out", {}), adapter) if promoted else None
    base = rate(acc.get("probe", {}))
    tried = [
        {
            "hyperparameters": t.get("hyperparameters"),
            "kept": t.get("kept"),
            "adapter_id": t.get("adapter_id"),
            "compared": [
                {k: x.get(k) for k in ("suite", "metric", "reference", "candidate", "gain")}
                for x in (t.get("offline") or {}).get("compared", [])
            ],
        }
        for t in c.get("settings_tried") or []
    ]
    return {
        "product": name,
        "mix": PRODUCTS[name].mix.label,
        "rule": PRODUCTS[name].rule,
        "suite": SUITES.get(name, (None,))[0],
        "state": c.get("state"),
        "stopped": run.stopped,
        "method": c.get("method"),
        "method_reason": c.get("method_reason"),
        "settings_tried": tried,
        "decision": c.get("decision"),
        "decision_code": c.get("decision_code"),
        "decision_reason": c.get("decision_reason"),
        "error": c.get("error"),
        "feedback_to_live_s": report.get("feedback_to_live_s"),
        "acceptance_base_held_out": base,
        "acceptance_base_observe": rate(acc.get("observe", {})),
        "acceptance_promoted_held_out": after,
        "gain_points": (after["rate"] - base["rate"]) * 100
        if after and after["rate"] is not None and base["rate"] is not None
        else None,
        "route_unchanged": report.get("prod_now") is None,
        "held_out_sql": (report.get("live") or {}).get("held_out_after_promotion"),
        "users": run.users,
        "seconds": seconds,
    }


def _hp(hp: dict[str, Any] | None) -> str:
    hp = hp or {}
    steps = hp.get("max_steps") or f"{hp.get('epochs')} ep"
    return f"lr {hp.get('learning_rate')}, {steps} steps x {hp.get('batch_size')}"


def settings_lines(s: dict[str, Any]) -> list[str]:
    out = []
    for i, t in enumerate(s["settings_tried"], 1):
        nums = "; ".join(
            f"{x['suite']}/{x['metric']} {x['reference']:.3f} -> {x['candidate']:.3f}"
            for x in t["compared"]
            if x.get("reference") is not None and x.get("candidate") is not None
        )
        kept = "kept" if t["kept"] else "not kept"
        out.append(f"setting {i} ({_hp(t['hyperparameters'])}): {nums or 'no numbers'}: {kept}")
    return out


def product_text(s: dict[str, Any]) -> str:
    lines = [f"## {s['product']} ({s['mix']}; rule: {s['rule']}; suite: {s['suite'] or 'none'})"]
    lines.append(f"- cycle: {s['state']}" + (f" (bench stopped: {s['stopped']})" if s["stopped"]
                                                else "") + f", {s['seconds']:.0f} s")  # fmt: skip
    durations = (s.get("report") or {}).get("durations") or []
    if durations:
        lines.append("- time per state: " + ", ".join(
            f"{d['state']} {d['seconds']:.0f} s" for d in durations))  # fmt: skip
    lines.append(f"- method: {s['method']}: {s['method_reason']}")
    lines += [f"- {x}" for x in settings_lines(s)]
    lines.append(f"- decision: {s['decision']} ({s['decision_code']}): {s['decision_reason']}")
    if s["error"]:
        lines.append(f"- error: {s['error']}")
    ftl = s["feedback_to_live_s"]
    lines.append(f"- feedback-to-live: {f'{ftl:.0f} s' if ftl is not None else 'n/a'}")
    after = s["acceptance_promoted_held_out"]
    lines.append(
        f"- held-out acceptance: base {pct(s['acceptance_base_held_out'])} -> "
        + (f"promoted {pct(after)} ({s['gain_points']:+.0f} points)" if after
           else "route unchanged" if s["route_unchanged"] else "not promoted")
        + f"; base on the observe users' questions {pct(s['acceptance_base_observe'])}"
    )  # fmt: skip
    h = s["held_out_sql"]
    if h:
        lines.append(
            f"- held out in SQL: {h['users']} users, {h['questions']} questions after promotion;"
            f" in the training data: {h['questions_in_training']} questions,"
            f" {h['users_in_training']} users; thumbs-up of rated rows {h['thumbs_up']}/{h['n']}"
        )
    lines.append(f"- users sent per phase: {s['users']}")
    return "\n".join(lines)


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| product | feedback mix | suite | method | settings tried (kept) | decision |"
            " feedback-to-live | held-out acceptance base -> promoted |")  # fmt: skip
    out = [head, "|" + "---|" * 8]
    for s in rows:
        tried = len(s["settings_tried"])
        kept = next((i for i, t in enumerate(s["settings_tried"], 1) if t["kept"]), None)
        after = s["acceptance_promoted_held_out"]
        acc = f"{pct(s['acceptance_base_held_out'])} -> " + (
            f"{pct(after)} ({s['gain_points']:+.0f} pts)" if after
            else "route unchanged" if s["route_unchanged"] else "not promoted"
        )  # fmt: skip
        ftl = s["feedback_to_live_s"]
        decision = f"{s['state']}: {s['decision'] or '-'} ({s['decision_code'] or '-'})"
        if s["stopped"]:
            decision += " [budget ran out]"
        out.append(
            f"| {s['product']} | {s['mix']} | {s['suite'] or 'none'} | {s['method'] or '-'} |"
            f" {tried} ({kept or 'none'}) | {decision} |"
            f" {f'{ftl:.0f} s' if ftl is not None else 'n/a'} | {acc} |"
        )
    return "\n".join(out)


def targets(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    low = [s for s in rows if (s["acceptance_base_held_out"]["rate"] or 0) < 0.2]
    for s in low:
        g = s["gain_points"]
        ok = g is not None and g >= 30 and s["decision"] == "promote"
        out.append(
            f"- {s['product']}: base {pct(s['acceptance_base_held_out'])} < 20 %: gain"
            f" {f'{g:+.0f} points' if g is not None else 'none (not promoted)'}, decided by"
            f" {s['decision_code'] or '-'}: {'met' if ok else 'MISSED'}"
        )
    ftl = [s["feedback_to_live_s"] for s in rows if s["feedback_to_live_s"] is not None]
    if ftl:
        med = statistics.median(ftl)
        out.append(f"- median feedback-to-live over {len(ftl)} promoted products: {med:.0f} s"
                   f" (target < 300 s): {'met' if med < 300 else 'MISSED'}")  # fmt: skip
    else:
        out.append("- median feedback-to-live: no product was promoted")
    return out


def write(args: argparse.Namespace, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    if args.report_json:
        args.report_json.parent.mkdir(parents=True, exist_ok=True)
        args.report_json.write_text(
            json.dumps({"meta": meta, "products": rows}, indent=2, default=str)
        )
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        text = [
            "# The loop on six simulated products",
            "",
            f"`{meta['command']}` on {meta['machine']}, {meta['started']} UTC.",
            "",
            "One platform (`cft run --no-demo --serve`, environment"
            f" `{json.dumps(meta['platform_env'])}`), one route per product, products one"
            " after another. Each product's one loop PUT: " + meta["policy_note"],
            "",
            table(rows),
            "",
            "Targets:",
            "",
            *targets(rows),
            "",
            *[product_text(s) + "\n" for s in rows],
        ]
        args.markdown.write_text("\n".join(text))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--products", default=",".join(ORDER))
    parser.add_argument("--quick", action="store_true", help="fewer users per phase")
    parser.add_argument("--budget", type=float, default=900.0, help="seconds per product")
    parser.add_argument("--min-new-examples", type=int, default=16)
    parser.add_argument("--canary-max-duration", type=int, default=180)
    parser.add_argument("--canary-max-users", type=int, default=400)
    parser.add_argument("--home", type=Path, default=None, help="CFT_HOME (a fresh one)")
    parser.add_argument("--models", type=Path, default=ROOT / ".cft" / "models")
    parser.add_argument(
        "--threads", type=int, default=1,
        help="OMP/MKL threads per platform process (0: torch's default). On a shared 2-core"
        " machine one thread is ~4x faster than two: no spinning on an oversubscribed CPU",
    )  # fmt: skip
    parser.add_argument(
        "--engine-timeout", type=float, default=300.0,
        help="CFT_ENGINE_TIMEOUT: the router's wait for the engine (default 120 s)",
    )  # fmt: skip
    parser.add_argument("--report-json", type=Path, default=None)
    parser.add_argument(
        "--render", type=Path, default=None,
        help="only write --markdown again from this JSON report (no run)",
    )  # fmt: skip
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    if args.render:
        data = json.loads(args.render.read_text())
        write(argparse.Namespace(report_json=None, markdown=args.markdown), data["products"],
              data["meta"])  # fmt: skip
        say(table(data["products"]))
        return 0
    names = [n.strip() for n in args.products.split(",") if n.strip()]
    for n in names:
        if n not in PRODUCTS:
            parser.error(f"unknown product {n!r} (have {', '.join(PRODUCTS)})")
    home = args.home or RUNS / time.strftime("run-%Y%m%d-%H%M%S")
    if str(home.resolve()).startswith("/tmp/pytest-of-"):
        parser.error("keep CFT_HOME out of /tmp/pytest-of-* (pytest sessions delete it)")
    policy = config(names[0], args).policy
    env_extra = {"CFT_ENGINE_TIMEOUT": f"{args.engine_timeout:g}"}
    if args.threads:
        env_extra |= {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    meta = {
        "command": "bench/loop_products.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "home": str(home),
        "policy": policy,
        "platform_env": env_extra,
        "policy_note": f"`{json.dumps(policy)}`, with the demo tenant's release key"
        " (decision_min_n, watch_window and watch_min_n are decision fields only a release key"
        " may loosen); no method, no hyperparameters.",
    }
    say(f"[bench] products: {', '.join(names)}; CFT_HOME {home}; budget {args.budget:.0f} s each")
    say(f"[bench] each product's loop PUT (release key): {json.dumps(policy)}")
    say(f"[bench] platform environment: {env_extra}")

    def _stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    plat = Platform(home, args.models, env_extra)
    rows: list[dict[str, Any]] = []
    try:
        say("[bench] starting the platform: cft run --no-demo --serve (log: "
            f"{plat.log})")  # fmt: skip
        started = time.time()
        keys, url = plat.wait()
        say(f"[bench] platform ready in {time.time() - started:.0f} s at {plat.api}")
        for name in names:
            p = PRODUCTS[name]
            cfg = config(name, args)
            say(f"\n######## {name}: {p.domain}; rule: {p.rule}; users: {p.mix.label}")

            def probe(traffic: Traffic, held: list[Any], cfg: DemoConfig = cfg) -> None:
                users = [(f"probe-{i:04d}", held[i % len(held)])
                         for i in range(cfg.held_out_users)]  # fmt: skip
                tagged(cfg.route, f"\n== probe: {len(users)} new users ask held-out questions"
                       " of the base (no feedback)")  # fmt: skip
                ok = traffic.probe(users, "probe", cfg.concurrency)
                tagged(cfg.route, f"  base held-out acceptance: {ok}/{len(users)} follow the rule")

            t0 = time.time()
            try:
                run = run_demo(plat.api, url, keys, cfg, say=lambda m, n=name: tagged(n, m),
                               product=p, before=probe)  # fmt: skip
            except DemoError as exc:
                plat.check()
                say(f"[bench] {name} stopped: {exc}")
                rows.append({"product": name, "error": str(exc)})
                continue
            report = collect(url, tenant_id=run.tenant_id, route=cfg.route,
                             held_out_chats=run.held_out_chats)  # fmt: skip
            s = summarise(name, run, report, time.time() - t0)
            s["report"] = report
            s["run"] = {k: v for k, v in asdict(run).items()
                        if k not in ("held_out_prompts", "held_out_chats")}  # fmt: skip
            rows.append(s)
            say("\n" + product_text(s))
            write(args, [r for r in rows if "state" in r], meta)
        done = [r for r in rows if "state" in r]
        say("\n" + table(done))
        say("\n".join(["", "targets:", *targets(done)]))
        write(args, done, meta)
    except KeyboardInterrupt:
        say("[bench] interrupted")
    finally:
        say("[bench] stopping the platform")
        plat.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
