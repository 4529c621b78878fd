"""Keep the engines serving serve.adapter's canary and prod adapters, each engine its share.

Desired state: every canary and prod adapter, each route's previous prod (so a rollback needs
no load), every candidate a router was called for by name lately (a fine-tuned model:
serve.adapter_demand, until its wanted_until), and any adapter asked for with want() lately
(the router's wait path). Each goes to one engine, the first of its rendezvous order among
the engines that are up and serve its base (app/engines/placement.py, the order the router
sends its calls by); a widened one (hot: workers/reconciler/traffic.py) to the next engine of
that order too. Each engine loads ahead only its share's hottest adapters, up to its
capacity: canaries, then prods by recent calls, then previous prods. The rest is loaded when a
call needs it: the router, finding no engine that lists it, asks want(adapter) and waits, and
the next load on that adapter's engine is that one. An engine evicts what it no longer has
room for by itself (vLLM's and SGLang's LRU); nothing is reloaded for that.

A load fetches the artefact into the serving directory once, verifies its sha256 against the
registry (a mismatch is never loaded; a staged copy is checked again before each load by its
files' fingerprints: workers/reconciler/staging.py) and loads it with lora_name = the adapter
id (ids are unique per version, so a name is never reused). Loads run one at a time per
engine, engines in parallel; loads come before unloads, so a promoted adapter is ready before
the old one goes. An adapter that left canary/prod is unloaded once UNLOAD_GRACE_S have
passed. Outcomes go to serve.adapter_deployment (one row per adapter and engine, written in
batches: records.py), the log and the metrics.

The engine's kind decides the calls (app/engines): vLLM and the local engine POST
/v1/load_lora_adapter, SGLang POST /load_lora_adapter (pinning its hottest prods: an evicted
SGLang adapter is not resident, not lost, and SGLang loads it again on its next call). A kind
that loads nothing ahead (LoRAX, vLLM with its filesystem resolver: `vllm-lazy`) reads an
adapter from the serving directory on its first request, so the reconciler only verifies and
stages every desired adapter there, records the deployment ('loaded' = staged and verified),
and tells the router which adapters it may name (EngineState.models / adapter_paths).

Passes run on NOTIFY cft_adapter, on want() and kick(), and every `interval` seconds
(workers/reconciler/loop.py). A pass reads serve.adapter only after a NOTIFY (or every
DESIRED_REREAD_S), and keeps each engine's deployments in memory (read once when it starts
leading), so a pass at 10,000 adapters is one probe per engine and a walk over its share
(BENCHMARKS.md, "The fleet at 10,000 routes"). It runs inside the API process (a thread,
started with the router runtime: see cft/serve.py) or standalone as `cft worker reconcile`
(workers/reconciler/cli.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

from app.core import artefacts
from app.core.config import Settings, get_settings
from app.core.db import Connection
from app.core.metrics import (
    COLD_STARTS,
    ENGINE_LORA_ADAPTERS,
    RECONCILER_CPU,
    RECONCILER_ERRORS,
    ROUTER_ACTIVE_ADAPTERS,
)
from app.engines.base import Outcome
from app.engines.kinds import kind_of
from app.engines.placement import Candidate, Placement, Share
from app.engines.state import EngineState
from workers.reconciler import records
from workers.reconciler.http import LeanClient
from workers.reconciler.loads import Loaded, Loads
from workers.reconciler.loop import CHANNEL, WANT_CHANNEL, WIDEN_PREFIX, PassLoop
from workers.reconciler.probe import Prober
from workers.reconciler.records import Deployments
from workers.reconciler.staging import Desired, Stager
from workers.reconciler.traffic import WIDEN_ASK_EVERY_S, Traffic

__all__ = ["CHANNEL", "LEADER_LOCK", "PassReport", "Reconciler", "in_router"]

log = logging.getLogger("cft.reconciler")

# A refused artefact (sha256 mismatch, fetch failure) is retried after this many seconds.
RETRY_FAILED_AFTER = 60.0
# One reconciler per fleet loads and unloads: the one whose kept connection holds this session
# advisory lock (the others, in other API replicas, only read what the engines serve, and take
# over at their next pass once the leader's connection is gone).
LEADER_LOCK = 0x63667401
# An adapter that left canary/prod is unloaded once it has been out this long: a router whose
# route cache has not applied the change yet (NOTIFY's lag, another API replica) still finds it
# loaded, rather than a 404 for a call it routed a moment before.
UNLOAD_GRACE_S = 3.0
# An adapter asked for with want() stays desired this long after the last ask.
WANT_KEEP_S = 600.0
# serve.adapter is read again after a NOTIFY (a NOTIFY is lost only with the connection, and a
# new connection reads it again), and at least this often.
DESIRED_REREAD_S = 600.0
# Calls alone (no change of the adapters or the engines up) place the adapters again at most
# this often: the hot set's order is for what is loaded ahead, and a
# called adapter is loaded by its call anyway.
RESHARE_ON_CALLS_S = 60.0
# While a pass stages many adapters for engines that load on first use, what it staged is made
# nameable (and new asks taken first) this often.
PUBLISH_EVERY_S = 0.2


@dataclass
class PassReport:
    """What one pass did (for tests, logs and the CLI)."""

    loaded: list[tuple[str, str]] = field(default_factory=list)
    unloaded: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str, str]] = field(default_factory=list)
    engines_down: list[str] = field(default_factory=list)


class Reconciler(PassLoop):
    """Desired state from serve.adapter, actual state from each engine's own list."""

    def __init__(
        self,
        db_url: str,
        engines: list[EngineState],
        *,
        serving_dir: Path,
        settings: Settings | None = None,
        interval: float = 5.0,
    ):
        super().__init__(db_url, interval=interval)
        self.engines = engines
        self.serving_dir = serving_dir
        self.settings = settings or get_settings()
        self.client = LeanClient(connect_timeout=10.0, read_timeout=300.0)
        self.stager = Stager(serving_dir, self.settings)
        self.placement = Placement(engines)
        self.loads = Loads(engines, self.client, self.stager, spent=self._spent, stop=self._stop)
        self.prober = Prober(self.client, self.settings, pinned=self.loads.pinned)
        self._failed_at: dict[tuple[str, str], float] = {}  # (adapter, engine)
        self.passes = 0
        # True while the kept connection holds LEADER_LOCK.
        self.leader = False
        # Adapters within UNLOAD_GRACE_S of leaving canary/prod (read when something changed).
        self._leaving: set[str] = set()
        self._desired: dict[str, Desired] | None = None
        self._reread_at = 0.0
        # Per engine URL, the adapters recorded loaded there (read once per leadership; set
        # operations over them keep an idle pass cheap).
        self.deployments = Deployments()
        # The last placement and what it was computed from (recomputed only when that changed).
        self._shares: dict[str, Share] = {}
        self._shares_key: tuple[object, ...] = ()
        self._shares_at = 0.0
        # want(): adapter -> when last asked; the asks not yet taken by a pass.
        self._wants_lock = threading.Lock()
        self._wanted: dict[str, float] = {}
        self._asked: set[str] = set()
        self._wants_pruned_at = 0.0
        # Rows of asked-for adapters that are not desired (a candidate), while kept.
        self._extra: dict[str, Desired] = {}
        # The router's calls and 429s per adapter: the hot set's order, the widened adapters;
        # the widenings passed to the leader, and when (another reconciler does that).
        self.traffic = Traffic(self.settings.engine_widen_rate)
        self._widen_asked: dict[str, float] = {}
        self.cpu_seconds = 0.0  # CPU time of passes and loads (cft_reconciler_cpu_seconds_total)
        self._cpu_lock = threading.Lock()
        self.last: PassReport | None = None
        self.ready = threading.Event()

    # -- what the router asks -------------------------------------------------------------

    def want(self, adapter_id: str) -> None:
        """Load this adapter now, ahead of every other load, into the engine that should hold
        it (the first of its rendezvous order that is up and serves its base); it stays
        desired for WANT_KEEP_S after the last ask, whatever its status (a candidate too), as
        long as it has a verified artefact and is not retired, failed or tainted. Returns at
        once: the load lands in EngineState.models (the router waits for it there)."""
        self.asked(adapter_id)
        self.loads.nudge()  # loads running: the pass's thread takes it between them
        self._wake()

    @property
    def widened(self) -> frozenset[str]:
        """The adapters held by the first two engines of their rendezvous order, whose calls
        the router spreads over both (workers/reconciler/traffic.py)."""
        return self.traffic.widened

    def asked(self, adapter_id: str) -> None:
        """Note an ask (this process's router, or another's through NOTIFY: `+id` asks to
        widen the adapter)."""
        if adapter_id.startswith(WIDEN_PREFIX):
            self.traffic.ask(adapter_id[len(WIDEN_PREFIX) :])
            return
        with self._wants_lock:
            self._wanted[adapter_id] = time.monotonic()
            self._asked.add(adapter_id)

    def pending(self) -> bool:
        """Asks not served yet."""
        return bool(self._asked)

    def between_passes(self, conn: Connection) -> None:
        """Serve the asks that came since the last pass: the leader loads each into its engine
        (nothing else: no whole pass), and has a pass stage at once what an engine that loads
        on first use lacks; another reconciler passes them to the leader."""
        with self._wants_lock:
            asked, self._asked = self._asked, set()
        if not asked:
            if self.leader:
                self.deployments.flush(conn, due_only=True)
            return
        began = time.thread_time()
        try:
            if not self.leader:
                for adapter_id in asked:
                    conn.execute("SELECT pg_notify(%s, %s)", (WANT_CHANNEL, adapter_id))
                return
            if self._desired is None or self.deployments.loaded is None:
                with self._wants_lock:  # no pass yet: the first one serves them, first
                    self._asked |= asked
                self._kick.set()
                return
            up = {e.url for e in self.engines if e.up and e.models is not None}
            loading, staging = self._by_kind(up)
            unstaged = {a for a in asked if not any(e.has(a) for e in staging)}
            if staging and unstaged:  # staged by a pass now, these first
                with self._wants_lock:
                    self._asked |= unstaged
                self._kick.set()
            for adapter in self._asked_rows(conn, asked, self._desired).values():
                self._route_want(adapter, up)
            pins = {url: share.pinned for url, share in self._shares.items()}
            self._load_now(conn, loading, {}, pins, up, self._desired, PassReport())
            self.deployments.flush(conn, due_only=True)
        finally:
            self._spent(time.thread_time() - began)

    def opened(self) -> None:
        """A new kept connection holds no lock: lead again only once it takes it."""
        self.leader = False

    def next_wait(self) -> float:
        """Adapters kept through their unload grace: a pass once it is over."""
        return min(self.interval, UNLOAD_GRACE_S) if self._leaving else self.interval

    def work_in(self) -> float | None:
        """Records not written yet: between_passes() writes them once due."""
        return self.deployments.flush_in() if self.leader else None

    # -- one pass -------------------------------------------------------------------------

    def run_once(self) -> PassReport:
        """Reconcile every engine once."""
        report = PassReport()
        began = time.thread_time()
        try:
            conn = self._connection()
            self._notified(conn)  # a NOTIFY not taken yet (a pass run by hand)
            self._lead(conn)
            desired = self._read_desired(conn)
            wanted, asked = self._take_wanted(conn, desired)
            up = {e.url for e in self.engines if self._probe(e, report)}
            called = self.traffic.take(self.engines)
            if self.leader:
                self._reconcile(conn, desired, wanted, asked, up, called, report)
                self.deployments.flush(conn)
            else:
                self._pass_widenings(conn)
                for engine in self.engines:
                    if engine.url in up:
                        self._follow(conn, engine, desired)
        except psycopg.Error as exc:
            self._close_connection()  # the next pass (or the loop) opens another
            RECONCILER_ERRORS.labels("db").inc()
            log.warning("reconciler cannot read serve.adapter: %s", exc)
        self._spent(time.thread_time() - began)
        self.passes += 1
        self.last = report
        self.ready.set()
        return report

    def _spent(self, seconds: float) -> None:
        with self._cpu_lock:
            self.cpu_seconds += seconds
        RECONCILER_CPU.inc(seconds)

    def _pass_widenings(self, conn: Connection) -> None:
        """Another reconciler leads: ask it to widen what this router's calls made hot (again
        every WIDEN_ASK_EVERY_S while it stays hot)."""
        now = time.monotonic()
        widened = self.traffic.widened
        self._widen_asked = {a: t for a, t in self._widen_asked.items() if a in widened}
        for adapter_id in widened:
            if now - self._widen_asked.get(adapter_id, -WIDEN_ASK_EVERY_S) >= WIDEN_ASK_EVERY_S:
                self._widen_asked[adapter_id] = now
                payload = WIDEN_PREFIX + adapter_id
                conn.execute("SELECT pg_notify(%s, %s)", (WANT_CHANNEL, payload))

    def _lead(self, conn: Connection) -> None:
        if self.leader:
            return
        row = conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (LEADER_LOCK,)).fetchone()
        self.leader = bool(row and row["ok"])
        if self.leader:
            # Read afresh: another leader may have changed them.
            self.deployments.forget()
            self._dirty = True
            log.info("reconciler leads the fleet (loads and unloads for every engine)")

    def _read_desired(self, conn: Connection) -> dict[str, Desired]:
        """serve.adapter's serving adapters, read again after a NOTIFY, when a called-by-name
        adapter's demand ends, or after DESIRED_REREAD_S."""
        now = time.monotonic()
        if self._desired is not None and not self._dirty and now < self._reread_at:
            if self._leaving:
                self._leaving = records.recently_left(conn, UNLOAD_GRACE_S)
            return self._desired
        self._dirty = False
        self._desired = records.desired(conn)
        if self._extra:  # asked-for adapters still loadable (not retired meanwhile)
            self._extra = records.loadable(conn, self._extra, self._desired)
            self._extra = {i: a for i, a in self._extra.items() if i not in self._desired}
        ends = records.next_demand_end(conn)
        self._reread_at = now + min(DESIRED_REREAD_S, DESIRED_REREAD_S if ends is None else ends)
        self._leaving = records.recently_left(conn, UNLOAD_GRACE_S)
        return self._desired

    def _take_wanted(
        self, conn: Connection, desired: dict[str, Desired]
    ) -> tuple[dict[str, Desired], set[str]]:
        """The adapters asked for within WANT_KEEP_S that are not desired anyway, as loadable
        rows (read once); and the asks since the last look."""
        now = time.monotonic()
        with self._wants_lock:
            if now - self._wants_pruned_at >= WANT_KEEP_S / 10:
                self._wants_pruned_at = now
                for adapter_id, at in list(self._wanted.items()):
                    if now - at > WANT_KEEP_S:
                        del self._wanted[adapter_id]
                        self._extra.pop(adapter_id, None)
            asked, self._asked = self._asked, set()
        self._asked_rows(conn, asked, desired)
        return {i: a for i, a in self._extra.items() if i not in desired}, asked

    def _asked_rows(
        self, conn: Connection, asked: Iterable[str], desired: dict[str, Desired]
    ) -> dict[str, Desired]:
        """Loadable rows of asked-for adapters; those not desired are kept in _extra (so no
        pass unloads them while they are kept)."""
        rows = records.loadable(conn, [i for i in asked if i not in self._extra], desired)
        self._extra |= {i: a for i, a in rows.items() if i not in desired}
        return rows | {i: self._extra[i] for i in asked if i in self._extra}

    # -- engines --------------------------------------------------------------------------

    def _by_kind(self, up: set[str]) -> tuple[list[EngineState], list[EngineState]]:
        """The engines up: those the reconciler loads into, those that load on first use."""
        engines = [e for e in self.engines if e.url in up]
        loading = [e for e in engines if kind_of(e.kind).loads_adapters]
        return loading, [e for e in engines if not kind_of(e.kind).loads_adapters]

    def _probe(self, engine: EngineState, report: PassReport) -> bool:
        """Probe the engine (workers/reconciler/probe.py); note it down when it does not
        answer."""
        if self.prober.probe(engine, self.deployments.loaded):
            return True
        RECONCILER_ERRORS.labels("engine_down").inc()
        report.engines_down.append(engine.url)
        return False

    def _follow(self, conn: Connection, engine: EngineState, desired: dict[str, Desired]) -> None:
        """Another reconciler leads: for a kind that loads on first use, learn what the leader
        staged and verified for it (its probe told the rest)."""
        if kind_of(engine.kind).loads_adapters:
            return
        ours = records.loaded_on(conn, engine.url)
        self._name_staged(engine, {a for a in desired if a in ours and self.stager.is_staged(a)})

    # -- leading --------------------------------------------------------------------------

    def _reconcile(
        self,
        conn: Connection,
        desired: dict[str, Desired],
        wanted: dict[str, Desired],
        asked: set[str],
        up: set[str],
        called: bool,
        report: PassReport,
    ) -> None:
        if self.deployments.loaded is None:
            loaded = self.deployments.read(conn, [e.url for e in self.engines])
            self._shares_key = ()
            for engine in self.engines:
                if not kind_of(engine.kind).loads_adapters:  # a copy gone is staged again
                    ours = loaded[engine.url]
                    loaded[engine.url] = {a for a in ours if self.stager.is_staged(a)}
                elif engine.url in up and engine.resident is not None:
                    # What was recorded loaded stays callable on SGLang (evicted at most).
                    engine.models = None
                    self.prober.observe(engine, engine.resident, loaded)
        serving = desired | wanted if wanted else desired
        loading, staging = self._by_kind(up)
        self._reconcile_staged(conn, staging, serving, asked, report)
        for engine in loading:
            self._note_listed(engine, serving)
        shares = self._place(serving, loading, called)
        jobs: dict[str, deque[Desired]] = {}
        for engine in loading:
            share = shares.get(engine.url)
            todo = deque(serving[a] for a in (share.ahead if share else []) if self._due(engine, a))
            if todo:
                jobs[engine.url] = todo
        for adapter_id in asked:
            if adapter_id in serving:
                self._route_want(serving[adapter_id], up)
        pins = {url: s.pinned for url, s in shares.items()}
        self._load_now(conn, loading, jobs, pins, up, desired, report)
        for engine in loading:
            self._unload_retired(engine, serving, report)
            self._gauges(engine, serving)

    def _place(
        self, serving: dict[str, Desired], loading: list[EngineState], called: bool
    ) -> dict[str, Share]:
        """Each loading engine's share: its home adapters, computed again only when the
        adapters or the engines up changed, or calls came and RESHARE_ON_CALLS_S passed (at the
        latest after DESIRED_REREAD_S): an idle pass places nothing; then the widened adapters
        on their second engines (cheap: a few adapters)."""
        key = (id(self._desired), len(serving), tuple(e.url for e in loading))
        now = time.monotonic()
        since = now - self._shares_at
        up = {e.url for e in loading}
        if (
            key != self._shares_key
            or (called and since >= RESHARE_ON_CALLS_S)
            or since >= DESIRED_REREAD_S
        ):
            self._shares = self.placement.shares(
                (Candidate(a.id, a.base_model, a.rank) for a in serving.values()),
                up,
                self.traffic.calls,
            )
            self._shares_key, self._shares_at = key, now
        widened = [serving[a] for a in self.traffic.widened if a in serving]
        if not widened:
            return self._shares
        return self.placement.widen(
            self._shares,
            (Candidate(a.id, a.base_model, a.rank) for a in widened),
            up,
            self.traffic.calls,
        )

    def _load_now(
        self,
        conn: Connection,
        loading: list[EngineState],
        jobs: dict[str, deque[Desired]],
        pins: dict[str, set[str]],
        up: set[str],
        desired: dict[str, Desired],
        report: PassReport,
    ) -> None:
        """Run the engines' loads (the asked-for ones first, also those asked for meanwhile),
        recording each outcome here."""

        def between() -> None:  # asked for while the loads run: next on their engine
            with self._wants_lock:
                asked, self._asked = self._asked, set()
            if asked:
                for adapter in self._asked_rows(conn, asked, desired).values():
                    self._route_want(adapter, up)
            self.deployments.flush(conn, due_only=True)

        self.loads.run(
            loading,
            jobs,
            pins,
            record=lambda done: self._apply(done, report),
            between=between,
        )

    def _due(self, engine: EngineState, adapter_id: str) -> bool:
        """Whether to load the adapter into the engine now: the engine does not list it and it
        did not fail there lately."""
        if engine.has(adapter_id):
            return False
        failed = self._failed_at.get((adapter_id, engine.url))
        return failed is None or time.monotonic() - failed >= RETRY_FAILED_AFTER

    def _route_want(self, adapter: Desired, up: set[str]) -> None:
        """Queue an asked-for adapter first on its engine (unless an up engine serving its base
        already lists it)."""
        engines = [e for e in self.engines if e.url in up and e.serves_base(adapter.base_model)]
        if any(e.has(adapter.id) for e in engines):
            return
        loading = {e.url for e in engines if kind_of(e.kind).loads_adapters}
        home = self.placement.home(adapter.id, adapter.base_model, loading)
        if home is not None and self._due(home, adapter.id):
            self.loads.ask_first(home, adapter)

    def _note_listed(self, engine: EngineState, serving: dict[str, Desired]) -> None:
        """Record what the engine lists as loaded, and as gone what it lost (restarted): what it
        lists of the serving adapters, and each recorded loaded adapter no longer callable."""
        loaded = self.deployments.on(engine.url)
        models = engine.models or set()
        for adapter_id in (engine.resident or set()) - loaded:
            if adapter_id in serving:
                self.deployments.record(adapter_id, engine.url, "loaded", None)
        for adapter_id in loaded - models:
            if adapter_id in serving:
                log.warning(
                    "engine %s no longer holds adapter %s (restarted?): it is loaded again"
                    " ahead or on its next call",
                    engine.url,
                    adapter_id,
                )
            gone = "the engine no longer lists it"
            self.deployments.record(adapter_id, engine.url, "unloaded", gone)

    # -- loads ----------------------------------------------------------------------------

    def _apply(self, done: Loaded, report: PassReport) -> None:
        """Record one load's outcome (the pass's thread)."""
        engine, adapter, answer = done.engine, done.adapter, done.answer
        key = (adapter.id, engine.url)
        if answer is None:
            self._refuse(engine, adapter, report, done.reason, done.message, done.checked)
            return
        if answer.outcome not in (Outcome.DONE, Outcome.ALREADY):
            if answer.outcome is Outcome.FAILED and not engine.up:
                RECONCILER_ERRORS.labels("load").inc()
                log.warning("loading %s into %s failed: %s", adapter.id, engine.url, answer.message)
                return  # the engine is down: tried again when it is back
            # Metric reasons: load (refused or failed), no_path, no_api.
            failed = answer.outcome in (Outcome.REFUSED, Outcome.FAILED)
            reason = "load" if failed else answer.outcome.value
            self._refuse(engine, adapter, report, reason, answer.message, True)
            return
        COLD_STARTS.labels(engine.url).inc()
        self._failed_at.pop(key, None)
        self.deployments.record(adapter.id, engine.url, "loaded", None, checked=True)
        report.loaded.append(key)
        log.info(
            "loaded adapter %s into %s%s",
            adapter.id,
            engine.url,
            " (pinned)" if done.pinned else "",
        )

    def _refuse(
        self,
        engine: EngineState,
        adapter: Desired,
        rep: PassReport,
        reason: str,
        message: str,
        checked: bool,
    ) -> None:
        RECONCILER_ERRORS.labels(reason).inc()
        self._failed_at[adapter.id, engine.url] = time.monotonic()
        self.deployments.record(
            adapter.id, engine.url, "failed", message, checked=checked and reason == "sha256"
        )
        rep.failed.append((adapter.id, engine.url, message))
        log.error("adapter %s not loaded into %s (%s): %s", adapter.id, engine.url, reason, message)

    # -- unloads, staging, records --------------------------------------------------------

    def _unload_retired(
        self, engine: EngineState, serving: dict[str, Desired], rep: PassReport
    ) -> None:
        """Unload what this fleet loaded into the engine that it serves no longer."""
        retired = self.deployments.on(engine.url) - serving.keys() - self._leaving
        for adapter_id in retired:
            if not self._unload(engine, adapter_id):
                continue  # tried again next pass
            engine.forget(adapter_id)
            self.loads.pinned[engine.url].discard(adapter_id)
            self.deployments.record(adapter_id, engine.url, "unloaded", None)
            rep.unloaded.append((adapter_id, engine.url))

    def _unload(self, engine: EngineState, adapter_id: str) -> bool:
        try:
            answer = kind_of(engine.kind).unload(self.client, engine.url, adapter_id)
        except httpx.HTTPError as exc:
            RECONCILER_ERRORS.labels("unload").inc()
            log.warning("unloading %s from %s failed: %s", adapter_id, engine.url, exc)
            return False
        if answer.outcome not in (Outcome.DONE, Outcome.ALREADY):
            RECONCILER_ERRORS.labels("unload").inc()
            log.warning("unloading %s from %s: %s", adapter_id, engine.url, answer.message)
            return False
        log.info("unloaded adapter %s from %s", adapter_id, engine.url)
        return True

    def _reconcile_staged(
        self,
        conn: Connection,
        engines: list[EngineState],
        serving: dict[str, Desired],
        asked: set[str],
        rep: PassReport,
    ) -> None:
        """Engines that load on first use (LoRAX, vllm-lazy) read the one serving directory:
        stage each verified artefact there once for all of them, the adapters asked for first,
        and let the router name each as soon as it is staged (a cold fleet stages thousands:
        what is done is published every PUBLISH_EVERY_S, and an ask that comes meanwhile is
        staged next). No engine call but the probe (and, vllm-lazy, the unload of a retired
        adapter it took on a call)."""
        if not engines:
            return
        missing = {e.url: serving.keys() - self.deployments.on(e.url) for e in engines}
        todo = set().union(*missing.values())
        queue = deque(sorted(todo, key=lambda a: a not in asked))
        now = published = time.monotonic()
        staged = 0
        fresh: list[str] = []
        while queue:
            if time.monotonic() - published >= PUBLISH_EVERY_S:
                self._publish_staged(engines, serving, fresh)
                fresh = []
                self.deployments.flush(conn, due_only=True)
                with self._wants_lock:
                    urgent = [a for a in self._asked if a in todo]
                queue.extendleft(urgent)  # staged next; their later places are skipped
                published = time.monotonic()
            adapter_id = queue.popleft()
            if adapter_id not in todo:
                continue
            todo.discard(adapter_id)
            adapter = serving[adapter_id]
            lacking = [e for e in engines if adapter_id in missing[e.url]]
            failed = self._failed_at.get((adapter_id, lacking[0].url))
            if failed is not None and now - failed < RETRY_FAILED_AFTER:
                continue
            try:
                self.stager.prepare(adapter)
            except artefacts.ArtefactError as exc:
                mismatch = isinstance(exc, artefacts.ArtefactMismatch)
                for engine in lacking:
                    reason = "sha256" if mismatch else "fetch"
                    self._refuse(engine, adapter, rep, reason, str(exc), mismatch)
                continue
            staged += 1
            fresh.append(adapter_id)
            for engine in lacking:
                self._failed_at.pop((adapter_id, engine.url), None)
                self.deployments.record(adapter_id, engine.url, "loaded", None, checked=True)
                rep.loaded.append((adapter_id, engine.url))
        if staged:
            log.info(
                "staged %d adapters for %d engines (loaded on first use)", staged, len(engines)
            )
        for engine in engines:
            kind = kind_of(engine.kind)
            for adapter_id in self.deployments.on(engine.url) - serving.keys() - self._leaving:
                # An engine that took it on a call keeps it until told (vLLM's resolver).
                if kind.unloads_staged and not self._unload(engine, adapter_id):
                    continue  # tried again next pass
                self.deployments.record(adapter_id, engine.url, "unloaded", None)
                rep.unloaded.append((adapter_id, engine.url))
        self._publish_staged(engines, serving, None)

    def _publish_staged(
        self, engines: list[EngineState], serving: dict[str, Desired], fresh: list[str] | None
    ) -> None:
        """What the router may name on each engine that loads on first use: what is staged
        for it and still served. `fresh`: only these were staged since the last time (added
        in place, as the router's own forget() removes); None: made again whole when it
        changed."""
        for engine in engines:
            on = self.deployments.on(engine.url)
            if fresh is not None and engine.models is not None:
                mine = [a for a in fresh if a in on]
                engine.adapter_paths.update((a, str(self.stager.path(a))) for a in mine)
                engine.models.update(mine)
                continue
            staged = on & serving.keys()
            if staged != engine.models:
                self._name_staged(engine, staged)
            ROUTER_ACTIVE_ADAPTERS.labels(engine.url).set(len(staged))

    def _name_staged(self, engine: EngineState, staged: set[str]) -> None:
        """Make `staged` what the router may name on an engine that loads on first use, each
        with the folder it reads (a new list, swapped in whole for the router's thread)."""
        known = engine.adapter_paths
        engine.adapter_paths = {a: known.get(a) or str(self.stager.path(a)) for a in staged}
        engine.models = staged

    def _gauges(self, engine: EngineState, serving: dict[str, Desired]) -> None:
        models = engine.models or set()
        resident = engine.resident if engine.resident is not None else models
        ROUTER_ACTIVE_ADAPTERS.labels(engine.url).set(len(models & serving.keys()))
        ENGINE_LORA_ADAPTERS.labels(engine.url, "resident").set(len(resident & serving.keys()))
        ENGINE_LORA_ADAPTERS.labels(engine.url, "pinned").set(len(self.loads.pinned[engine.url]))

    def close(self) -> None:
        """Close the kept connection, the wake-up sockets, the load threads and the HTTP client
        (after the loop has stopped)."""
        super().close()
        self.loads.close()
        self.client.close()


def in_router(db_url: str, engines: list[EngineState], settings: Settings) -> Reconciler:
    """The reconciler the API process runs beside its router (an app.gateway ReconcilerFactory)."""
    return Reconciler(
        db_url,
        engines,
        serving_dir=settings.serving_path,
        settings=settings,
        interval=settings.reconcile_interval,
    )
