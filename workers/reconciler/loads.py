"""The reconciler's loads: one thread per engine, one load at a time per engine (the engines
serialise loads themselves), asked-for adapters ahead of the rest.

A load stages the verified artefact (workers/reconciler/staging.py) and asks the engine's kind
to load it; once the engine says it holds it, the router may name it at once (the engine's
EngineState.models). What each load came to goes back to the pass's thread, which holds the
database connection and records it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from app.core import artefacts
from app.core.metrics import COLD_START_SECONDS
from app.engines.base import NOT_PINNED, Answer, Http, Outcome
from app.engines.kinds import kind_of
from app.engines.state import EngineState
from workers.reconciler.staging import Desired, Stager

# While loads run, the pass's thread wakes at least this often with nothing to record (to
# write the records that are due).
IDLE_S = 0.5


@dataclass(frozen=True)
class Loaded:
    """What one load came to."""

    engine: EngineState
    adapter: Desired
    answer: Answer | None  # None: the artefact was refused (reason, message below)
    reason: str = ""
    message: str = ""
    pinned: bool = False
    checked: bool = False  # its sha256 was checked


class Loads:
    """The engines' load threads, and per engine the loads asked for ahead of the rest."""

    def __init__(
        self,
        engines: list[EngineState],
        client: Http,
        stager: Stager,
        *,
        spent: Callable[[float], None],
        stop: threading.Event,
    ):
        self.client = client
        self.stager = stager
        self._spent = spent
        self._stop = stop
        # Per engine URL: adapters asked for, loaded first; adapters this fleet pinned.
        self.urgent: dict[str, deque[Desired]] = {e.url: deque() for e in engines}
        self.pinned: dict[str, set[str]] = {e.url: set() for e in engines}
        self._lock = threading.Lock()
        # The running run()'s events (load outcomes, engines done, nudges); None between runs.
        self._events: queue.SimpleQueue[Loaded | str | None] | None = None
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, len(engines)), thread_name_prefix="cft-reconciler-load"
        )

    def ask_first(self, engine: EngineState, adapter: Desired) -> None:
        """Load this adapter into this engine before anything else it has to load."""
        with self._lock:
            urgent = self.urgent[engine.url]
            if all(a.id != adapter.id for a in urgent):
                urgent.append(adapter)

    def nudge(self) -> None:
        """New asks came: the running run() (if any) takes them now."""
        events = self._events
        if events is not None:
            events.put(None)

    def run(
        self,
        engines: list[EngineState],
        todo: dict[str, deque[Desired]],
        pins: dict[str, set[str]],
        *,
        record: Callable[[Loaded], None],
        between: Callable[[], None],
    ) -> None:
        """Run each engine's loads (its asked-for ones, then `todo`, pinning `pins`) in its
        thread until all are done; `record` each outcome as it comes, and call `between` on
        each nudge() (new asks) and at least every IDLE_S, all in this thread."""
        by_url = {e.url: e for e in engines}
        events: queue.SimpleQueue[Loaded | str | None] = queue.SimpleQueue()
        running: dict[str, Future[None]] = {}

        def start(url: str) -> None:
            mine = todo.setdefault(url, deque())
            running[url] = self._pool.submit(
                self._drain, by_url[url], mine, pins.get(url, set()), events
            )

        self._events = events
        try:
            with self._lock:
                first = {u for u, q in self.urgent.items() if q and u in by_url}
            for url in set(todo) | first:
                if by_url[url].up:
                    start(url)
            while running:
                try:
                    event = events.get(timeout=IDLE_S)
                except queue.Empty:
                    event = None
                if isinstance(event, Loaded):
                    record(event)
                elif isinstance(event, str):  # that engine's thread is done
                    running.pop(event).result()
                else:
                    between()
                with self._lock:
                    waiting = [u for u, q in self.urgent.items() if q and u in by_url]
                for url in waiting:
                    if url not in running and by_url[url].up and not self._stop.is_set():
                        start(url)
        finally:
            self._events = None
        while True:  # a nudge that came after the last look
            try:
                event = events.get_nowait()
            except queue.Empty:
                break
            if isinstance(event, Loaded):
                record(event)

    def _drain(
        self,
        engine: EngineState,
        todo: deque[Desired],
        pinned: set[str],
        events: queue.SimpleQueue[Loaded | str | None],
    ) -> None:
        """One engine's loads, one at a time, asked-for ones first (its thread); its URL goes
        to `events` when it is done."""
        began = time.thread_time()
        try:
            while engine.up and not self._stop.is_set():
                with self._lock:
                    urgent = self.urgent[engine.url]
                    adapter = urgent.popleft() if urgent else (todo.popleft() if todo else None)
                if adapter is None:
                    break
                if engine.has(adapter.id):
                    continue
                events.put(self._load(engine, adapter, adapter.id in pinned))
        finally:
            self._spent(time.thread_time() - began)
            events.put(engine.url)

    def _load(self, engine: EngineState, adapter: Desired, pin: bool) -> Loaded:
        """Stage and load one adapter; the router may name it as soon as the engine said yes."""
        began = time.perf_counter()
        try:
            path = self.stager.source(adapter)
        except artefacts.ArtefactMismatch as exc:
            return Loaded(engine, adapter, None, "sha256", str(exc), checked=True)
        except artefacts.ArtefactError as exc:
            return Loaded(engine, adapter, None, "fetch", str(exc))
        staged = time.perf_counter()
        COLD_START_SECONDS.labels("stage").observe(staged - began)
        kind = kind_of(engine.kind)
        try:
            answer = kind.load(self.client, engine.url, adapter.id, str(path), pinned=pin)
        except httpx.HTTPError as exc:
            engine.mark_down()
            return Loaded(engine, adapter, Answer(Outcome.FAILED, f"the engine failed: {exc}"))
        pinned = pin and kind.pins and not answer.message.startswith(NOT_PINNED)
        if answer.outcome in (Outcome.DONE, Outcome.ALREADY):
            COLD_START_SECONDS.labels("load").observe(time.perf_counter() - staged)
            if engine.models is not None:
                engine.models.add(adapter.id)
            if engine.resident is not None:
                engine.resident.add(adapter.id)
            if pinned:
                self.pinned[engine.url].add(adapter.id)
        return Loaded(engine, adapter, answer, pinned=pinned, checked=True)

    def close(self) -> None:
        """Wait for the load threads to finish and stop them."""
        self._pool.shutdown(wait=True)
