"""Training hyperparameters: one validated model shared by the REST API and the worker.

Defaults follow the seed's QLoRA runbook (r=8, alpha=16, dropout 0.05, q/k/v/o, lr 2e-4,
cosine, warmup 3 %, batch 1 x grad-accum 16, 3 epochs, max_length 2048). Pure pydantic: the
control plane imports it without loading any ML library.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

METHODS = ("sft", "dpo", "kto", "orpo", "simpo")
Method = Literal["sft", "dpo", "kto", "orpo", "simpo"]


class Hyperparameters(BaseModel):
    """LoRA and optimisation settings of one training run (unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(8, ge=1, le=1024, description="LoRA rank r.")
    alpha: int = Field(16, ge=1, le=4096, description="LoRA alpha.")
    dropout: float = Field(0.05, ge=0, lt=1, description="LoRA dropout.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="Module names that get adapters.",
    )
    learning_rate: float = Field(2e-4, gt=0, le=1, description="Peak learning rate.")
    lr_scheduler: Literal["cosine", "linear", "constant", "constant_with_warmup"] = "cosine"
    warmup: float = Field(0.03, ge=0, lt=1, description="Warmup as a fraction of the steps.")
    epochs: float = Field(3, gt=0, le=100, description="Passes over the training split.")
    max_steps: int = Field(-1, ge=-1, description="Stop after this many steps (-1: epochs).")
    max_length: int = Field(2048, ge=16, le=131072, description="Longest sequence in tokens.")
    batch_size: int = Field(1, ge=1, le=1024, description="Sequences per device step.")
    grad_accum: int = Field(16, ge=1, le=1024, description="Gradient accumulation steps.")
    seed: int = Field(42, ge=0, description="Random seed (data order and adapter init).")
    beta: float = Field(0.1, gt=0, le=100, description="Preference strength (DPO/KTO/ORPO/SimPO).")
    simpo_gamma: float = Field(0.5, ge=0, le=100, description="SimPO target reward margin.")
    weight_decay: float = Field(0.0, ge=0, le=1)
    max_grad_norm: float = Field(1.0, gt=0)
    gradient_checkpointing: bool | None = Field(
        None, description="None: on with CUDA, off on CPU (nothing to save there)."
    )
    optim: str | None = Field(
        None, description="Optimizer; None: paged_adamw_8bit on CUDA, adamw_torch on CPU."
    )

    @field_validator("target_modules")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name or not name.replace("_", "").replace(".", "").isalnum():
                raise ValueError(f"invalid module name {name!r}")
        return value
