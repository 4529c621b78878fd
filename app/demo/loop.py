"""The demo loop: a simulated product drives cft end to end through its public APIs.

Every step goes through what a real customer would use: the OpenAI client through the router,
`POST /v1/logs/{id}/feedback`, and the REST API for routes, snapshots, training runs, adapters
and experiments. Nothing here touches the database directly.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from app.demo.product import STYLE_REGEX, Question, UserBehaviour, follows_style, questions

Say = Callable[[str], None]


@dataclass
class LoopConfig:
    """Sizes and knobs of one loop (the defaults are what `make run` uses)."""

    route: str = "support"
    experiment: str = "support-house-style"
    users: int = 48
    canary_users_per_round: int = 40
    canary_rounds: int = 6
    canary_pct: float = 20.0
    max_tokens: int = 12
    temperature: float = 0.7
    concurrency: int = 8
    sft_hyperparameters: dict[str, Any] = field(
        default_factory=lambda: {
            "learning_rate": 2e-3, "max_steps": 14, "batch_size": 8, "grad_accum": 1,
            "max_length": 128, "warmup": 0.0, "lr_scheduler": "constant",
        }
    )  # fmt: skip
    preference_method: str | None = "dpo"
    preference_hyperparameters: dict[str, Any] = field(
        default_factory=lambda: {
            "learning_rate": 1e-3, "max_steps": 8, "batch_size": 4, "grad_accum": 1,
            "max_length": 128, "warmup": 0.0, "lr_scheduler": "constant", "beta": 0.1,
        }
    )  # fmt: skip
    alpha: float = 0.05
    min_arm_n: int = 15  # users per arm before a significant difference counts
    # Let the evaluator finish the SFT adapter before the next run trains: on a CPU-only machine
    # a training run next to the evaluator's generations oversubscribes the cores and both crawl.
    one_heavy_job_at_a_time: bool = True
    seed: int = 1
    suite_cases: int = 30

    @classmethod
    def quick(cls) -> LoopConfig:
        """A shortened loop for CI: fewer users, steps and eval cases (same phases)."""
        cfg = cls(users=32, canary_users_per_round=30, canary_rounds=6, suite_cases=10)
        cfg.min_arm_n = 8
        cfg.sft_hyperparameters |= {"max_steps": 12}
        cfg.preference_hyperparameters |= {"max_steps": 3, "batch_size": 2}
        return cfg


@dataclass
class Keys:
    """API keys of the demo tenant, one per role the loop plays."""

    client: str
    trainer: str
    release: str
    reader: str


@dataclass
class Report:
    """What the loop measured (printed at the end, and returned to bench/loop.py)."""

    phases: dict[str, float] = field(default_factory=dict)
    calls: int = 0
    feedback: int = 0
    base_style_rate: float | None = None
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    evals: dict[str, dict[str, float]] = field(default_factory=dict)
    canary: str | None = None
    arms: list[dict[str, Any]] = field(default_factory=list)
    comparison: dict[str, Any] | None = None
    promoted: str | None = None
    serving_after: str | None = None
    first_feedback_at: float | None = None
    live_at: float | None = None

    @property
    def feedback_to_live_s(self) -> float | None:
        """Seconds from the first feedback to the new adapter serving all traffic."""
        if self.first_feedback_at is None or self.live_at is None:
            return None
        return self.live_at - self.first_feedback_at


class LoopError(RuntimeError):
    """A phase could not complete; the message says which and why."""


class Client:
    """The product's view of cft: HTTP + the OpenAI client."""

    def __init__(self, api: str, keys: Keys):
        self.api = api.rstrip("/")
        self.keys = keys
        self.http = httpx.Client(base_url=self.api, timeout=120)
        self.openai = openai.OpenAI(
            base_url=self.api + "/v1", api_key=keys.client, max_retries=2, timeout=300
        )

    def call(self, role: str, method: str, path: str, **kw: Any) -> Any:
        """One REST call with the key of role; raises LoopError with cft's message."""
        key = getattr(self.keys, role)
        resp = self.http.request(method, path, headers={"Authorization": f"Bearer {key}"}, **kw)
        if resp.status_code >= 400:
            try:
                message = resp.json()["error"]["message"]
            except Exception:
                message = resp.text[:300]
            raise LoopError(f"{method} {path} -> {resp.status_code}: {message}")
        return resp.json() if resp.content else None


def _chat(c: Client, cfg: LoopConfig, user: str, q: Question) -> tuple[str, str, str]:
    raw = c.openai.chat.completions.with_raw_response.create(
        model=cfg.route,
        messages=q.messages,  # type: ignore[arg-type]
        max_tokens=cfg.max_tokens,
        temperature=cfg.temperature,
        user=user,
    )
    resp = raw.parse()
    text = resp.choices[0].message.content or ""
    return raw.headers["x-request-id"], raw.headers.get("x-cft-adapter", ""), text


class Traffic:
    """Simulated users talking to the route and giving feedback."""

    def __init__(self, c: Client, cfg: LoopConfig, report: Report, say: Say):
        self.c, self.cfg, self.report, self.say = c, cfg, report, say
        self.behaviour = UserBehaviour()
        self._lock = threading.Lock()

    def _feedback(self, rid: str, body: dict[str, Any]) -> None:
        self.c.call("client", "POST", f"/v1/logs/{rid}/feedback", json=body)
        with self._lock:
            self.report.feedback += 1
            if self.report.first_feedback_at is None:
                self.report.first_feedback_at = time.time()

    def one_user(self, user: str, q: Question, rng: random.Random) -> tuple[str, bool]:
        """A user asks once, rates, maybe regenerates or edits; returns (adapter, liked)."""
        rid, adapter, text = _chat(self.c, self.cfg, user, q)
        liked = follows_style(text)
        with self._lock:
            self.report.calls += 1
        self._feedback(rid, {"thumbs": 1 if liked else -1})
        if liked:
            return adapter, True
        if rng.random() < self.behaviour.p_regenerate:
            rid2, _, text2 = _chat(self.c, self.cfg, user, q)
            with self._lock:
                self.report.calls += 1
            self._feedback(rid, {"regenerated": True, "regenerated_by": rid2})
            self._feedback(rid2, {"thumbs": 1 if follows_style(text2) else -1})
        if rng.random() < self.behaviour.p_edit:
            self._feedback(rid, {"edited_completion": q.wanted_answer()})
        return adapter, False

    def run(self, users: list[tuple[str, Question]], seed: int) -> list[tuple[str, bool]]:
        """Let users talk concurrently (the engine batches them); returns their outcomes."""
        done = 0
        results: list[tuple[str, bool]] = []

        def work(i: int) -> tuple[str, bool]:
            user, q = users[i]
            return self.one_user(user, q, random.Random(seed * 100_003 + i))

        pool = ThreadPoolExecutor(self.cfg.concurrency)
        try:
            for outcome in pool.map(work, range(len(users))):
                results.append(outcome)
                done += 1
                if done % 10 == 0 or done == len(users):
                    liked = sum(1 for _, ok in results if ok)
                    self.say(f"  {done}/{len(users)} users served, {liked} liked their answer")
        finally:
            # On Ctrl-C, users not yet started are dropped at once; calls in flight finish on
            # their own (their threads are not waited for, so shutdown is not held up).
            pool.shutdown(wait=False, cancel_futures=True)
        return results


def _phase(report: Report, name: str, say: Say) -> Callable[[], None]:
    start = time.time()
    say(f"\n== {name}")

    def end() -> None:
        report.phases[name] = time.time() - start
        say(f"   ({report.phases[name]:.0f} s)")

    return end


def _train(
    c: Client, cfg: LoopConfig, report: Report, method: str, hp: dict[str, Any], say: Say
) -> str:
    snap = c.call(
        "trainer", "POST", "/v1/datasets/snapshots", json={"route": cfg.route, "method": method}
    )
    report.datasets[method] = {
        "id": snap["id"],
        "counts": snap["counts"],
        "n_train": snap["n_train"],
        "n_eval": snap["n_eval"],
    }
    say(
        f"  snapshot {method}: {snap['n_train']} train / {snap['n_eval']} eval examples;"
        f" steps: {snap['counts']}"
    )
    if snap["n_train"] == 0:
        raise LoopError(f"the {method} snapshot is empty: not enough feedback of that kind yet")
    run = c.call(
        "trainer",
        "POST",
        "/v1/training-runs",
        json={
            "route": cfg.route,
            "method": method,
            "snapshot_id": snap["id"],
            "hyperparameters": hp,
        },
    )
    say(
        f"  training run {run['id']} queued"
        f" ({method}, QLoRA r={run['hyperparameters'].get('rank')})"
    )
    last = None
    while True:
        run = c.call("trainer", "GET", f"/v1/training-runs/{run['id']}")
        prog = run.get("progress") or {}
        line = (run["status"], prog.get("step"), prog.get("loss"))
        if line != last and run["status"] == "running" and prog.get("step") is not None:
            loss = prog.get("loss")
            say(
                f"  step {prog.get('step')}/{prog.get('total_steps', prog.get('total', '?'))}"
                + (f" loss {loss:.3f}" if isinstance(loss, int | float) else "")
                + (
                    f" eta {prog['eta_s']:.0f}s"
                    if isinstance(prog.get("eta_s"), int | float)
                    else ""
                )
            )
            last = line
        if run["status"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(1.0)
    report.runs[method] = run
    if run["status"] != "succeeded":
        raise LoopError(f"training run {run['id']} {run['status']}: {run.get('error')}")
    say(f"  adapter {run['adapter_id']} registered as candidate")
    return str(run["adapter_id"])


def _flatten(scores: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for suite, metrics in (scores or {}).items():
        if isinstance(metrics, dict):
            for metric, value in metrics.items():
                if isinstance(value, int | float) and metric not in ("n", "passed"):
                    out[f"{suite}/{metric}"] = float(value)
    return out


def _wait_evals(
    c: Client, adapter_id: str, say: Say, timeout: float = 900
) -> tuple[dict[str, float], dict[str, float]]:
    """The adapter's eval scores and the base's, once the evaluator has finished."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        a = c.call("reader", "GET", f"/v1/adapters/{adapter_id}")
        summary = a.get("eval_summary") or {}
        if summary.get("evaluator") and a.get("eval_results"):
            scores = {
                f"{r['suite_id']}/{r['metric']}": float(r["score"]) for r in a["eval_results"]
            }
            return scores, _flatten((summary.get("results") or {}).get("base"))
        time.sleep(1.0)
    raise LoopError(
        f"no eval results for {adapter_id} after {timeout:.0f} s (is the evaluator running?)"
    )


def _pass_rate(scores: dict[str, float]) -> float:
    rates = [v for k, v in scores.items() if k.endswith("pass_rate")]
    return max(rates) if rates else float("nan")


def run_loop(api: str, keys: Keys, cfg: LoopConfig | None = None, say: Say = print) -> Report:
    """Run the whole loop; returns the report (raises LoopError naming the failed phase)."""
    cfg = cfg or LoopConfig()
    c = Client(api, keys)
    report = Report()
    traffic = Traffic(c, cfg, report, say)
    train_qs, held_qs = questions()

    end = _phase(report, "setup: route and house-style eval suite", say)
    try:
        c.call(
            "trainer", "POST", "/v1/routes", json={"name": cfg.route, "experiment": cfg.experiment}
        )
        say(f"  route {cfg.route} created (serving the bare base model)")
    except LoopError as exc:
        if "-> 409" not in str(exc):
            raise
        say(f"  route {cfg.route} exists: resuming")
    suite = {
        "id": f"{cfg.route}-house-style",
        "name": "house-style",
        "route": cfg.route,
        "cases": [
            {
                "messages": q.messages,
                "check": "regex",
                "expected": STYLE_REGEX,
                "max_tokens": cfg.max_tokens,
            }
            for q in held_qs[: cfg.suite_cases]
        ],
    }
    try:
        c.call("trainer", "POST", "/v1/eval-suites", json=suite)
        say(
            f"  eval suite house-style: {len(suite['cases'])} held-out questions,"
            f" check /{STYLE_REGEX}/"
        )
    except LoopError as exc:
        if "-> 409" not in str(exc):
            raise
    end()

    end = _phase(report, "observe: users talk to the base model and give feedback", say)
    users = [(f"user-{i:04d}", train_qs[i % len(train_qs)]) for i in range(cfg.users)]
    outcomes = traffic.run(users, cfg.seed)
    report.base_style_rate = sum(ok for _, ok in outcomes) / max(len(outcomes), 1)
    say(
        f"  {report.calls} calls logged, {report.feedback} feedback events;"
        f" house style followed by the base: {report.base_style_rate:.0%}"
    )
    end()

    end = _phase(report, "train: SFT on the edits", say)
    candidates = [_train(c, cfg, report, "sft", cfg.sft_hyperparameters, say)]
    end()
    if cfg.preference_method:
        end = _phase(report, f"train: {cfg.preference_method.upper()} on the preference pairs", say)
        if cfg.one_heavy_job_at_a_time:
            say(f"  the evaluator scores {candidates[0]} first (one CPU-heavy job at a time)")
            _wait_evals(c, candidates[0], say)
        try:
            candidates.append(
                _train(c, cfg, report, cfg.preference_method, cfg.preference_hyperparameters, say)
            )
        except LoopError as exc:
            say(f"  skipped: {exc}")
        end()

    end = _phase(report, "evaluate: held-out and house-style suites (evaluator worker)", say)
    for adapter_id in candidates:
        report.evals[adapter_id], base_scores = _wait_evals(c, adapter_id, say)
        if base_scores:
            report.evals.setdefault("base", {}).update(base_scores)
        say(
            f"  {adapter_id}: "
            + ", ".join(f"{k}={v:.3f}" for k, v in sorted(report.evals[adapter_id].items()))
        )
    if report.evals.get("base"):
        say("  base: " + ", ".join(f"{k}={v:.3f}" for k, v in sorted(report.evals["base"].items())))
    best = max(candidates, key=lambda a: _pass_rate(report.evals[a]))
    end()

    end = _phase(report, f"canary: {best} at {cfg.canary_pct:g} % of users", say)
    c.call(
        "release",
        "POST",
        f"/v1/adapters/{best}/canary",
        json={"traffic_pct": cfg.canary_pct, "reason": "demo: best house-style pass rate"},
    )
    report.canary = best
    say("  canary started; users are split by a sticky hash of (experiment, user)")
    winner = None
    for rnd in range(cfg.canary_rounds):
        base = 1000 + rnd * cfg.canary_users_per_round
        qs = train_qs + held_qs
        users = [
            (f"user-{base + i:04d}", qs[(base + i) % len(qs)])
            for i in range(cfg.canary_users_per_round)
        ]
        traffic.run(users, cfg.seed + rnd + 1)
        m = c.call(
            "reader",
            "GET",
            f"/v1/experiments/{cfg.experiment}/metrics",
            params={"window": "1d", "alpha": cfg.alpha},
        )
        report.arms = m["arms"]
        comps = [
            x
            for x in m["comparisons"]
            if x["canary_adapter"] == best and "thumbs_up" in x["metric"]
        ]
        for arm in m["arms"]:
            rate = arm.get("thumbs_up_rate")
            say(
                f"  variant {arm['variant']} {arm['adapter_id']}: n={arm['n']} thumbs-up "
                + (
                    f"{rate:.0%} [{arm['thumbs_up_ci_low']:.0%}, {arm['thumbs_up_ci_high']:.0%}]"
                    if rate is not None
                    else "n/a"
                )
            )
        if comps:
            report.comparison = comps[0]
            cmp = comps[0]
            say(
                f"  canary - prod = {cmp['diff']:+.2f}, p = {cmp['p_value']:.2g}"
                f" ({'significant' if cmp['significant'] else 'not significant yet'})"
            )
            enough = min(cmp["n_canary"] or 0, cmp["n_control"] or 0) >= cfg.min_arm_n
            if cmp["significant"] and cmp["canary_better"] and enough:
                winner = best
                break
            if not enough:
                say(f"  waiting for at least {cfg.min_arm_n} users per arm")
    end()
    if winner is None:
        raise LoopError("the canary did not beat prod with significance; nothing promoted")

    end = _phase(report, "promote through the gate", say)
    c.call(
        "release",
        "POST",
        f"/v1/adapters/{winner}/promote",
        json={"reason": "demo: canary won with significance"},
    )
    deadline = time.time() + 60
    while time.time() < deadline:
        _, adapter, _ = _chat(c, cfg, "user-after-promotion", train_qs[0])
        if adapter == winner:
            report.live_at = time.time()
            break
        time.sleep(0.2)
    report.promoted = winner
    report.serving_after = adapter
    say(f"  prod of {cfg.route} is now {winner}; a new user is served by {adapter}")
    end()
    return report


def format_report(report: Report) -> str:
    """The final report as text."""
    lines = ["", "== report"]
    for name, seconds in report.phases.items():
        lines.append(f"  {seconds:7.1f} s  {name}")
    lines.append(f"  calls logged: {report.calls}, feedback events: {report.feedback}")
    for method, d in report.datasets.items():
        lines.append(
            f"  dataset {method}: {d['n_train']} train / {d['n_eval']} eval; {d['counts']}"
        )
    for method, run in report.runs.items():
        prog = run.get("progress") or {}
        curve = prog.get("loss_history") or prog.get("losses")
        lines.append(
            f"  training {method}: {run['status']}, adapter {run.get('adapter_id')}"
            + (
                f", loss curve {[round(x, 3) for x in curve]}"
                if curve
                else (
                    f", final loss {prog.get('loss'):.3f}"
                    if isinstance(prog.get("loss"), int | float)
                    else ""
                )
            )
        )
    for adapter_id, scores in report.evals.items():
        lines.append(
            f"  eval {adapter_id}: " + ", ".join(f"{k}={v:.3f}" for k, v in sorted(scores.items()))
        )
    if report.base_style_rate is not None:
        lines.append(f"  house style followed by the base (live): {report.base_style_rate:.0%}")
    for arm in report.arms:
        rate = arm.get("thumbs_up_rate")
        if rate is not None:
            lines.append(
                f"  live thumbs-up {arm['variant']} {arm['adapter_id']}: {rate:.0%}"
                f" [{arm['thumbs_up_ci_low']:.0%}, {arm['thumbs_up_ci_high']:.0%}] (n={arm['n']})"
            )
    if report.comparison:
        cmp = report.comparison
        lines.append(
            f"  canary vs prod: {cmp['diff']:+.2f}"
            f" [{cmp['diff_ci_low']:+.2f}, {cmp['diff_ci_high']:+.2f}], p={cmp['p_value']:.2g}"
        )
    if report.promoted:
        lines.append(f"  promoted: {report.promoted}; serving now: {report.serving_after}")
    if report.feedback_to_live_s is not None:
        lines.append(f"  feedback-to-live: {report.feedback_to_live_s:.0f} s")
    return "\n".join(lines)
