"""The engine: its parts put together, and the checks a request passes before it is queued.

The parts import one way: `scheduler` runs `batch` over `model`, `adapters`, `sampling` and
`output`; this module builds them all and is what the HTTP layer and the CLI use.
"""

from __future__ import annotations

from pathlib import Path

from cft.engine.adapters import AdapterStore
from cft.engine.metrics import EngineMetrics
from cft.engine.model import Model
from cft.engine.output import OutputProcessor
from cft.engine.request import EngineError, GenRequest
from cft.engine.scheduler import Scheduler


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
        default_max_tokens: int = 256,
    ) -> None:
        self.metrics = EngineMetrics()
        self.model = Model(base_model_name, models_dir, served_name=served_name)
        self.adapters = AdapterStore(
            self.model,
            self.metrics,
            max_loras=max_loras,
            max_cpu_loras=max_cpu_loras,
            max_lora_rank=max_lora_rank,
        )
        self.default_max_tokens = default_max_tokens
        self.scheduler = Scheduler(
            self.model,
            self.adapters,
            OutputProcessor(self.model, self.metrics),
            self.metrics,
            max_batch=max_batch,
            max_waiting=max_waiting,
        )
        self.scheduler.start()

    def close(self) -> None:
        """Stop the scheduler thread."""
        self.scheduler.close()

    def model_exists(self, name: str) -> bool:
        """True for the base model's name and every registered adapter."""
        return name == self.model.name or name in self.adapters.by_name

    def load_adapter(self, name: str, path: str) -> None:
        """Register an adapter and load it into memory (vLLM's /v1/load_lora_adapter)."""
        self.adapters.load(name, path, in_use=self.scheduler.in_use)

    def unload_adapter(self, name: str) -> None:
        """Forget an adapter (vLLM's /v1/unload_lora_adapter)."""
        self.adapters.unload(name, in_use=self.scheduler.in_use)

    def submit(self, req: GenRequest) -> None:
        """Queue a request for the scheduler thread (429 when the waiting queue is full)."""
        if len(req.prompt_ids) == 0:
            raise EngineError("The prompt is empty.")
        total = len(req.prompt_ids) + req.sampling.max_tokens
        limit = self.model.max_model_len
        if total > limit:
            raise EngineError(
                f"This model's maximum context length is {limit} tokens. However, "
                f"you requested {total} tokens ({len(req.prompt_ids)} in the messages, "
                f"{req.sampling.max_tokens} in the completion). Please reduce the length of the "
                "messages or completion."
            )
        if req.adapter is not None and req.adapter not in self.adapters.by_name:
            raise EngineError(
                f"The model `{req.adapter}` does not exist.", status=404, error_type="NotFoundError"
            )
        self.scheduler.submit(req)
