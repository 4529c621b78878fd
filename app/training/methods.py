"""Each training method's hyperparameters, defined once for the API and the trainer (the
methods' names are app/datasets/methods.py).

Defaults follow a common QLoRA recipe, the runbook that bench/gpu_qlora.py measures against
(r=8, alpha=16, q/k/v/o, lr 2e-4, cosine, warmup 3 %, batch 1 x grad-accum 16, 3 epochs,
max_length 2048), except LoRA dropout: 0 (Unsloth's default; PEFT then skips the dropout copy of
each adapted layer's input, BENCHMARKS.md "QLoRA against Unsloth"). Pure pydantic: the control
plane imports it without loading any ML library.

Speed settings (packing, padding_free, use_liger_kernel, activation_offloading,
precompute_ref_log_probs, compile_layers) default to None: the trainer picks them per device and
method, and fills in an unset batch shape (`workers.trainer.plan.resolve_hyperparameters`; only
what the caller set is stored on the run, so the worker can tell). BENCHMARKS.md "QLoRA on GPU"
and "QLoRA against Unsloth" measure the CUDA defaults against the runbook and
against Unsloth.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_GC_KEYS = {"use_reentrant", "preserve_rng_state"}


class Hyperparameters(BaseModel):
    """LoRA and optimisation settings of one training run (unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(8, ge=1, le=1024, description="LoRA rank r.")
    alpha: int = Field(16, ge=1, le=4096, description="LoRA alpha.")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
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
    gradient_checkpointing_kwargs: dict[str, bool] = Field(
        default_factory=lambda: {"use_reentrant": False},
        description="Passed to gradient_checkpointing_enable; non-reentrant by default.",
    )
    packing: bool | None = Field(
        None,
        description="SFT only: BFD-pack examples into max_length rows. None: on for SFT with"
        " CUDA, off on CPU.",
    )
    padding_free: bool | None = Field(
        None, description="SFT only, needs packing (TRL 1.16). None: the same as packing."
    )
    use_liger_kernel: bool | None = Field(
        None,
        description="Liger kernels (CUDA only; ignored with a warning on CPU). None: on with CUDA"
        " for SFT and DPO when liger-kernel is installed.",
    )
    activation_offloading: bool | None = Field(
        None,
        description="SFT, DPO, KTO: keep saved activations in pinned CPU memory between"
        " forward and backward (CUDA only). None: on with CUDA for SFT and DPO.",
    )
    compile_layers: bool | None = Field(
        None,
        description="torch.compile each decoder layer (CUDA only; ignored with a warning on CPU):"
        " ~40-60 s of compiling for ~1.3-1.4x the tokens/s of a packed 1B SFT step. Replaces"
        " Liger's layer kernels (Dynamo cannot trace them), so it excludes use_liger_kernel=true."
        " None: on for single-GPU packed SFT runs of at least 200 optimizer steps.",
    )
    precompute_ref_log_probs: bool | None = Field(
        None,
        description="DPO and KTO: score the training set once with the adapter disabled before"
        " training, so a step runs no reference forward. None: on for DPO with CUDA when the"
        " run covers the training set at least once.",
    )
    distributed_strategy: Literal["ddp", "fsdp"] | None = Field(
        None,
        description="Runs with gpus > 1: ddp (every rank holds the NF4 base) or fsdp (the NF4"
        " base sharded across the GPUs). None: ddp when the base's NF4 weights take at most 40 %"
        " of one GPU's memory, else fsdp; ddp on CPU.",
    )
    precompute_ref_batch_size: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Pairs per reference batch when precomputing (None: batch_size).",
    )

    @field_validator("target_modules")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name or not name.replace("_", "").replace(".", "").isalnum():
                raise ValueError(f"invalid module name {name!r}")
        return value

    @field_validator("gradient_checkpointing_kwargs")
    @classmethod
    def _gc_kwargs(cls, value: dict[str, Any]) -> dict[str, bool]:
        unknown = set(value) - _GC_KEYS
        if unknown:
            raise ValueError(
                f"unknown gradient_checkpointing_kwargs {', '.join(sorted(unknown))}"
                f" (allowed: {', '.join(sorted(_GC_KEYS))})"
            )
        return {"use_reentrant": False} | value

    @model_validator(mode="after")
    def _speed(self) -> Hyperparameters:
        if self.padding_free and self.packing is False:
            raise ValueError(
                "padding_free needs packing in TRL 1.16 (without it max_length is not enforced):"
                " set packing=true or leave padding_free unset"
            )
        if self.compile_layers and self.use_liger_kernel:
            raise ValueError(
                "compile_layers and use_liger_kernel exclude each other: torch.compile cannot"
                " trace Liger's RMSNorm, and compiled layers fuse the same operations; set one"
            )
        if self.packing and self.padding_free is False:
            raise ValueError(
                "packing in cft is TRL's BFD packing, which is always padding-free:"
                " leave padding_free unset or true"
            )
        return self

    def check_method(self, method: str) -> None:
        """Refuse settings the method's TRL trainer does not support (ValueError)."""
        if method == "sft":
            return
        if self.packing:
            raise ValueError(f"packing is for sft only; {method} trains on (prompt, answer) pairs")
        if self.padding_free:
            raise ValueError(
                f"padding_free is for sft only: TRL 1.16's DPOTrainer disables it, and the"
                f" {method} trainer does not offer it; leave padding_free unset"
            )
        if method == "kto" and "batch_size" in self.model_fields_set and self.batch_size < 2:
            raise ValueError(
                "kto needs batch_size >= 2: TRL's KTOTrainer estimates its KL term across the"
                " micro-batch (leave batch_size unset for 2)"
            )
        if self.precompute_ref_log_probs and method not in ("dpo", "kto"):
            raise ValueError(
                f"precompute_ref_log_probs is for dpo and kto only; {method} has no reference model"
            )
        if self.activation_offloading and method not in ("dpo", "kto"):
            raise ValueError(
                f"activation_offloading is for sft, dpo and kto; {method}'s trainer lacks it"
            )
