"""The engine: one base model, several LoRA adapters (PEFT), and a scheduler thread.

The scheduler (`workers/engine/scheduler.py`, continuous or static) decodes requests together,
step by step with a KV cache, in one left-padded batch that may mix adapters (PEFT's
`adapter_names`, `"__base__"` for the base). Tokens go back to each request's asyncio queue as
they are produced.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers import base_model
from workers.engine.metrics import EngineMetrics
from workers.engine.request import BASE, EngineError, GenRequest, Sampling
from workers.engine.scheduler import make_scheduler

__all__ = ["BASE", "Adapter", "Engine", "EngineError", "GenRequest", "Sampling"]

log = logging.getLogger(__name__)


@dataclass
class Adapter:
    """An adapter known to the engine (it may be evicted from memory and reloaded)."""

    name: str
    path: str
    rank: int
    # Its name inside PEFT: the name, unless an unloaded adapter of the same name is still
    # decoding (continuous batching), then the name with a suffix.
    key: str


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
        max_waiting: int = 256,
        batch_wait_ms: float = 10.0,
        default_max_tokens: int = 256,
        scheduler: str = "continuous",
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
        self.max_waiting = max_waiting
        self.batch_wait = batch_wait_ms / 1000
        self.default_max_tokens = default_max_tokens
        self.eos_ids = self._eos_ids()
        self.metrics = EngineMetrics()
        self.adapters: dict[str, Adapter] = {}  # every registered adapter, in load order
        self.resident: OrderedDict[str, None] = OrderedDict()  # PEFT keys in memory, LRU first
        self.retired: set[str] = set()  # keys of unloaded adapters a running request still uses
        self._suffix = itertools.count(1)
        self.model_lock = threading.RLock()
        self.scheduler = make_scheduler(scheduler, self)
        self.metrics.scheduler.labels(self.scheduler.name).set(1)
        self.scheduler.start()

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
        self.scheduler.close()

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
        rank = self._check_adapter_dir(path)
        with self.model_lock:
            key = name if name not in self.resident else f"{name}@{next(self._suffix)}"
            adapter = Adapter(name=name, path=path, rank=rank, key=key)
            self.make_resident(adapter, keep=self.scheduler.in_use())
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
            key = self.adapters.pop(name).key
            # Requests already decoding with it finish on it; it leaves memory after them.
            if key in self.scheduler.in_use():
                self.retired.add(key)
            elif key in self.resident:
                self._evict(key)
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

    def make_resident(self, adapter: Adapter, *, keep: set[str]) -> None:
        """Load adapter into PEFT, evicting least recently used ones whose key is not in keep."""
        if adapter.key in self.resident:
            self.resident.move_to_end(adapter.key)
            return
        self.evict_retired(keep)
        while len(self.resident) >= self.max_cpu_loras:
            victim = next((k for k in self.resident if k not in keep), None)
            if victim is None:
                break
            self._evict(victim)
        from peft import PeftModel

        try:
            if self.model is self.base:
                self.model = PeftModel.from_pretrained(
                    self.base, adapter.path, adapter_name=adapter.key
                ).eval()
            else:
                self.model.load_adapter(adapter.path, adapter_name=adapter.key)
                self.model.eval()
        except Exception as e:
            raise EngineError(f"Failed to load the adapter at {adapter.path}: {e}") from e
        self.resident[adapter.key] = None
        self.metrics.resident_adapters.set(len(self.resident))

    def evict_retired(self, in_use: set[str]) -> None:
        """Free the unloaded adapters that no running request uses any more."""
        for key in [k for k in self.retired if k not in in_use]:
            self.retired.discard(key)
            if key in self.resident:
                self._evict(key)

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
        """Queue a request for the scheduler thread (429 when the waiting queue is full)."""
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
        self.scheduler.submit(req)

    def adapter_kwargs(self, keys: list[str | None]) -> dict[str, Any]:
        """The forward's adapter arguments for rows decoding with these PEFT keys."""
        if self.model is self.base:
            return {}
        return {"adapter_names": [k or BASE for k in keys]}

    def sample(self, logits: Any, req: GenRequest) -> int:
        """The request's next token from its logits (greedy at temperature 0)."""
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

    def advance(self, req: GenRequest, tok: int) -> None:
        """Append a sampled token: stream the new text, finish on EOS, a stop or max_tokens."""
        if not req.token_ids:
            req.first_token = time.monotonic()
            self.metrics.ttft.observe(req.first_token - req.arrived)
        self.metrics.generation_tokens.inc()
        req.token_ids.append(tok)
        if tok in self.eos_ids:
            self.finish(req, "stop")
            return
        req.text = self.tokenizer.decode(req.token_ids, skip_special_tokens=True)
        for stop in req.sampling.stop:
            at = req.text.find(stop)
            if at >= 0:
                req.text = req.text[:at]
                self.finish(req, "stop")
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
            self.finish(req, "length")

    def finish(self, req: GenRequest, reason: str) -> None:
        """End a request: flush its held-back text and send its finish reason and usage."""
        req.finish_reason = reason
        if len(req.text) > req.sent:
            req.emit("delta", req.text[req.sent :])
            req.sent = len(req.text)
        req.emit("done", {"finish_reason": reason, "completion_tokens": len(req.token_ids)})
