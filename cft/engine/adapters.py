"""The adapters an engine serves, and which of them are in memory.

A registered adapter may be evicted from memory (least recently used first, beyond
`--max-cpu-loras`) and is reloaded from its path when a request needs it. An adapter unloaded
while requests still decode with it is retired: it stays in memory until they finish, and a new
adapter loaded under its name meanwhile gets its own PEFT key. Callers pass the PEFT keys the
running batch uses (`in_use`), so nothing it decodes with is evicted.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cft.engine.metrics import EngineMetrics
from cft.engine.model import Model
from cft.engine.request import BASE, EngineError

log = logging.getLogger(__name__)


@dataclass
class Adapter:
    """An adapter known to the engine (it may be evicted from memory and reloaded)."""

    name: str
    path: str
    rank: int
    # Its name inside PEFT: the name, unless an unloaded adapter of the same name is still
    # decoding, then the name with a suffix.
    key: str


class AdapterStore:
    """Registered adapters by name, and the LRU set of those attached to the model."""

    def __init__(
        self,
        model: Model,
        metrics: EngineMetrics,
        *,
        max_loras: int,
        max_cpu_loras: int | None,
        max_lora_rank: int,
    ) -> None:
        self.model = model
        self.metrics = metrics
        self.max_loras = max_loras
        self.max_cpu_loras = max(max_cpu_loras or max_loras, max_loras)
        self.max_lora_rank = max_lora_rank
        self.by_name: dict[str, Adapter] = {}  # every registered adapter, in load order
        self.resident: OrderedDict[str, None] = OrderedDict()  # PEFT keys in memory, LRU first
        self.retired: set[str] = set()  # keys of unloaded adapters a running request still uses
        self._suffix = itertools.count(1)

    def get(self, name: str) -> Adapter | None:
        """The registered adapter of that name, or None."""
        return self.by_name.get(name)

    def load(self, name: str, path: str, *, in_use: Callable[[], set[str]]) -> None:
        """Register an adapter and load it into memory (vLLM's /v1/load_lora_adapter)."""
        if not name or not path:
            raise EngineError(
                "Both 'lora_name' and 'lora_path' must be provided.", error_type="InvalidUserInput"
            )
        if name in self.by_name:
            raise EngineError(
                f"The lora adapter '{name}' has already been loaded.",
                error_type="InvalidUserInput",
            )
        if name in (self.model.name, BASE):
            raise EngineError(
                f"The name '{name}' is reserved for the base model.", error_type="InvalidUserInput"
            )
        rank = self._check_adapter_dir(path)
        with self.model.lock:
            key = name if name not in self.resident else f"{name}@{next(self._suffix)}"
            adapter = Adapter(name=name, path=path, rank=rank, key=key)
            self.make_resident(adapter, keep=in_use())
            self.by_name[name] = adapter
            self.metrics.loaded_adapters.set(len(self.by_name))
        log.info("loaded LoRA adapter %s from %s", name, path)

    def unload(self, name: str, *, in_use: Callable[[], set[str]]) -> None:
        """Forget an adapter (vLLM's /v1/unload_lora_adapter)."""
        if not name:
            raise EngineError(
                "either 'lora_name' and 'lora_int_id' needs to be provided.",
                error_type="InvalidUserInput",
            )
        with self.model.lock:
            if name not in self.by_name:
                raise EngineError(
                    f"The lora adapter '{name}' cannot be found.",
                    status=404,
                    error_type="NotFoundError",
                )
            key = self.by_name.pop(name).key
            # Requests already decoding with it finish on it; it leaves memory after them.
            if key in in_use():
                self.retired.add(key)
            elif key in self.resident:
                self._evict(key)
            self.metrics.loaded_adapters.set(len(self.by_name))

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
                f"but this engine serves '{self.model.name}' ({self.model.path})."
            )
        rank = int(cfg.get("r", 0))
        if rank > self.max_lora_rank:
            raise EngineError(
                f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}."
            )
        return rank

    def _same_base(self, parent: str) -> bool:
        # Artefacts move between machines, so a path matches on its last component too.
        names = {self.model.name, self.model.path, Path(self.model.path).name}
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
        try:
            self.model.attach(adapter.key, adapter.path)
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

    def _evict(self, key: str) -> None:
        del self.resident[key]
        self.model.detach(key, last=not self.resident)
        self.metrics.resident_adapters.set(len(self.resident))
        self.metrics.evictions.inc()
        log.info("evicted LoRA adapter %s from memory", key)
