"""The engine's two schedulers, each one thread over the shared model.

`continuous` (the default) schedules per decode step, as vLLM does: a waiting request is
prefilled alone (batch of one, exactly as if it were served alone), its KV cache joins the
running batch's left-padded cache, and from the next step on it is decoded with the others; a
request that finishes leaves the batch at once (its rows are dropped from the cache, and
columns no remaining row needs are trimmed). `static` is the earlier scheduler: requests that
arrive together form one batch, and a request that arrives while it runs waits for the whole
batch. Both mix adapters in one batch through PEFT's `adapter_names`, and both bound the
waiting queue (a full queue answers 429 with Retry-After).
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workers.engine.request import EngineError, GenRequest

if TYPE_CHECKING:
    from workers.engine.core import Adapter, Engine

log = logging.getLogger(__name__)

SCHEDULERS = ("continuous", "static")
RETRY_AFTER_S = 1


class Scheduler:
    """The waiting queue and the thread; subclasses decide how requests are batched."""

    name = ""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.pending: collections.deque[GenRequest] = collections.deque()
        self.cond = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name=f"engine-{self.name}", daemon=True)

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
        metrics = self.engine.metrics
        with self.cond:
            limit = self.engine.max_waiting
            if len(self.pending) >= limit:
                metrics.rejected.inc()
                raise EngineError(
                    f"The engine is overloaded: {len(self.pending)} requests are waiting "
                    f"(--max-waiting-queue-length {limit}). Retry after {RETRY_AFTER_S} s, "
                    "or send to another engine.",
                    status=429,
                    error_type="TooManyRequestsError",
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                )
            self.pending.append(req)
            metrics.waiting.set(len(self.pending))
            self.cond.notify()

    def in_use(self) -> set[str]:
        """PEFT keys of the adapters the running batch still decodes with."""
        return set()

    def _run(self) -> None:
        raise NotImplementedError

    def _admit(self, running_keys: set[str], room: int) -> list[tuple[GenRequest, Adapter | None]]:
        """Take the waiting requests that fit: at most `room`, at most max_loras adapters.

        A request whose adapter would exceed max_loras stays queued (in order) for a later batch.
        """
        engine = self.engine
        chosen = set(running_keys)
        taken: list[tuple[GenRequest, Adapter | None]] = []
        rest: collections.deque[GenRequest] = collections.deque()
        with self.cond:
            while self.pending:
                req = self.pending.popleft()
                if req.cancelled:
                    continue
                adapter = engine.adapters.get(req.adapter) if req.adapter is not None else None
                key = adapter.key if adapter is not None else None
                fits = key is None or key in chosen or len(chosen) < engine.max_loras
                if len(taken) < room and fits:
                    taken.append((req, adapter))
                    if key is not None:
                        chosen.add(key)
                else:
                    rest.append(req)
            self.pending = rest
            engine.metrics.waiting.set(len(rest))
        now = time.monotonic()
        for req, _ in taken:
            req.admitted = now
            engine.metrics.queue_time.observe(now - req.arrived)
        return taken

    def _resident(
        self, req: GenRequest, adapter: Adapter | None, keep: set[str]
    ) -> tuple[bool, str | None]:
        """Make the request's adapter resident; (False, None) after telling the client why not."""
        if req.adapter is None:
            return True, None
        if adapter is None or self.engine.adapters.get(req.adapter) is not adapter:
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
            self.engine.make_resident(adapter, keep=keep | {adapter.key})
        except EngineError as e:
            req.emit("error", e)
            return False, None
        return True, adapter.key

    def _seed(self, req: GenRequest) -> None:
        import torch

        seed = req.sampling.seed if req.sampling.seed is not None else random.getrandbits(63)
        req.generator = torch.Generator().manual_seed(seed)


class StaticScheduler(Scheduler):
    """One batch at a time: requests that arrive within batch_wait join it, the rest wait."""

    name = "static"

    def _run(self) -> None:
        engine = self.engine
        while True:
            with self.cond:
                while not self.pending and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    return
            time.sleep(engine.batch_wait)  # let requests that arrive together share the batch
            taken = self._admit(set(), engine.max_batch)
            if not taken:
                continue
            batch: list[GenRequest] = []
            try:
                with engine.model_lock:
                    keys: list[str | None] = []
                    keep = {a.key for _, a in taken if a is not None}
                    for req, adapter in taken:
                        ok, key = self._resident(req, adapter, keep)
                        if ok:
                            batch.append(req)
                            keys.append(key)
                    if batch:
                        self._run_batch(batch, keys)
                    engine.evict_retired(set())
            except Exception as e:  # the batch fails, the engine keeps serving
                log.exception("batch failed")
                for req in batch:
                    if req.finish_reason is None:
                        req.emit("error", EngineError(f"generation failed: {e}", status=500))

    def _run_batch(self, batch: list[GenRequest], keys: list[str | None]) -> None:
        import torch

        engine = self.engine
        engine.metrics.batch_size.observe(len(batch))
        engine.metrics.running.set(len(batch))
        pad_id = engine.tokenizer.pad_token_id
        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.tensor(
            [[pad_id] * (width - len(r.prompt_ids)) + r.prompt_ids for r in batch]
        )
        mask = torch.tensor(
            [[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in batch]
        )
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        kwargs = engine.adapter_kwargs(keys)
        for r in batch:
            self._seed(r)
        steps = max(r.sampling.max_tokens for r in batch)
        past = None
        try:
            with torch.inference_mode():
                for _ in range(steps):
                    out = engine.model(
                        input_ids=input_ids,
                        attention_mask=mask,
                        position_ids=positions,
                        cache=past,
                        use_cache=True,
                        logits_to_keep=1,
                        **kwargs,
                    )
                    past = out.cache  # the cache object, updated in place
                    logits = out.logits[:, -1, :].float()
                    next_ids: list[int] = []
                    for i, r in enumerate(batch):
                        if not r.active:
                            next_ids.append(pad_id)
                            continue
                        tok = engine.sample(logits[i], r)
                        next_ids.append(tok)
                        engine.advance(r, tok)
                    if not any(r.active for r in batch):
                        break
                    input_ids = torch.tensor(next_ids).unsqueeze(1)
                    mask = torch.cat([mask, torch.ones(len(batch), 1, dtype=mask.dtype)], dim=1)
                    positions = positions[:, -1:] + 1
        finally:
            engine.metrics.running.set(0)
        for r in batch:
            if r.active:
                engine.finish(r, "length")


@dataclass
class _Row:
    """One request in the running batch: row i of the batched cache."""

    req: GenRequest
    key: str | None  # PEFT adapter key; None for the base
    length: int  # its tokens in the cache (they are the last `length` columns)
    next_id: int  # the sampled token the next step feeds


class ContinuousScheduler(Scheduler):
    """Iteration-level scheduling: requests join at the next decode step and leave when done."""

    name = "continuous"

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.rows: list[_Row] = []
        self.cache: Any = None  # a DynamicCache over self.rows, left-padded

    def in_use(self) -> set[str]:
        """PEFT keys of the adapters the running batch still decodes with."""
        return {r.key for r in self.rows if r.key is not None}

    def _run(self) -> None:
        engine = self.engine
        while True:
            with self.cond:
                while not self.pending and not self.rows and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    break
            try:
                with engine.model_lock:
                    self._step()
                # Let a waiting load or unload take the lock between steps: without a yield this
                # thread takes it straight back and an adapter change waits for the whole batch.
                time.sleep(0)
            except Exception as e:  # the step fails, the engine keeps serving
                log.exception("decode step failed")
                with engine.model_lock:
                    self._fail_all(EngineError(f"generation failed: {e}", status=500))
                    engine.evict_retired(set())
        with engine.model_lock:
            self._fail_all(EngineError("The engine is shutting down.", status=503))

    def _fail_all(self, error: EngineError) -> None:
        for row in self.rows:
            if row.req.finish_reason is None:
                row.req.emit("error", error)
        self.rows, self.cache = [], None
        self.engine.metrics.running.set(0)

    def _step(self) -> None:
        import torch

        engine = self.engine
        with torch.inference_mode():
            self._drop_finished()
            room = engine.max_batch - len(self.rows)
            if room > 0 and self.pending:
                for req, adapter in self._admit(self.in_use(), room):
                    self._join(req, adapter)
            if self.rows:
                self._decode()
            self._drop_finished()
        engine.evict_retired(self.in_use())

    def _join(self, req: GenRequest, adapter: Adapter | None) -> None:
        """Prefill one request alone, sample its first token, add its cache to the batch."""
        import torch

        engine = self.engine
        ok, key = self._resident(req, adapter, self.in_use())
        if not ok:
            return
        self._seed(req)
        n = len(req.prompt_ids)
        try:
            out = engine.model(
                input_ids=torch.tensor([req.prompt_ids]),
                attention_mask=torch.ones(1, n, dtype=torch.long),
                position_ids=torch.arange(n).unsqueeze(0),
                use_cache=True,
                logits_to_keep=1,
                **engine.adapter_kwargs([key]),
            )
            tok = engine.sample(out.logits[0, -1, :].float(), req)
        except Exception as e:  # this request fails, the batch goes on
            log.exception("prefill failed")
            req.emit("error", EngineError(f"generation failed: {e}", status=500))
            return
        engine.advance(req, tok)
        if not req.active:
            return
        self._merge(out.cache, n)
        self.rows.append(_Row(req=req, key=key, length=n, next_id=tok))
        engine.metrics.running.set(len(self.rows))

    def _merge(self, cache: Any, n: int) -> None:
        """Append a one-row cache of n tokens to the batch cache, left-padding the shorter."""
        import torch
        import torch.nn.functional as F

        if self.cache is None:
            self.cache = cache
            return

        def pad(t: Any, left: int) -> Any:
            return F.pad(t, (0, 0, left, 0)) if left else t

        width = self.cache.get_seq_length()
        new_width = max(width, n)
        for old, new in zip(self.cache.layers, cache.layers, strict=True):
            # Pad dim -2 (positions) on the left; padded columns are masked out.
            old.keys = torch.cat([pad(old.keys, new_width - width), pad(new.keys, new_width - n)])
            old.values = torch.cat(
                [pad(old.values, new_width - width), pad(new.values, new_width - n)]
            )

    def _decode(self) -> None:
        """One decode step for every running row; each samples its next token."""
        import torch

        engine = self.engine
        width = self.cache.get_seq_length()
        lengths = torch.tensor([r.length for r in self.rows])
        # Row i attends to its own last lengths[i] cached columns plus the new token.
        mask = (torch.arange(width + 1)[None, :] >= (width - lengths)[:, None]).long()
        engine.metrics.batch_size.observe(len(self.rows))
        out = engine.model(
            input_ids=torch.tensor([[r.next_id] for r in self.rows]),
            attention_mask=mask,
            position_ids=lengths.unsqueeze(1),
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,
            **engine.adapter_kwargs([r.key for r in self.rows]),
        )
        self.cache = out.cache
        logits = out.logits[:, -1, :].float()
        for i, row in enumerate(self.rows):
            row.length += 1
            if not row.req.active:
                continue
            row.next_id = engine.sample(logits[i], row.req)
            engine.advance(row.req, row.next_id)

    def _drop_finished(self) -> None:
        """Remove finished and cancelled rows from the batch and trim unused columns."""
        import torch

        keep = [i for i, r in enumerate(self.rows) if r.req.active]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        self.engine.metrics.running.set(len(self.rows))
        if not self.rows:
            self.cache = None
            return
        index = torch.tensor(keep)
        width = self.cache.get_seq_length()
        start = width - max(r.length for r in self.rows)
        for layer in self.cache.layers:
            layer.keys = layer.keys[index, :, start:, :]
            layer.values = layer.values[index, :, start:, :]


def make_scheduler(kind: str, engine: Engine) -> Scheduler:
    """The scheduler named kind ("continuous" or "static")."""
    if kind == "continuous":
        return ContinuousScheduler(engine)
    if kind == "static":
        return StaticScheduler(engine)
    raise ValueError(f"unknown scheduler {kind!r}: use one of {', '.join(SCHEDULERS)}")
