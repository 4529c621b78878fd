"""LoRA adapter directories for the bundled base, for tests that load adapters into an engine."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers import base_model

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def make_adapter_dir(
    models_dir: Path,
    target: Path,
    *,
    seed: int | None,
    rank: int = 8,
    target_modules: Sequence[str] = ATTENTION,
    **config: Any,
) -> Path:
    """Save a LoRA adapter to target: seed None = zero-initialised (the base itself), else random.

    A random adapter has its lora_B scaled by 4 so that it visibly changes the output; `config`
    goes to peft's LoraConfig (use_dora, modules_to_save, …).
    """
    import torch
    from peft import LoraConfig, get_peft_model

    if seed is not None:
        torch.manual_seed(seed)
    model = get_peft_model(
        base_model.load_model(base_model.BUNDLED, models_dir),
        LoraConfig(
            r=rank,
            lora_alpha=16,
            target_modules=list(target_modules),
            init_lora_weights=seed is None,
            **config,
        ),
    )
    if seed is not None:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.mul_(4)
    model.save_pretrained(target)
    return target
