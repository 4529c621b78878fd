"""The engine's one copy of the base model: its tokenizer, its forward, its attached LoRA weights.

While adapters are attached the module is a PEFT model around the base, and one forward mixes
them per row through PEFT's `adapter_names` (`"__base__"` for the base). Which adapters are
attached, and when they leave, is decided in `cft/engine/adapters.py`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from cft.engine.request import BASE
from workers import base_model


class Model:
    """The base model and its tokenizer, with the LoRA adapters attached to it."""

    def __init__(self, name: str, models_dir: Path, *, served_name: str | None = None) -> None:
        import torch

        torch.manual_seed(0)
        self.name = served_name or name
        self.path, self.revision = base_model.resolve(name, models_dir)
        self.tokenizer = base_model.load_tokenizer(name, models_dir)
        self.base = base_model.load_model(name, models_dir).eval()
        self.module: Any = self.base  # the base, or the PEFT model around it
        self.max_model_len = int(getattr(self.base.config, "max_position_embeddings", 2048))
        self.eos_ids = self._eos_ids()
        # Held while the model runs or its adapters change (PEFT's adapter set is not
        # thread-safe), and over the scheduler's running batch.
        self.lock = threading.RLock()

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.tokenizer.eos_token_id, self.base.generation_config.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, list):
                ids.update(int(i) for i in source)
        return ids

    def chat_prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The base's chat template with the generation prompt, as in training."""
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def text_prompt_ids(self, prompt: str) -> list[int]:
        """Token ids of a plain completion prompt."""
        return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        """The text of generated token ids (special tokens left out)."""
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def forward(self, keys: list[str | None], **inputs: Any) -> Any:
        """One forward pass; row i runs with the adapter whose PEFT key is keys[i] (None: base)."""
        if self.module is self.base:
            return self.module(**inputs)
        return self.module(**inputs, adapter_names=[k or BASE for k in keys])

    def attach(self, key: str, path: str) -> None:
        """Load the adapter at path into PEFT under key."""
        from peft import PeftModel

        if self.module is self.base:
            self.module = PeftModel.from_pretrained(self.base, path, adapter_name=key).eval()
        else:
            self.module.load_adapter(path, adapter_name=key)
            self.module.eval()

    def detach(self, key: str, *, last: bool) -> None:
        """Delete the adapter under key; the last one gives back the plain base model."""
        if last:
            self.module = self.module.unload()
            self.base = self.module
        else:
            self.module.delete_adapter(key)
