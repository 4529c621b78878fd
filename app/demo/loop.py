"""The demo: a simulated product and its users, while cft runs the loop by itself.

The demo plays only the product. It creates its route and its house-style eval suite, turns the
route's loop on with the demo thresholds (one `PUT /v1/routes/{route}/loop`), and from then on
only sends users: chat through the router with the official OpenAI SDK, thumbs, regenerate,
edit (`POST /v1/logs/{id}/feedback`). `cft worker loop` snapshots, trains, evaluates, opens the
canary, decides and promotes on its own. To pace its users (a full round while a canary needs
traffic, a trickle while the CPU trains) and to narrate, the demo reads `loop.cycle` over a
read-only SQL session, as a dashboard would; the report reads what happened from SQL too
(app/demo/report.py). Every HTTP path the demo calls is recorded (Client.calls), so a test can
check it drove nothing but users.

The product is the support product of app/demo/product.py by default; any object with the
interface of `SimProduct` (question pools, the chat a user sends, the hidden rule, the answer an
editing user writes, a feedback mix) can be driven the same way (bench/loop_products.py).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import openai

from app.core.db import Connection, connect
from app.demo.product import STYLE_REGEX, SupportProduct

Say = Callable[[str], None]
TERMINAL = ("promoted", "rejected", "rolled_back", "failed")
QUIET_STATES = ("triggered", "snapshot", "training", "evaluating", "canary")


class FeedbackMix(Protocol):
    """How a product's unhappy users react (app/demo/product.py `UserBehaviour`)."""

    @property
    def p_edit(self) -> float: ...  # an unhappy user edits the answer (else rates it down)
    @property
    def p_regenerate(self) -> float: ...  # of those who rate it down: press regenerate
    @property
    def p_up(self) -> float: ...  # a liked answer is rated up (else left unrated)


class SimProduct(Protocol):
    """A simulated product the demo can drive (its questions are opaque to the demo)."""

    @property
    def name(self) -> str: ...
    @property
    def mix(self) -> FeedbackMix: ...
    def split(self, seed: int = 7) -> tuple[list[Any], list[Any]]: ...  # (train, held out)
    def messages(self, q: Any) -> list[dict[str, str]]: ...  # the chat a user sends
    def follows(self, answer: str) -> bool: ...  # the hidden rule: the user likes the answer
    def wanted(self, q: Any) -> str: ...  # what a user writes when they edit an answer


# The demo's loop policy (docs/demo.md says why each value differs from the default):
# thresholds and the canary's budget sized for a demo on one machine. No method and no
# hyperparameters: the platform chooses and checks them. Everything else keeps its default.
def demo_policy(*, min_new_examples: int = 24) -> dict[str, Any]:
    """The body of the demo's one PUT /v1/routes/{route}/loop."""
    return {
        "enabled": True,
        "min_new_examples": min_new_examples,
        "canary_pct": 50,
        "canary_max_duration": 90,
        "decision_min_n": 5,
        "watch_window": 30,
        "watch_min_n": 20,
    }


@dataclass
class DemoConfig:
    """Sizes and knobs of one demo (the defaults are what `make run` uses)."""

    route: str = "support"
    experiment: str = "support-house-style"
    users: int = 48  # the first phase, talking to the base model
    round_users: int = 40  # users per round while a canary collects traffic
    # Users per round while the platform trains and evaluates: none by default. On 2 cores the
    # engine and the trainer share the CPU: a 12-token call took 9-17 s next to a training run
    # and kept the engine busy ~60 % of the time, at the trainer's expense (BENCHMARKS "Loop").
    quiet_users: int = 0
    quiet_pause_s: float = 10.0
    held_out_users: int = 30  # new users asking held-out questions after the promotion
    max_tokens: int = 12
    temperature: float = 0.7
    concurrency: int = 8
    seed: int = 1
    suite_cases: int = 30
    # The route's task suite on held-out questions: (check kind, expected), or None for none.
    suite: tuple[str, Any] | None = ("regex", STYLE_REGEX)
    suite_name: str = "house-style"
    budget_s: float = 1500.0  # the demo stops sending users after this long
    policy: dict[str, Any] = field(default_factory=demo_policy)

    @classmethod
    def quick(cls) -> DemoConfig:
        """The shortened demo CI runs: fewer users, steps and eval cases (same loop)."""
        return cls(
            users=32, round_users=30, held_out_users=20, suite_cases=10, budget_s=720.0,
            policy=demo_policy(min_new_examples=16),
        )  # fmt: skip


@dataclass
class Keys:
    """API keys of the demo tenant: the product's client key; trainer and release for setup."""

    client: str
    trainer: str
    release: str  # the loop's decision fields (sample floor, watch) are the release role's


class DemoError(RuntimeError):
    """The demo could not go on; the message says why."""


_REQUEST_ID = re.compile(r"^/v1/logs/[^/]+/feedback$")


class Client:
    """The product's view of cft: REST + the OpenAI SDK, recording every path it calls."""

    def __init__(self, api: str, keys: Keys):
        self.api = api.rstrip("/")
        self.keys = keys
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        hooks = {"request": [self._record]}
        self.http = httpx.Client(base_url=self.api, timeout=120, event_hooks=hooks)
        self.openai = openai.OpenAI(
            base_url=self.api + "/v1", api_key=keys.client, max_retries=2, timeout=300,
            http_client=openai.DefaultHttpxClient(event_hooks={"request": [self._record]}),
        )  # fmt: skip

    def _record(self, request: Any) -> None:  # an httpx request (the SDK's httpx2 one too)
        path = _REQUEST_ID.sub("/v1/logs/{request_id}/feedback", request.url.path)
        with self._lock:
            self.calls[f"{request.method} {path}"] += 1

    def call(self, role: str, method: str, path: str, **kw: Any) -> Any:
        """One REST call with the key of role; raises DemoError with cft's message."""
        key = getattr(self.keys, role)
        resp = self.http.request(method, path, headers={"Authorization": f"Bearer {key}"}, **kw)
        if resp.status_code >= 400:
            try:
                message = resp.json()["error"]["message"]
            except Exception:
                message = resp.text[:300]
            raise DemoError(f"{method} {path} -> {resp.status_code}: {message}")
        return resp.json() if resp.content else None


class Traffic:
    """Simulated users talking to the route and giving feedback.

    `accepted[kind][adapter]` counts, per phase and per adapter that served it (X-Cft-Adapter),
    users' first answers and how many of them followed the product's rule: [followed, answers].
    """

    def __init__(self, c: Client, cfg: DemoConfig, say: Say, product: SimProduct | None = None):
        self.c, self.cfg, self.say = c, cfg, say
        self.product: SimProduct = product or SupportProduct()
        self.behaviour = self.product.mix
        self.accepted: dict[str, dict[str, list[int]]] = {}
        self._lock = threading.Lock()

    def _chat(self, user: str, q: Any, kind: str = "") -> tuple[str, str]:
        raw = self.c.openai.chat.completions.with_raw_response.create(
            model=self.cfg.route,
            messages=self.product.messages(q),  # type: ignore[arg-type]
            max_tokens=self.cfg.max_tokens,
            temperature=self.cfg.temperature,
            user=user,
        )
        text = raw.parse().choices[0].message.content or ""
        if kind:
            adapter = raw.headers.get("x-cft-adapter", "?")
            with self._lock:
                tally = self.accepted.setdefault(kind, {}).setdefault(adapter, [0, 0])
                tally[0] += self.product.follows(text)
                tally[1] += 1
        return raw.headers["x-request-id"], text

    def _feedback(self, rid: str, body: dict[str, Any]) -> None:
        self.c.call("client", "POST", f"/v1/logs/{rid}/feedback", json=body)

    def one_user(self, user: str, q: Any, rng: random.Random, kind: str = "") -> bool:
        """A user asks once and reacts (thumbs up; or edit; or thumbs down, maybe regenerate)."""
        p, mix = self.product, self.behaviour
        rid, text = self._chat(user, q, kind)
        if p.follows(text):
            if mix.p_up >= 1.0 or rng.random() < mix.p_up:
                self._feedback(rid, {"thumbs": 1})
            return True
        if rng.random() < mix.p_edit:
            self._feedback(rid, {"edited_completion": p.wanted(q)})
            return False
        self._feedback(rid, {"thumbs": -1})
        if rng.random() < mix.p_regenerate:
            rid2, text2 = self._chat(user, q)
            self._feedback(rid, {"regenerated": True, "regenerated_by": rid2})
            self._feedback(rid2, {"thumbs": 1 if p.follows(text2) else -1})
        return False

    def probe(self, users: list[tuple[str, Any]], kind: str, concurrency: int) -> int:
        """Users ask once and give no feedback (a measurement: nothing the loop can learn
        from); returns how many answers followed the rule (tallied in `accepted[kind]`)."""
        pool = ThreadPoolExecutor(concurrency)
        try:
            texts = pool.map(lambda u: self._chat(u[0], u[1], kind)[1], users)
            return sum(self.product.follows(t) for t in texts)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def run(self, users: list[tuple[str, Any]], seed: int, concurrency: int, kind: str = "") -> int:
        """Let users talk concurrently (the engine batches them); returns how many liked it."""

        def work(i: int) -> bool:
            user, q = users[i]
            return self.one_user(user, q, random.Random(seed * 100_003 + i), kind)

        pool = ThreadPoolExecutor(concurrency)
        try:
            return sum(pool.map(work, range(len(users))))
        finally:
            # On Ctrl-C, users not yet started are dropped at once; calls in flight finish on
            # their own (their threads are not waited for, so shutdown is not held up).
            pool.shutdown(wait=False, cancel_futures=True)


class CycleView:
    """The route's newest loop cycle, read over a read-only SQL session (never written)."""

    def __init__(self, db_url: str, tenant_id: int, route: str):
        self.tenant_id = tenant_id
        self.route = route
        self.conn: Connection = connect(db_url, autocommit=True)
        self.conn.execute("SET default_transaction_read_only = on")

    def current(self) -> dict[str, Any] | None:
        """The newest cycle's state and what it waits for, or None before the first."""
        return self.conn.execute(
            "SELECT id, state, waiting_for, adapter_id, method, error, decision_reason"
            " FROM loop.cycle WHERE tenant_id = %s AND route = %s ORDER BY id DESC LIMIT 1",
            (self.tenant_id, self.route),
        ).fetchone()

    def volume_line(self) -> str:
        """The volume trigger's line ("waiting: 14 of 24 usable edits ...")."""
        row = self.conn.execute(
            "SELECT line FROM loop.triggers(%s, %s) WHERE trigger = 'volume'",
            (self.tenant_id, self.route),
        ).fetchone()
        return str(row["line"]) if row else "?"

    def close(self) -> None:
        """Close the session."""
        self.conn.close()


def _setup(c: Client, cfg: DemoConfig, p: SimProduct, held_qs: list[Any], say: Say) -> int:
    """The product's setup: its route, its eval suite (if any), the loop turned on; returns the
    route's tenant."""
    try:
        made = c.call(
            "trainer", "POST", "/v1/routes", json={"name": cfg.route, "experiment": cfg.experiment}
        )
        say(f"  route {cfg.route} created (serving the bare base model)")
    except DemoError as exc:
        if "-> 409" not in str(exc):
            raise
        say(f"  route {cfg.route} exists: resuming")
        made = c.call("trainer", "GET", f"/v1/routes/{cfg.route}")
    if cfg.suite is not None:
        kind, expected = cfg.suite
        cases = [
            {"messages": p.messages(q), "check": kind, "expected": expected,
             "max_tokens": cfg.max_tokens}
            for q in held_qs[: cfg.suite_cases]
        ]  # fmt: skip
        suite = {"id": f"{cfg.route}-{cfg.suite_name}", "name": cfg.suite_name,
                 "route": cfg.route, "cases": cases}  # fmt: skip
        shown = f"/{expected}/" if kind == "regex" else f"{kind} {expected}"
        try:
            c.call("trainer", "POST", "/v1/eval-suites", json=suite)
            say(f"  eval suite {cfg.suite_name}: {len(cases)} held-out questions, check {shown}")
        except DemoError as exc:
            if "-> 409" not in str(exc):
                raise
    else:
        say("  no eval suite: the loop checks candidates on its snapshots' held-out answers")
    c.call("release", "PUT", f"/v1/routes/{cfg.route}/loop", json=cfg.policy)
    say(f"  loop enabled: PUT /v1/routes/{cfg.route}/loop {cfg.policy}")
    say("  from here on the demo only sends users; the platform runs the loop")
    return int(made["tenant_id"])


@dataclass
class DemoRun:
    """What the demo itself saw (the report adds what SQL says happened)."""

    route: str
    started_at: float
    tenant_id: int = 0  # the route's tenant (a route's name is unique within its tenant only)
    phases: dict[str, float] = field(default_factory=dict)
    users: dict[str, int] = field(default_factory=dict)
    liked: dict[str, int] = field(default_factory=dict)
    held_out_prompts: list[str] = field(default_factory=list)  # the questions' last turn
    held_out_chats: list[str] = field(default_factory=list)  # the whole chats, as JSON
    # Per phase, per adapter that served it: users' first answers that followed the rule, and
    # all of them ([followed, answers]; Traffic.accepted).
    accepted: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    final_state: str | None = None
    stopped: str | None = None


PHASE_TITLES = {
    "observe": "observe: users talk to the base model and give feedback",
    "quiet": "the platform works: it snapshots, trains and evaluates (users wait: 2 cores)",
    "canary": "canary: users keep coming; the loop splits them and decides",
    "held_out": "after the promotion: new users ask held-out questions",
}


def run_demo(
    api: str,
    db_url: str,
    keys: Keys,
    cfg: DemoConfig,
    say: Say = print,
    product: SimProduct | None = None,
    *,
    before: Callable[[Traffic, list[Any]], None] | None = None,
) -> DemoRun:
    """Set up, enable the loop, then send users phase by phase until the cycle ends.

    product: the support product by default. before(traffic, held-out questions): called after
    the setup and before the first user (a benchmark measures the base there)."""
    p: SimProduct = product or SupportProduct()
    c = Client(api, keys)
    traffic = Traffic(c, cfg, say, p)
    train_qs, held_qs = p.split()
    run = DemoRun(route=cfg.route, started_at=time.time())
    run.held_out_prompts = [p.messages(q)[-1]["content"] for q in held_qs]
    run.held_out_chats = [json.dumps(p.messages(q)) for q in held_qs]
    deadline = run.started_at + cfg.budget_s
    suite = f"{cfg.suite_name} eval suite" if cfg.suite is not None else "no eval suite"
    say(f"\n== setup: route, {suite}, the loop on")
    run.tenant_id = _setup(c, cfg, p, held_qs, say)
    view = CycleView(db_url, run.tenant_id, cfg.route)
    if before is not None:
        before(traffic, held_qs)

    phase, phase_at, seen, n_train, n_held, rnd = "", time.time(), (None, None), 0, 0, 0
    try:
        while True:
            cyc = view.current() if phase else None
            state = cyc["state"] if cyc else None
            if cyc and (state, cyc["waiting_for"]) != seen:
                seen = (state, cyc["waiting_for"])
                say(f"  [loop] cycle {cyc['id']}: {state}"
                    + (f" — {cyc['waiting_for']}" if cyc["waiting_for"] else ""))  # fmt: skip
            if state in ("rejected", "rolled_back", "failed"):
                break
            if state == "promoted" and n_held >= cfg.held_out_users:
                break
            if time.time() > deadline:
                run.stopped = f"time budget of {cfg.budget_s:.0f} s ran out in state {state}"
                say(f"  {run.stopped}")
                break
            kind = ("observe" if cyc is None else "quiet" if state in QUIET_STATES
                    else "canary" if state == "deciding" else "held_out")  # fmt: skip
            if kind != phase:
                if phase:
                    run.phases[phase] = run.phases.get(phase, 0) + time.time() - phase_at
                phase, phase_at = kind, time.time()
                say(f"\n== {PHASE_TITLES[kind]}")
            rnd += 1
            if kind == "quiet" and cfg.quiet_users == 0:
                time.sleep(1.0)  # wait, and narrate state changes
                continue
            if kind == "held_out":
                n = cfg.held_out_users if n_held == 0 else cfg.round_users // 2
                users = [(f"held-{n_held + i:04d}", held_qs[(n_held + i) % len(held_qs)])
                         for i in range(n)]  # fmt: skip
                n_held += n
            else:
                n = {"observe": cfg.users if n_train == 0 else 10, "quiet": cfg.quiet_users,
                     "canary": cfg.round_users}[kind]  # fmt: skip
                users = [(f"user-{n_train + i:04d}", train_qs[(n_train + i) % len(train_qs)])
                         for i in range(n)]  # fmt: skip
                n_train += n
            liked = traffic.run(
                users, cfg.seed + rnd, cfg.concurrency if kind != "quiet" else cfg.quiet_users,
                kind,
            )  # fmt: skip
            run.users[kind] = run.users.get(kind, 0) + len(users)
            run.liked[kind] = run.liked.get(kind, 0) + liked
            if kind != "quiet":
                say(f"  {len(users)} users served, {liked} liked their answer")
            if kind == "observe" and view.current() is None:
                say(f"  [loop] {view.volume_line()}")
            elif kind == "quiet":
                time.sleep(cfg.quiet_pause_s)
        if phase:
            run.phases[phase] = run.phases.get(phase, 0) + time.time() - phase_at
        final = view.current()
        run.final_state = final["state"] if final else None
    finally:
        view.close()
        run.calls = dict(sorted(c.calls.items()))
        run.accepted = traffic.accepted
    return run
