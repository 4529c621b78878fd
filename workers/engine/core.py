"""The engine: one base model, several LoRA adapters (PEFT), and a batching scheduler thread.

Requests that arrive together are decoded together, step by step with a KV cache, in one
left-padded batch that may mix adapters (PEFT's `adapter_names`, `"__base__"` for the base).
Tokens go back to each request's asyncio queue as they are produced.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers import base_model
from workers.engine.metrics import EngineMetrics

log = logging.getLogger(__name__)

BASE = "__base__"


class EngineError(Exception):
    """An error with vLLM's status code and error type."""

    def __init__(self, message: str, *, status: int = 400, error_type: str = "BadRequestError"):
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = error_type


@dataclass
class Sampling:
    """Per-request sampling parameters."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)


@dataclass
class GenRequest:
    """One generation in flight; events go to `queue` on `loop`."""

    prompt_ids: list[int]
    adapter: str | None
    sampling: Sampling
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[tuple[str, Any]]
    arrived: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    # Filled by the scheduler thread.
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    sent: int = 0
    finish_reason: str | None = None
    generator: Any = None

    def emit(self, kind: str, payload: Any) -> None:
        """Hand an event to the request's event loop (thread-safe)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, payload))


@dataclass
class Adapter:
    """An adapter known to the engine (it may be evicted from memory and reloaded)."""

    name: str
    path: str
    rank: int


class Engine:
    """Multi-LoRA generation on one copy of the base model."""

    def __init__(
        self,
        base_model_name: str,
        models_dir: Path,
        *,
        served_name: str | None = None,
        max_loras: int = 4,
        max_cpu_loras: int | None = None,
        max_lora_rank: int = 64,
        max_batch: int = 16,
        batch_wait_ms: float = 10.0,
        default_max_tokens: int = 256,
    ) -> None:
        import torch

        torch.manual_seed(0)
        self.base_name = served_name or base_model_name
        self.base_path, self.revision = base_model.resolve(base_model_name, models_dir)
        self.tokenizer = base_model.load_tokenizer(base_model_name, models_dir)
        self.base = base_model.load_model(base_model_name, models_dir).eval()
        self.model: Any = self.base
        self.max_model_len = int(getattr(self.base.config, "max_position_embeddings", 2048))
        self.max_loras = max_loras
        self.max_cpu_loras = max(max_cpu_loras or max_loras, max_loras)
        self.max_lora_rank = max_lora_rank
        self.max_batch = max_batch
        self.batch_wait = batch_wait_ms / 1000
        self.default_max_tokens = default_max_tokens
        self.eos_ids = self._eos_ids()
        self.metrics = EngineMetrics()
        self.adapters: dict[str, Adapter] = {}  # every registered adapter, in load order
        self.resident: OrderedDict[str, None] = OrderedDict()  # in PEFT now, LRU first
        self.model_lock = threading.RLock()
        self._pending: collections.deque[GenRequest] = collections.deque()
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)
        self._thread.start()

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.tokenizer.eos_token_id, self.base.generation_config.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, list):
                ids.update(int(i) for i in source)
        return ids

    def close(self) -> None:
        """Stop the scheduler thread."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    # Adapters

    def model_exists(self, name: str) -> bool:
        """True for the base model's name and every registered adapter."""
        return name == self.base_name or name in self.adapters

    def load_adapter(self, name: str, path: str) -> None:
        """Register an adapter and load it into memory (vLLM's /v1/load_lora_adapter)."""
        if not name or not path:
            raise EngineError(
                "Both 'lora_name' and 'lora_path' must be provided.", error_type="InvalidUserInput"
            )
        if name in self.adapters:
            raise EngineError(
                f"The lora adapter '{name}' has already been loaded.",
                error_type="InvalidUserInput",
            )
        if name in (self.base_name, BASE):
            raise EngineError(
                f"The name '{name}' is reserved for the base model.", error_type="InvalidUserInput"
            )
        adapter = Adapter(name=name, path=path, rank=self._check_adapter_dir(path))
        with self.model_lock:
            self._make_resident(adapter, keep=set())
            self.adapters[name] = adapter
            self.metrics.loaded_adapters.set(len(self.adapters))
        log.info("loaded LoRA adapter %s from %s", name, path)

    def unload_adapter(self, name: str) -> None:
        """Forget an adapter (vLLM's /v1/unload_lora_adapter)."""
        if not name:
            raise EngineError(
                "either 'lora_name' and 'lora_int_id' needs to be provided.",
                error_type="InvalidUserInput",
            )
        with self.model_lock:
            if name not in self.adapters:
                raise EngineError(
                    f"The lora adapter '{name}' cannot be found.",
                    status=404,
                    error_type="NotFoundError",
                )
            del self.adapters[name]
            if name in self.resident:
                self._evict(name)
            self.metrics.loaded_adapters.set(len(self.adapters))

    def _check_adapter_dir(self, path: str) -> int:
        cfg_file = Path(path) / "adapter_config.json"
        if not cfg_file.is_file():
            raise EngineError(
                f"No adapter found for {path}: adapter_config.json is missing.",
                status=404,
                error_type="NotFoundError",
            )
        try:
            cfg = json.loads(cfg_file.read_text())
        except (OSError, ValueError) as e:
            raise EngineError(f"Invalid adapter_config.json in {path}: {e}") from e
        if cfg.get("peft_type", "LORA") != "LORA":
            raise EngineError(f"{path} is not a LoRA adapter (peft_type={cfg.get('peft_type')}).")
        parent = cfg.get("base_model_name_or_path")
        if parent and not self._same_base(str(parent)):
            raise EngineError(
                f"The adapter at {path} was trained on '{parent}', "
                f"but this engine serves '{self.base_name}' ({self.base_path})."
            )
        rank = int(cfg.get("r", 0))
        if rank > self.max_lora_rank:
            raise EngineError(
                f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}."
            )
        return rank

    def _same_base(self, parent: str) -> bool:
        # Artefacts move between machines, so a path matches on its last component too.
        names = {self.base_name, self.base_path, Path(self.base_path).name}
        return parent in names or Path(parent).name in names

    def _make_resident(self, adapter: Adapter, *, keep: set[str]) -> None:
        """Load adapter into PEFT, evicting least recently used ones not in keep."""
        if adapter.name in self.resident:
            self.resident.move_to_end(adapter.name)
            return
        while len(self.resident) >= self.max_cpu_loras:
            victim = next((n for n in self.resident if n not in keep), None)
            if victim is None:
                break
            self._evict(victim)
        from peft import PeftModel

        try:
            if self.model is self.base:
                self.model = PeftModel.from_pretrained(
                    self.base, adapter.path, adapter_name=adapter.name
                ).eval()
            else:
                self.model.load_adapter(adapter.path, adapter_name=adapter.name)
                self.model.eval()
        except Exception as e:
            raise EngineError(f"Failed to load the adapter at {adapter.path}: {e}") from e
        self.resident[adapter.name] = None
        self.metrics.resident_adapters.set(len(self.resident))

    def _evict(self, name: str) -> None:
        del self.resident[name]
        if not self.resident:
            # The last adapter: give back the plain base model.
            self.model = self.model.unload()
            self.base = self.model
        else:
            self.model.delete_adapter(name)
        self.metrics.resident_adapters.set(len(self.resident))
        self.metrics.evictions.inc()
        log.info("evicted LoRA adapter %s from memory", name)

    # Prompts

    def chat_prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The base's chat template with the generation prompt, as in training."""
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def text_prompt_ids(self, prompt: str) -> list[int]:
        """Token ids of a plain completion prompt."""
        return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    # Scheduling

    def submit(self, req: GenRequest) -> None:
        """Queue a request for the scheduler thread."""
        if len(req.prompt_ids) == 0:
            raise EngineError("The prompt is empty.")
        total = len(req.prompt_ids) + req.sampling.max_tokens
        if total > self.max_model_len:
            raise EngineError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {total} tokens ({len(req.prompt_ids)} in the messages, "
                f"{req.sampling.max_tokens} in the completion). Please reduce the length of the "
                "messages or completion."
            )
        if req.adapter is not None and req.adapter not in self.adapters:
            raise EngineError(
                f"The model `{req.adapter}` does not exist.", status=404, error_type="NotFoundError"
            )
        with self._cond:
            self._pending.append(req)
            self.metrics.waiting.set(len(self._pending))
            self._cond.notify()

    def _take_batch(self) -> list[GenRequest]:
        with self._cond:
            while not self._pending and not self._stop:
                self._cond.wait()
            if self._stop:
                return []
        # Let requests that arrive together join the same batch.
        time.sleep(self.batch_wait)
        batch: list[GenRequest] = []
        chosen: set[str] = set()
        with self._cond:
            rest: collections.deque[GenRequest] = collections.deque()
            while self._pending:
                req = self._pending.popleft()
                if req.cancelled:
                    continue
                fits = req.adapter is None or req.adapter in chosen or len(chosen) < self.max_loras
                if len(batch) < self.max_batch and fits:
                    batch.append(req)
                    if req.adapter is not None:
                        chosen.add(req.adapter)
                else:
                    rest.append(req)
            self._pending = rest
            self.metrics.waiting.set(len(self._pending))
        return batch

    def _loop(self) -> None:
        while True:
            batch = self._take_batch()
            if not batch:
                if self._stop:
                    return
                continue
            try:
                with self.model_lock:
                    self._run_batch(batch)
            except Exception as e:  # the batch fails, the engine keeps serving
                log.exception("batch failed")
                for req in batch:
                    if req.finish_reason is None:
                        req.emit("error", EngineError(f"generation failed: {e}", status=500))

    def _run_batch(self, batch: list[GenRequest]) -> None:
        import torch

        batch = [r for r in batch if self._ensure_resident(r, batch)]
        if not batch:
            return
        self.metrics.batch_size.observe(len(batch))
        self.metrics.running.set(len(batch))
        pad_id = self.tokenizer.pad_token_id
        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.tensor(
            [[pad_id] * (width - len(r.prompt_ids)) + r.prompt_ids for r in batch]
        )
        mask = torch.tensor(
            [[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in batch]
        )
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        kwargs: dict[str, Any] = {}
        if self.model is not self.base:
            kwargs["adapter_names"] = [r.adapter or BASE for r in batch]
        for r in batch:
            seed = r.sampling.seed if r.sampling.seed is not None else random.getrandbits(63)
            r.generator = torch.Generator().manual_seed(seed)
        steps = max(r.sampling.max_tokens for r in batch)
        past = None
        try:
            with torch.inference_mode():
                for step in range(steps):
                    out = self.model(
                        input_ids=input_ids,
                        attention_mask=mask,
                        position_ids=positions,
                        cache=past,
                        use_cache=True,
                        logits_to_keep=1,
                        **kwargs,
                    )
                    past = out.past_key_values  # the cache object, updated in place
                    logits = out.logits[:, -1, :].float()
                    next_ids: list[int] = []
                    for i, r in enumerate(batch):
                        if r.finish_reason is not None or r.cancelled:
                            next_ids.append(pad_id)
                            continue
                        tok = self._sample(logits[i], r)
                        next_ids.append(tok)
                        self._advance(r, tok, first=step == 0)
                    if all(r.finish_reason is not None or r.cancelled for r in batch):
                        break
                    input_ids = torch.tensor(next_ids).unsqueeze(1)
                    mask = torch.cat([mask, torch.ones(len(batch), 1, dtype=mask.dtype)], dim=1)
                    positions = positions[:, -1:] + 1
        finally:
            self.metrics.running.set(0)
        for r in batch:
            if r.finish_reason is None and not r.cancelled:
                self._finish(r, "length")

    def _ensure_resident(self, req: GenRequest, batch: list[GenRequest]) -> bool:
        if req.adapter is None:
            return True
        adapter = self.adapters.get(req.adapter)
        if adapter is None:  # unloaded while waiting
            req.emit(
                "error",
                EngineError(
                    f"The model `{req.adapter}` does not exist.",
                    status=404,
                    error_type="NotFoundError",
                ),
            )
            return False
        keep = {r.adapter for r in batch if r.adapter is not None}
        try:
            self._make_resident(adapter, keep=keep)
        except EngineError as e:
            req.emit("error", e)
            return False
        return True

    def _sample(self, logits: Any, req: GenRequest) -> int:
        import torch

        s = req.sampling
        if s.temperature <= 0:
            return int(torch.argmax(logits).item())
        probs = torch.softmax(logits / s.temperature, dim=-1)
        if s.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            cumulative = torch.cumsum(sorted_p, dim=-1)
            drop = cumulative - sorted_p > s.top_p
            sorted_p[drop] = 0
            probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
            probs = probs / probs.sum()
        return int(torch.multinomial(probs, 1, generator=req.generator).item())

    def _advance(self, req: GenRequest, tok: int, *, first: bool) -> None:
        if first:
            self.metrics.ttft.observe(time.monotonic() - req.arrived)
        self.metrics.generation_tokens.inc()
        req.token_ids.append(tok)
        if tok in self.eos_ids:
            self._finish(req, "stop")
            return
        req.text = self.tokenizer.decode(req.token_ids, skip_special_tokens=True)
        for stop in req.sampling.stop:
            at = req.text.find(stop)
            if at >= 0:
                req.text = req.text[:at]
                self._finish(req, "stop")
                return
        # Hold back what could still become a stop string or an incomplete character.
        hold = max((len(s) - 1 for s in req.sampling.stop), default=0)
        safe = len(req.text) - hold
        if req.text.endswith("\ufffd"):
            safe = min(safe, len(req.text) - 1)
        if safe > req.sent:
            req.emit("delta", req.text[req.sent : safe])
            req.sent = safe
        if len(req.token_ids) >= req.sampling.max_tokens:
            self._finish(req, "length")

    def _finish(self, req: GenRequest, reason: str) -> None:
        req.finish_reason = reason
        if len(req.text) > req.sent:
            req.emit("delta", req.text[req.sent :])
            req.sent = len(req.text)
        req.emit("done", {"finish_reason": reason, "completion_tokens": len(req.token_ids)})
