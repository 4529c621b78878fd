"""The engine's scheduler: a bounded waiting queue and one thread that runs the batch.

Scheduling is per decode step, as in vLLM. Before each step, waiting requests join while the
batch has room: each is prefilled alone (a batch of one, exactly as if it were served alone),
samples its first token, and its KV cache joins the running batch's (`cft/engine/batch.py`).
Then one decode step runs every row, each with its own adapter (at most `max_loras` distinct
ones) and its own sampling. A request that finishes or whose client goes away leaves at once. A
full waiting queue answers 429 with Retry-After.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from cft.engine import sampling
from cft.engine.adapters import Adapter, AdapterStore
from cft.engine.batch import Row, RunningBatch
from cft.engine.metrics import EngineMetrics
from cft.engine.model import Model
from cft.engine.output import OutputProcessor
from cft.engine.request import EngineError, GenRequest

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1


class Scheduler:
    """Iteration-level scheduling: requests join at the next decode step and leave when done."""

    def __init__(
        self,
        model: Model,
        adapters: AdapterStore,
        output: OutputProcessor,
        metrics: EngineMetrics,
        *,
        max_batch: int,
        max_waiting: int,
    ) -> None:
        self.model = model
        self.adapters = adapters
        self.output = output
        self.metrics = metrics
        self.max_batch = max_batch
        self.max_waiting = max_waiting
        self.pending: collections.deque[GenRequest] = collections.deque()
        self.cond = threading.Condition()
        self.stopping = False
        self.batch = RunningBatch()  # read and changed only under model.lock
        self.thread = threading.Thread(target=self._run, name="engine-scheduler", daemon=True)

    def start(self) -> None:
        """Start the scheduler thread."""
        self.thread.start()

    def close(self) -> None:
        """Stop the thread; requests still waiting get a 503."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout=30)
        with self.cond:
            for req in self.pending:
                req.emit("error", EngineError("The engine is shutting down.", status=503))
            self.pending.clear()

    def submit(self, req: GenRequest) -> None:
        """Queue a request, or refuse it with a 429 when the waiting queue is full."""
        with self.cond:
            limit = self.max_waiting
            if len(self.pending) >= limit:
                self.metrics.rejected.inc()
                raise EngineError(
                    f"The engine is overloaded: {len(self.pending)} requests are waiting "
                    f"(--max-waiting-queue-length {limit}). Retry after {RETRY_AFTER_S} s, "
                    "or send to another engine.",
                    status=429,
                    error_type="TooManyRequestsError",
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                )
            self.pending.append(req)
            self.metrics.waiting.set(len(self.pending))
            self.cond.notify()

    def in_use(self) -> set[str]:
        """PEFT keys of the adapters the running batch still decodes with."""
        return self.batch.keys()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.pending and not self.batch.rows and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    break
            try:
                with self.model.lock:
                    self._step()
                # Let a waiting load or unload take the lock between steps: without a yield this
                # thread takes it straight back and an adapter change waits for the whole batch.
                time.sleep(0)
            except Exception as e:  # the step fails, the engine keeps serving
                log.exception("decode step failed")
                with self.model.lock:
                    self._fail_all(EngineError(f"generation failed: {e}", status=500))
                    self.adapters.evict_retired(set())
        with self.model.lock:
            self._fail_all(EngineError("The engine is shutting down.", status=503))

    def _fail_all(self, error: EngineError) -> None:
        for row in self.batch.rows:
            if row.req.finish_reason is None:
                row.req.emit("error", error)
        self.batch.clear()
        self.metrics.running.set(0)

    def _step(self) -> None:
        import torch

        with torch.inference_mode():
            self._drop_finished()
            room = self.max_batch - len(self.batch.rows)
            if room > 0 and self.pending:
                for req, adapter in self._admit(self.in_use(), room):
                    self._join(req, adapter)
            if self.batch.rows:
                self._decode()
            self._drop_finished()
        self.adapters.evict_retired(self.in_use())

    def _admit(self, running_keys: set[str], room: int) -> list[tuple[GenRequest, Adapter | None]]:
        """Take the waiting requests that fit: at most `room`, at most max_loras adapters.

        A request whose adapter would exceed max_loras stays queued (in order) for a later step.
        """
        chosen = set(running_keys)
        taken: list[tuple[GenRequest, Adapter | None]] = []
        rest: collections.deque[GenRequest] = collections.deque()
        with self.cond:
            while self.pending:
                req = self.pending.popleft()
                if req.cancelled:
                    continue
                adapter = self.adapters.get(req.adapter) if req.adapter is not None else None
                key = adapter.key if adapter is not None else None
                fits = key is None or key in chosen or len(chosen) < self.adapters.max_loras
                if len(taken) < room and fits:
                    taken.append((req, adapter))
                    if key is not None:
                        chosen.add(key)
                else:
                    rest.append(req)
            self.pending = rest
            self.metrics.waiting.set(len(rest))
        now = time.monotonic()
        for req, _ in taken:
            req.admitted = now
            self.metrics.queue_time.observe(now - req.arrived)
        return taken

    def _resident(
        self, req: GenRequest, adapter: Adapter | None, keep: set[str]
    ) -> tuple[bool, str | None]:
        """Make the request's adapter resident; (False, None) after telling the client why not."""
        if req.adapter is None:
            return True, None
        if adapter is None or self.adapters.get(req.adapter) is not adapter:
            req.emit(
                "error",
                EngineError(
                    f"The model `{req.adapter}` does not exist.",
                    status=404,
                    error_type="NotFoundError",
                ),
            )
            return False, None
        try:
            self.adapters.make_resident(adapter, keep=keep | {adapter.key})
        except EngineError as e:
            req.emit("error", e)
            return False, None
        return True, adapter.key

    def _join(self, req: GenRequest, adapter: Adapter | None) -> None:
        """Prefill one request alone, sample its first token, add its cache to the batch."""
        import torch

        ok, key = self._resident(req, adapter, self.in_use())
        if not ok:
            return
        sampling.seed(req)
        n = len(req.prompt_ids)
        try:
            out = self.model.forward(
                [key],
                input_ids=torch.tensor([req.prompt_ids]),
                attention_mask=torch.ones(1, n, dtype=torch.long),
                position_ids=torch.arange(n).unsqueeze(0),
                use_cache=True,
                logits_to_keep=1,
            )
            tok = sampling.sample(out.logits[0, -1, :].float(), req)
        except Exception as e:  # this request fails, the batch goes on
            log.exception("prefill failed")
            req.emit("error", EngineError(f"generation failed: {e}", status=500))
            return
        self.output.advance(req, tok)
        if not req.active:
            return
        self.batch.join(Row(req=req, key=key, length=n, next_id=tok), out.cache)
        self.metrics.running.set(len(self.batch.rows))

    def _decode(self) -> None:
        """One decode step for every running row; each samples its next token."""
        rows = self.batch.rows
        self.metrics.batch_size.observe(len(rows))
        out = self.model.forward(
            [r.key for r in rows], **self.batch.decode_inputs(), use_cache=True, logits_to_keep=1
        )
        self.batch.decoded(out.cache)
        logits = out.logits[:, -1, :].float()
        for i, row in enumerate(rows):
            if not row.req.active:
                continue
            row.next_id = sampling.sample(logits[i], row.req)
            self.output.advance(row.req, row.next_id)

    def _drop_finished(self) -> None:
        if self.batch.drop_finished():
            self.metrics.running.set(len(self.batch.rows))
