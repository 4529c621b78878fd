"""Keep every engine's loaded adapters equal to serve.adapter's canary and prod adapters (and
the candidates a router was called for by name: serve.adapter_demand).

One pass, per engine: read its /v1/models; for each desired adapter it lacks (new, or lost in
an engine restart), fetch the artefact into the serving directory, verify its sha256 against
the registry (a mismatch is never loaded), and load it with lora_name = the adapter id (ids
are unique per version, so a name is never reused); then unload the adapters
this reconciler loaded that are no longer canary or prod (each route's previous prod stays
loaded, so a rollback needs no load). Loads come before unloads, so a promoted adapter is
ready before the old one goes. Outcomes go to serve.adapter_deployment (one row per adapter
and engine), the log and the metrics.

The engine's kind decides the calls (app/engines): vLLM and the local engine POST
/v1/load_lora_adapter, SGLang POST /load_lora_adapter. A kind that loads nothing ahead (LoRAX,
vLLM with its filesystem resolver: `vllm-lazy`) reads an adapter from the serving directory on
its first request, so the reconciler only verifies and stages the files there, records the
deployment ('loaded' = staged and verified), and tells the router which adapters it may name
(EngineState.models / adapter_paths). Every staged copy names its base as the engines serve
it (adapter_config.json's base_model_name_or_path = serve.adapter.base_model), which vLLM's
resolver requires.

Passes run on NOTIFY cft_adapter, when the gateway asks (an engine said 404), and every
`interval` seconds. Between passes the thread blocks in select() on its one kept connection
(which both LISTENs and runs the passes) and a wake-up socket for kick() and stop(): idle, it
costs nothing (a 0.1 s poll and a connection per pass cost the API process 10-14 ms of CPU per
second; BENCHMARKS.md, "Router against LiteLLM"). It runs inside the API process (a thread,
started with the router runtime: see cft/serve.py) or standalone as `cft worker reconcile`
(workers/reconciler/cli.py).
"""

from __future__ import annotations

import contextlib
import logging
import select
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
from psycopg.rows import dict_row

from app.core import artefacts
from app.core.config import Settings, get_settings
from app.core.db import Connection
from app.core.metrics import (
    COLD_START_SECONDS,
    COLD_STARTS,
    ENGINE_LORA_ADAPTERS,
    RECONCILER_ERRORS,
    ROUTER_ACTIVE_ADAPTERS,
)
from app.engines.base import Outcome
from app.engines.kinds import kind_of
from app.engines.lora_metrics import vllm_lora_state
from app.engines.state import EngineState, model_ids
from app.engines.vllm import CONFIG_FILE, stage_config

log = logging.getLogger("cft.reconciler")

# serve.adapter's change trigger (sql/serve/adapter_audit.sql) notifies here on every change of
# an adapter; the router's route cache has a channel of its own (app/gateway/table.py).
CHANNEL = "cft_adapter"

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


@dataclass(frozen=True)
class Desired:
    """An adapter that should be loaded on every engine."""

    id: str
    route: str
    base_model: str
    weights_uri: str
    sha256: str


@dataclass
class PassReport:
    """What one pass did (for tests, logs and the CLI)."""

    loaded: list[tuple[str, str]] = field(default_factory=list)
    unloaded: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str, str]] = field(default_factory=list)
    engines_down: list[str] = field(default_factory=list)


class Reconciler:
    """Desired state from serve.adapter, actual state from each engine's /v1/models."""

    def __init__(
        self,
        db_url: str,
        engines: list[EngineState],
        *,
        serving_dir: Path,
        settings: Settings | None = None,
        interval: float = 5.0,
    ):
        self.db_url = db_url
        self.engines = engines
        self.serving_dir = serving_dir
        self.settings = settings or get_settings()
        self.interval = interval
        self.client = httpx.Client(timeout=httpx.Timeout(10.0, read=300.0))
        self._kick = threading.Event()
        self._stop = threading.Event()
        # kick() and stop() send a byte here to wake the loop out of select(). Socket objects,
        # not raw pipe fds: a kick after close() raises instead of writing to a reused fd.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        # The one kept connection: LISTENs between passes and runs them (None when lost).
        self._conn: Connection | None = None
        self._thread: threading.Thread | None = None
        self._failed_at: dict[tuple[str, str], float] = {}  # (adapter, engine)
        self.passes = 0
        # True while the kept connection holds LEADER_LOCK.
        self.leader = False
        # Adapters within UNLOAD_GRACE_S of leaving canary/prod (read each pass).
        self._leaving: set[str] = set()
        self.last: PassReport | None = None
        self.ready = threading.Event()

    # -- one pass -------------------------------------------------------------------------

    def run_once(self) -> PassReport:
        """Reconcile every engine once."""
        report = PassReport()
        try:
            conn = self._connection()
            if not self.leader:
                row = conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (LEADER_LOCK,))
                self.leader = bool(row.fetchone()["ok"])  # type: ignore[index]
                if self.leader:
                    log.info("reconciler leads the fleet (loads and unloads for every engine)")
            desired = self._desired(conn)
            self._leaving = self._recently_left(conn)
            for engine in self.engines:
                if self.leader:
                    self._reconcile_engine(conn, engine, desired, report)
                else:
                    self._follow_engine(conn, engine, desired)
        except psycopg.Error as exc:
            self._close_connection()  # the next pass (or the loop) opens another
            RECONCILER_ERRORS.labels("db").inc()
            log.warning("reconciler cannot read serve.adapter: %s", exc)
        self.passes += 1
        self.last = report
        self.ready.set()
        return report

    def _recently_left(self, conn: Connection) -> set[str]:
        """Adapters out of canary/prod for less than UNLOAD_GRACE_S (kept loaded meanwhile); a
        tainted one is not kept."""
        rows = conn.execute(
            "SELECT id FROM serve.adapter WHERE status NOT IN ('canary', 'prod')"
            " AND tainted_at IS NULL AND updated_at > now() - make_interval(secs => %s)",
            (UNLOAD_GRACE_S,),
        ).fetchall()
        return {r["id"] for r in rows}

    def _desired(self, conn: Connection) -> dict[str, Desired]:
        # The previous prod of each route stays loaded too, so a rollback is instant; so do
        # the adapters a router was called for by name (fine-tuned models) while wanted.
        rows = conn.execute(
            "SELECT id, route, base_model, weights_uri, sha256 FROM serve.adapter"
            " WHERE (status IN ('canary', 'prod') OR (tainted_at IS NULL AND id IN ("
            "  SELECT previous_prod_id FROM serve.adapter"
            "   WHERE status = 'prod' AND previous_prod_id IS NOT NULL))"
            " OR (status = 'candidate' AND tainted_at IS NULL AND id IN ("
            "  SELECT adapter_id FROM serve.adapter_demand WHERE wanted_until > now())))"
            " AND weights_uri IS NOT NULL AND sha256 IS NOT NULL"
            " ORDER BY status DESC, id"
        ).fetchall()
        return {r["id"]: Desired(**r) for r in rows}

    def _scrape(self, engine: EngineState) -> None:
        """The engine's own LoRA numbers (vLLM's /metrics), as gauges; nothing for other kinds
        or when it does not answer."""
        if not engine.kind.startswith("vllm"):
            return
        try:
            resp = self.client.get(engine.url + "/metrics", timeout=2.0)
            resp.raise_for_status()
            state = vllm_lora_state(resp.text)
        except (httpx.HTTPError, ValueError):
            return
        if state is None:
            return
        ENGINE_LORA_ADAPTERS.labels(engine.url, "running").set(len(state.running))
        ENGINE_LORA_ADAPTERS.labels(engine.url, "waiting").set(len(state.waiting))
        if state.max_loras is not None:
            ENGINE_LORA_ADAPTERS.labels(engine.url, "max").set(state.max_loras)

    def _follow_engine(
        self, conn: Connection, engine: EngineState, desired: dict[str, Desired]
    ) -> None:
        """Another reconciler leads: only learn what the engine serves (its /v1/models, or for
        a kind that loads on first use, what the leader staged and verified for it)."""
        kind = kind_of(engine.kind)
        if not kind.loads_adapters:
            ours = self._deployments(conn, engine)
            staged = {
                a for a in desired if ours.get(a) == "loaded" and (self.serving_dir / a).is_dir()
            }
            engine.adapter_paths = {a: str(self.serving_dir / a) for a in staged}
            engine.models = frozenset(staged)
            return
        try:
            resp = self.client.get(engine.url + kind.probe_path, timeout=5.0)
            resp.raise_for_status()
        except httpx.HTTPError:
            engine.mark_down()
            return
        engine.models = frozenset(model_ids(resp.json()))
        self._scrape(engine)

    def _deployments(self, conn: Connection, engine: EngineState) -> dict[str, str]:
        return {
            r["adapter_id"]: r["state"]
            for r in conn.execute(
                "SELECT adapter_id, state FROM serve.adapter_deployment WHERE engine_url = %s",
                (engine.url,),
            ).fetchall()
        }

    def _reconcile_engine(
        self, conn: Connection, engine: EngineState, desired: dict[str, Desired], rep: PassReport
    ) -> None:
        kind = kind_of(engine.kind)
        if not kind.loads_adapters:
            self._reconcile_staged(conn, engine, desired, rep)
            return
        try:
            resp = self.client.get(engine.url + kind.probe_path, timeout=5.0)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            RECONCILER_ERRORS.labels("engine_down").inc()
            log.warning("engine %s does not answer %s: %s", engine.url, kind.probe_path, exc)
            engine.mark_down()
            rep.engines_down.append(engine.url)
            return
        models = set(model_ids(resp.json()))
        engine.models = frozenset(models)
        self._scrape(engine)
        ours = self._deployments(conn, engine)
        for adapter in desired.values():
            if adapter.id in models:
                if ours.get(adapter.id) != "loaded":
                    self._record(conn, adapter.id, engine.url, "loaded", None)
                continue
            if (
                time.monotonic() - self._failed_at.get((adapter.id, engine.url), -1e9)
                < RETRY_FAILED_AFTER
            ):
                continue
            if ours.get(adapter.id) == "loaded":
                log.warning(
                    "engine %s lost adapter %s (restarted?): reloading", engine.url, adapter.id
                )
            if self._load(conn, engine, adapter, rep):
                models.add(adapter.id)
                engine.models = frozenset(models)
        for adapter_id, state in ours.items():
            if state != "loaded" or adapter_id in desired or adapter_id in self._leaving:
                continue
            if adapter_id in models and not self._unload(engine, adapter_id):
                continue
            models.discard(adapter_id)
            engine.models = frozenset(models)
            self._record(conn, adapter_id, engine.url, "unloaded", None)
            rep.unloaded.append((adapter_id, engine.url))
        ROUTER_ACTIVE_ADAPTERS.labels(engine.url).set(sum(1 for a in desired if a in models))

    def _load(
        self, conn: Connection, engine: EngineState, adapter: Desired, rep: PassReport
    ) -> bool:
        began = time.perf_counter()
        try:
            path = self._prepare(adapter)
        except artefacts.ArtefactMismatch as exc:
            return self._refuse(conn, engine, adapter, rep, "sha256", str(exc))
        except artefacts.ArtefactError as exc:
            return self._refuse(conn, engine, adapter, rep, "fetch", str(exc))
        staged = time.perf_counter()
        COLD_START_SECONDS.labels("stage").observe(staged - began)
        try:
            answer = kind_of(engine.kind).load(self.client, engine.url, adapter.id, str(path))
        except httpx.HTTPError as exc:
            RECONCILER_ERRORS.labels("load").inc()
            engine.mark_down()
            log.warning("loading %s into %s failed: %s", adapter.id, engine.url, exc)
            return False
        if answer.outcome not in (Outcome.DONE, Outcome.ALREADY):
            # Metric reasons: load (refused or failed), no_path, no_api.
            failed = answer.outcome in (Outcome.REFUSED, Outcome.FAILED)
            reason = "load" if failed else answer.outcome.value
            return self._refuse(conn, engine, adapter, rep, reason, answer.message)
        COLD_STARTS.labels(engine.url).inc()
        COLD_START_SECONDS.labels("load").observe(time.perf_counter() - staged)
        self._failed_at.pop((adapter.id, engine.url), None)
        self._record(conn, adapter.id, engine.url, "loaded", None, checked=True)
        rep.loaded.append((adapter.id, engine.url))
        log.info("loaded adapter %s into %s", adapter.id, engine.url)
        return True

    def _refuse(
        self,
        conn: Connection,
        engine: EngineState,
        adapter: Desired,
        rep: PassReport,
        reason: str,
        message: str,
    ) -> bool:
        RECONCILER_ERRORS.labels(reason).inc()
        self._failed_at[adapter.id, engine.url] = time.monotonic()
        self._record(conn, adapter.id, engine.url, "failed", message, checked=reason == "sha256")
        rep.failed.append((adapter.id, engine.url, message))
        log.error("adapter %s not loaded into %s (%s): %s", adapter.id, engine.url, reason, message)
        return False

    def _prepare(self, adapter: Desired) -> Path:
        """The verified artefact under serving_dir/<id> (fetched once, re-verified each load),
        naming its base as the engines serve it (what vLLM's filesystem resolver checks)."""
        dest = self.serving_dir / adapter.id
        if dest.is_dir():
            try:
                artefacts.verify(dest, adapter.sha256)
                _stage_config(dest, adapter)
                return dest
            except artefacts.ArtefactError:
                log.warning("serving copy of %s changed on disk: fetching it again", adapter.id)
                shutil.rmtree(dest, ignore_errors=True)
        self.serving_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.serving_dir, prefix=f".{adapter.id}-"))
        try:
            artefacts.fetch_verified(adapter.weights_uri, adapter.sha256, tmp, self.settings)
            _stage_config(tmp, adapter)
            tmp.rename(dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return dest

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
        self, conn: Connection, engine: EngineState, desired: dict[str, Desired], rep: PassReport
    ) -> None:
        """An engine that loads on first use (LoRAX): stage verified artefacts where it reads
        them; no engine call but its probe."""
        kind = kind_of(engine.kind)
        path = kind.probe_path
        try:
            self.client.get(engine.url + path, timeout=5.0).raise_for_status()
        except httpx.HTTPError as exc:
            RECONCILER_ERRORS.labels("engine_down").inc()
            log.warning("engine %s does not answer %s: %s", engine.url, path, exc)
            engine.mark_down()
            rep.engines_down.append(engine.url)
            return
        ours = self._deployments(conn, engine)
        staged: set[str] = set()
        for adapter in desired.values():
            if ours.get(adapter.id) == "loaded" and (self.serving_dir / adapter.id).is_dir():
                staged.add(adapter.id)
                continue
            if (
                time.monotonic() - self._failed_at.get((adapter.id, engine.url), -1e9)
                < RETRY_FAILED_AFTER
            ):
                continue
            try:
                self._prepare(adapter)
            except artefacts.ArtefactMismatch as exc:
                self._refuse(conn, engine, adapter, rep, "sha256", str(exc))
                continue
            except artefacts.ArtefactError as exc:
                self._refuse(conn, engine, adapter, rep, "fetch", str(exc))
                continue
            self._failed_at.pop((adapter.id, engine.url), None)
            self._record(conn, adapter.id, engine.url, "loaded", None, checked=True)
            rep.loaded.append((adapter.id, engine.url))
            staged.add(adapter.id)
            log.info("staged adapter %s for %s (loaded on first use)", adapter.id, engine.url)
        for adapter_id, state in ours.items():
            if state == "loaded" and adapter_id not in desired and adapter_id not in self._leaving:
                # An engine that took it on a call keeps it until told (vLLM's resolver).
                if kind.unloads_staged and not self._unload(engine, adapter_id):
                    continue  # tried again next pass
                self._record(conn, adapter_id, engine.url, "unloaded", None)
                rep.unloaded.append((adapter_id, engine.url))
        engine.adapter_paths = {a: str(self.serving_dir / a) for a in staged}
        engine.models = frozenset(staged)
        ROUTER_ACTIVE_ADAPTERS.labels(engine.url).set(len(staged))

    def _record(
        self,
        conn: Connection,
        adapter_id: str,
        engine_url: str,
        state: str,
        error: str | None,
        *,
        checked: bool = False,
    ) -> None:
        conn.execute(
            "INSERT INTO serve.adapter_deployment AS d"
            " (adapter_id, engine_url, state, error, sha256_checked_at)"
            " VALUES (%(a)s, %(e)s, %(s)s, %(err)s, CASE WHEN %(c)s THEN now() END)"
            " ON CONFLICT (adapter_id, engine_url) DO UPDATE SET state = excluded.state,"
            " error = excluded.error, updated_at = now(),"
            " sha256_checked_at = coalesce(excluded.sha256_checked_at, d.sha256_checked_at)",
            {"a": adapter_id, "e": engine_url, "s": state, "err": error, "c": checked},
        )

    # -- the loop -------------------------------------------------------------------------

    def _connection(self) -> Connection:
        """The kept connection, opened (and LISTENing) when there is none."""
        conn = self._conn
        if conn is None or conn.closed:
            conn = psycopg.connect(self.db_url, autocommit=True, row_factory=dict_row)
            try:
                conn.execute(f"LISTEN {CHANNEL}")
            except BaseException:
                conn.close()
                raise
            self._conn = conn
            self.leader = False  # a new session holds no lock
        return conn

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.debug("closing the reconciler's connection failed", exc_info=True)

    def _wake(self) -> None:
        # OSError: full (a wake-up is pending anyway) or closed (stopped).
        with contextlib.suppress(OSError):
            self._wake_w.send(b"k")

    def _wait(self, conn: Connection, timeout: float) -> None:
        """Block until a NOTIFY on conn, a kick()/stop(), or timeout seconds; a NOTIFY sets
        the kick. Raises psycopg.Error when the connection is lost."""
        # A NOTIFY that came in while a pass used the connection waits in psycopg's backlog,
        # not on the socket: take it first (timeout=0 also reads what the socket holds).
        for _ in conn.notifies(timeout=0):
            self._kick.set()
        if self._kick.is_set() or self._stop.is_set():
            return
        fd, wake = conn.fileno(), self._wake_r.fileno()
        ready, _, _ = select.select([fd, wake], [], [], max(0.0, timeout))
        if wake in ready:
            self._wake_r.recv(4096)
        if fd in ready:
            for _ in conn.notifies(timeout=0):
                self._kick.set()

    def kick(self) -> None:
        """Ask for a pass now (e.g. an engine answered 404 for an adapter)."""
        self._kick.set()
        self._wake()

    def start(self) -> None:
        """Run passes in a background thread until stop()."""
        self._thread = threading.Thread(target=self.run_forever, name="cft-reconciler", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Make run_forever return after the current pass."""
        self._stop.set()
        self._wake()

    def stop(self) -> None:
        """Stop the loop, then close the connection and the HTTP client."""
        self.request_stop()
        if self._thread:
            self._thread.join(timeout=10)
        self.close()

    def close(self) -> None:
        """Close the kept connection, the wake-up sockets and the HTTP client (after the loop
        has stopped)."""
        self._close_connection()
        self._wake_r.close()
        self._wake_w.close()
        self.client.close()

    def run_forever(self) -> None:
        """Pass now, then on NOTIFY cft_adapter, on kick() and every interval seconds."""
        backoff = 0.5
        due = 0.0
        while not self._stop.is_set():
            try:
                conn = self._connection()
                backoff = 0.5
                if self._kick.is_set() or time.monotonic() >= due:
                    self._kick.clear()
                    self.run_once()
                    # Adapters kept through their unload grace: a pass once it is over.
                    wait = min(self.interval, UNLOAD_GRACE_S) if self._leaving else self.interval
                    due = time.monotonic() + wait
                    continue
                self._wait(conn, due - time.monotonic())
            except psycopg.Error as exc:
                self._close_connection()
                RECONCILER_ERRORS.labels("db").inc()
                log.warning("reconciler lost its database connection (%s); retrying", exc)
                # Not listening meanwhile: anything may have changed, pass once back.
                due = 0.0
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)


def _stage_config(path: Path, adapter: Desired) -> None:
    try:
        stage_config(path, adapter.base_model)
    except (OSError, ValueError) as exc:
        raise artefacts.ArtefactError(
            f"cannot stage {adapter.id}: its {CONFIG_FILE} is unreadable ({exc})"
        ) from exc


def in_router(db_url: str, engines: list[EngineState], settings: Settings) -> Reconciler:
    """The reconciler the API process runs beside its router (an app.gateway ReconcilerFactory)."""
    return Reconciler(
        db_url,
        engines,
        serving_dir=settings.serving_path,
        settings=settings,
        interval=settings.reconcile_interval,
    )
