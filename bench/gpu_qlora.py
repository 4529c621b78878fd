"""QLoRA SFT and DPO on one GPU: a common QLoRA recipe's exact configuration (the runbook) against cft's.

Same random-init ~1.1B Llama-shaped model (real SmolLM2 tokenizer), same synthetic chat data with realistic
variable lengths, each configuration in a fresh process of one device call. The runbook is a plain TRL script
with the recipe's settings verbatim (RUNBOOK and COMMON below); every cft candidate is a set of hyperparameters
that POST /v1/training-runs accepts, trained by `workers.trainer.train.train_adapter` (the worker's code path).
Printed per configuration: tokens/s (non-pad tokens, warm-up steps dropped; for DPO with a precomputed
reference pass, the timed steps' share of that pass is added to their time), seconds per optimizer step, and peak VRAM
(torch.cuda.max_memory_allocated over the whole run: model load, reference precompute and training).
"best" is the fastest candidate whose peak is <= the runbook's.

`--peers unsloth` adds Unsloth's QLoRA: FastLanguageModel in 4-bit (NF4 + double quant, bf16
compute) with the same LoRA (r 8, alpha 16, q/k/v/o; dropout 0.05 as the runbook and cft, and Unsloth's own
fast path at dropout 0), the same data, lr schedule, optimizer and ~16 examples per optimizer step, trained by
TRL's trainers as Unsloth patches them. Unsloth pins trl<=1.15, so its processes put `--unsloth-site` (a
folder holding unsloth, unsloth_zoo, trl 1.15 and their small deps) ahead of the main site on PYTHONPATH, and
import unsloth before transformers, as it asks.

Runs on the device machine (see BENCHMARKS.md, "QLoRA on GPU (issue 5)" and "QLoRA against Unsloth"), from
the repo root, with the packages its image lacks built here by bench/gpu_qlora_wheels.sh into .gpu/ (carry
.gpu/sites.tar.xz and .gpu/tok):

    tar -C /tmp -xJf .gpu/sites.tar.xz && export PYTHONPATH=/tmp/site
    python3 bench/gpu_qlora.py --method sft --tok .gpu/tok --peers unsloth --unsloth-site /tmp/site_u --out $OUT

`--tiny` runs the cft configurations on a tiny model on the CPU: a smoke test of this script before a device
call, nothing more.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

# bench/ holds a datasets.py of its own: keep it from shadowing the `datasets` package; the repo root
# gives `workers`
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.filterwarnings("ignore")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
_SINGLE = sys.argv[sys.argv.index("--single") + 1] if "--single" in sys.argv[:-1] else ""
if _SINGLE.startswith("unsloth"):
    # Unsloth patches transformers, PEFT and TRL at import: it must come first in its process.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("UNSLOTH_DISABLE_STATISTICS", "1")
    import unsloth  # noqa: F401
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    LlamaConfig,
    LlamaForCausalLM,
    TrainerCallback,
)

WORDS = [
    "network",
    "port",
    "vlan",
    "outage",
    "access",
    "point",
    "switch",
    "controller",
    "firmware",
    "reboot",
    "cable",
    "power",
    "poe",
    "link",
    "signal",
    "customer",
    "ticket",
    "north",
    "wing",
    "uplink",
    "trunk",
    "dhcp",
    "lease",
    "gateway",
    "latency",
    "packet",
    "loss",
]

# The runbook: a common QLoRA recipe's fixed settings, verbatim (cft's defaults started from them).
RUNBOOK = {
    "per_device_train_batch_size": 1,
    "gradient_accumulation_steps": 16,
    "gradient_checkpointing": True,
    "optim": "paged_adamw_8bit",
    "max_length": 2048,
}
COMMON = {
    "learning_rate": 2e-4,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 0.03,
    "bf16": True,
    "logging_steps": 1000,
    "save_strategy": "no",
    "report_to": "none",
    "include_num_input_tokens_seen": "non_padding",
    "seed": 0,
    "dataloader_num_workers": 0,
    "disable_tqdm": True,
}


# cft candidates: hyperparameters as POST /v1/training-runs accepts them (app.training.methods),
# trained by workers.trainer.train.train_adapter, the worker's own code path. Every candidate keeps the
# runbook's LoRA, lr schedule, paged_adamw_8bit and gradient checkpointing (non-reentrant).
SFT_CANDIDATES: dict[str, dict[str, Any]] = {
    "pack832-liger": dict(max_length=832, grad_accum=8, packing=True, use_liger_kernel=True),
    "pack768-liger": dict(max_length=768, grad_accum=9, packing=True, use_liger_kernel=True),
    "pack1024-liger-offload": dict(
        max_length=1024,
        grad_accum=7,
        packing=True,
        use_liger_kernel=True,
        activation_offloading=True,
    ),
    "pack1536-liger-offload": dict(
        max_length=1536,
        grad_accum=5,
        packing=True,
        use_liger_kernel=True,
        activation_offloading=True,
    ),
    "pack2048-liger-offload": dict(
        max_length=2048,
        grad_accum=4,
        packing=True,
        use_liger_kernel=True,
        activation_offloading=True,
    ),
    "default": dict(),
    # the default with the runbook's LoRA dropout (cft's default before round 2)
    "dropout005": dict(dropout=0.05),
    # Rounds of BENCHMARKS.md, "QLoRA against Unsloth on the GPU". Round 2 (keys starting with "_" are
    # bench knobs, not hyperparameters: `_lm_head_tile` sets workers.trainer.trl_factory.LM_HEAD_TILE,
    # TRL's own is 32768; `_profile` profiles one optimizer step).
    # Round 1's default (1024-token rows, ga 8, TRL's tile) at dropout 0:
    "d0-pack1024-tile32k": dict(max_length=1024, grad_accum=8, _lm_head_tile=32768),
    "d0-pack2048-tile32k": dict(max_length=2048, grad_accum=4, _lm_head_tile=32768),
    # two 2048-token rows per micro-batch (4096 tokens, padding-free), ga 2
    "d0-pack2048x2": dict(max_length=2048, batch_size=2, grad_accum=2),
    "d0-pack2048-no-offload": dict(max_length=2048, grad_accum=4, activation_offloading=False),
    "default-profile": dict(max_steps=4, _profile=True),
    "d0-pack1024": dict(max_length=1024, grad_accum=8),
    # round 4: what each CUDA default costs or buys at today's row length
    "d0-no-offload": dict(activation_offloading=False),
    "d0-no-ckpt-offload": dict(gradient_checkpointing=False),
    "d0-no-liger": dict(use_liger_kernel=False),
    # the step is host-bound (GPU busy ~10 %): cuDNN's SDPA spent ~1.6 ms of CPU per call on packed
    # rows of varying length; `_no_cudnn_sdp` lets SDPA pick another kernel
    "d0-sdpa-no-cudnn": dict(_no_cudnn_sdp=True),
    # round 4 made SDPA without cuDNN the default (workers.trainer.trl_factory.training_attention):
    # this is the default with cuDNN's SDPA allowed again
    "d0-cudnn-sdp": dict(_cudnn_sdp=True),
    "d0-sdpa-no-cudnn-profile": dict(max_steps=4, _profile=True, _no_cudnn_sdp=True),
    # round 5: compiled decoder layers (the `compile_layers` hyperparameter since then; round 4 compiled them
    # from the bench with Liger on, which Dynamo failed on). TRL 1.16 applies only Liger's layer kernels
    # (RMSNorm, RoPE, SwiGLU; its own fused LM head stays): compiled layers fuse those themselves, so Liger is off
    "d0-compile-no-liger": dict(use_liger_kernel=False, compile_layers=True),
    "d0-compile-no-liger-no-offload": dict(
        use_liger_kernel=False, activation_offloading=False, compile_layers=True
    ),
    # call 1 of round 5: compiled layers without offloading ran 1.26x Unsloth but 0.021 GiB over its peak;
    # a narrower LM-head tile trims the largest transient, `_offload_min_bytes` offloads only tensors of at
    # least that size (TRL's default 1024 B also moves small ones, each with its own copy and event)
    "d0-compile-no-offload-tile4096": dict(
        use_liger_kernel=False,
        activation_offloading=False,
        compile_layers=True,
        _lm_head_tile=4096,
    ),
    "d0-compile-no-offload-tile2048": dict(
        use_liger_kernel=False,
        activation_offloading=False,
        compile_layers=True,
        _lm_head_tile=2048,
    ),
    "d0-compile-offload-min1m": dict(
        use_liger_kernel=False, compile_layers=True, _offload_min_bytes=1 << 20
    ),
    # round 6: TRL's offloading empties the CUDA allocator's cache every micro-batch when bitsandbytes is
    # imported; cft keeps it (workers.trainer.trl_factory.keep_allocator_cache). `_empty_cache` = TRL's way.
    "compiled-emptycache": dict(compile_layers=True, _empty_cache=True),
    "default-emptycache": dict(_empty_cache=True),
    "compiled-30steps": dict(compile_layers=True, max_steps=30),
    # next: TRL's offloading also syncs the host with both streams at the end of each micro-batch;
    # `_exit_wait_stream` makes the streams wait for each other on the device instead (round 7: no gain)
    "compiled-exit-wait": dict(compile_layers=True, _exit_wait_stream=True),
    "default-exit-wait": dict(_exit_wait_stream=True),
    # the product path since round 5: `compile_layers` (auto only for runs of >= 200 steps; forced here)
    "compiled": dict(compile_layers=True),
    "d0-compile-no-liger-profile": dict(
        max_steps=4, _profile=True, use_liger_kernel=False, compile_layers=True
    ),
}
DPO_CANDIDATES: dict[str, dict[str, Any]] = {
    "bs1-liger-pre": dict(
        use_liger_kernel=True, precompute_ref_log_probs=True, precompute_ref_batch_size=2
    ),
    "bs2-liger-pre": dict(
        batch_size=2,
        grad_accum=8,
        use_liger_kernel=True,
        precompute_ref_log_probs=True,
        precompute_ref_batch_size=2,
    ),
    "bs2-liger-pre-offload": dict(
        batch_size=2,
        grad_accum=8,
        use_liger_kernel=True,
        precompute_ref_log_probs=True,
        precompute_ref_batch_size=2,
        activation_offloading=True,
    ),
    "bs4-liger-pre-offload": dict(
        batch_size=4,
        grad_accum=4,
        use_liger_kernel=True,
        precompute_ref_log_probs=True,
        precompute_ref_batch_size=2,
        activation_offloading=True,
    ),
    "bs2-liger-offload": dict(
        batch_size=2, grad_accum=8, use_liger_kernel=True, activation_offloading=True
    ),
    "default": dict(),
    "dropout005": dict(dropout=0.05),
    "d0-bs4x4": dict(batch_size=4, grad_accum=4),
    "d0-bs2x8-tile32k": dict(batch_size=2, grad_accum=8, _lm_head_tile=32768),
}


# Unsloth (peer): the runbook's batch shape, and cft's default shape (packed 1024-token rows, ga 8), each with
# the runbook's LoRA dropout and with Unsloth's recommended dropout 0 (its fast LoRA kernels).
UNSLOTH_SFT: dict[str, dict[str, Any]] = {
    "unsloth-runbook-shape": dict(
        batch_size=1, grad_accum=16, max_length=2048, packing=False, dropout=0.05
    ),
    "unsloth-pack1024": dict(
        batch_size=1, grad_accum=8, max_length=1024, packing=True, dropout=0.05
    ),
    "unsloth-pack1024-dropout0": dict(
        batch_size=1, grad_accum=8, max_length=1024, packing=True, dropout=0.0
    ),
    # Unsloth's own shape (its notebooks: batch 2, no packing, dropout 0) at 16 examples per step
    "unsloth-bs2x8-dropout0": dict(
        batch_size=2, grad_accum=8, max_length=2048, packing=False, dropout=0.0
    ),
    # cft's round-3 default shape on this data: packed 1536-token rows, ga 5
    "unsloth-pack1536-dropout0": dict(
        batch_size=1, grad_accum=5, max_length=1536, packing=True, dropout=0.0
    ),
    # cft's round-2 default shape: packed 2048-token rows, ga 4
    "unsloth-pack2048-dropout0": dict(
        batch_size=1, grad_accum=4, max_length=2048, packing=True, dropout=0.0
    ),
    "unsloth-pack2048x2-dropout0": dict(
        batch_size=2, grad_accum=2, max_length=2048, packing=True, dropout=0.0
    ),
    # the same shape, one optimizer step profiled (where Unsloth's GPU time goes, next to cft's)
    "unsloth-pack1536-dropout0-profile": dict(
        batch_size=1, grad_accum=5, max_length=1536, packing=True, dropout=0.0, _profile=True
    ),
}
UNSLOTH_DPO: dict[str, dict[str, Any]] = {
    "unsloth-bs1x16": dict(batch_size=1, grad_accum=16, max_length=2048, dropout=0.05),
    "unsloth-bs2x8-dropout0": dict(batch_size=2, grad_accum=8, max_length=2048, dropout=0.0),
    "unsloth-bs4x4-dropout0": dict(batch_size=4, grad_accum=4, max_length=2048, dropout=0.0),
}


# --tiny: a CPU smoke test of the bench's own code paths (no timing meaning)
TINY = "--tiny" in sys.argv


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _max_mem() -> int:
    return torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0


def build_model(tok_dir: str) -> str:
    """A random-init ~1.1B Llama with the real tokenizer, saved as a directory cft's loader accepts."""
    tok = AutoTokenizer.from_pretrained(tok_dir)
    path = os.path.join(tempfile.gettempdir(), "rand-llama-tiny" if TINY else "rand-llama-1b")
    if not os.path.exists(os.path.join(path, "cft_base.json")):
        cfg = LlamaConfig(
            vocab_size=len(tok),
            hidden_size=64 if TINY else 2048,
            intermediate_size=128 if TINY else 5632,
            num_hidden_layers=2 if TINY else 22,
            num_attention_heads=4 if TINY else 32,
            num_key_value_heads=2 if TINY else 4,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        torch.manual_seed(0)
        # random init on the GPU when there is one: on the CPU it took minutes of a device call
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            m = LlamaForCausalLM(cfg).to(torch.bfloat16)
        m = m.to("cpu")
        print(
            f"model: random Llama, {sum(p.numel() for p in m.parameters()) / 1e9:.2f} B params",
            flush=True,
        )
        m.save_pretrained(path)
        tok.save_pretrained(path)
        Path(path, "cft_base.json").write_text(
            json.dumps({"name": "rand-llama-1b", "revision": "random-seed0"})
        )
        del m
    return path


def words(lo: int, hi: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def sft_data(n: int) -> list[dict[str, Any]]:
    rng = random.Random(0)
    return [
        {
            "messages": [
                {"role": "user", "content": words(40, 200, rng)},
                {"role": "assistant", "content": words(80, 400, rng)},
            ]
        }
        for _ in range(n)
    ]


def dpo_data(n: int) -> list[dict[str, Any]]:
    rng = random.Random(1)
    return [
        {
            "prompt": [{"role": "user", "content": words(40, 200, rng)}],
            "chosen": [{"role": "assistant", "content": words(80, 400, rng)}],
            "rejected": [{"role": "assistant", "content": words(80, 400, rng)}],
        }
        for _ in range(n)
    ]


class Meter(TrainerCallback):
    """Times optimizer steps after `warmup`; splits the VRAM peak into setup (load, precompute) and training."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.t0 = self.t1 = 0.0
        self.tok0 = 0
        self.setup_peak = 0

    def on_train_begin(self, args, state, control, **kw):
        _sync()
        self.setup_peak = _max_mem()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def on_step_begin(self, args, state, control, **kw):
        if state.global_step == self.warmup:
            _sync()
            self.t0 = time.perf_counter()
            self.tok0 = state.num_input_tokens_seen

    def on_train_end(self, args, state, control, **kw):
        _sync()
        self.t1 = time.perf_counter()
        self.train_peak = _max_mem()
        self.tokens = state.num_input_tokens_seen


# Kernel-name groups for the profile's summary (substrings, first match wins).
KERNEL_GROUPS = (
    ("bnb 4-bit dequantisation", ("dequantize", "kDequantize")),
    ("GEMM", ("gemm", "nvjet", "sm90_", "cutlass", "cublas", "matmul")),
    ("attention", ("flash", "fmha", "attention", "efficient")),
    ("copies host<->device", ("Memcpy HtoD", "Memcpy DtoH")),
    ("Triton (Liger, TRL head)", ("triton", "liger", "_kernel")),
    ("elementwise / reduce / copy", ("elementwise", "reduce", "Memcpy", "Memset", "copy", "fill")),
)


class Profile(TrainerCallback):
    """torch.profiler over one optimizer step (the one after warm-up): where the GPU's time goes."""

    def __init__(self, step: int, out: str, name: str) -> None:
        self.step, self.out, self.name = step, out, name
        self.prof: Any = None
        self.t0 = 0.0

    def on_step_begin(self, args, state, control, **kw):
        if state.global_step == self.step:
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                acts.append(ProfilerActivity.CUDA)
            _sync()
            self.prof = profile(activities=acts)
            self.prof.__enter__()
            self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        if self.prof is None:
            return
        _sync()
        wall = time.perf_counter() - self.t0
        self.prof.__exit__(None, None, None)
        events = self.prof.key_averages()
        attr = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        groups: dict[str, float] = {}
        gpu = 0.0
        for e in events:
            t = float(getattr(e, attr, 0.0) or 0.0)
            if t <= 0 or (torch.cuda.is_available() and e.device_type.name != "CUDA"):
                continue
            gpu += t
            key = next(
                (g for g, subs in KERNEL_GROUPS if any(x.lower() in e.key.lower() for x in subs)),
                "other",
            )
            groups[key] = groups.get(key, 0.0) + t
        table = events.table(sort_by=attr, row_limit=40)
        launches = sum(e.count for e in events if "LaunchKernel" in e.key)
        summary = {
            "wall_s": round(wall, 3),
            "gpu_kernel_s": round(gpu / 1e6, 3),
            "gpu_busy": round(gpu / 1e6 / wall, 3) if wall else None,
            "kernel_launches": launches,
            "groups_s": {
                k: round(v / 1e6, 3) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])
            },
        }
        Path(self.out).mkdir(parents=True, exist_ok=True)
        Path(self.out, f"profile_{self.name}.txt").write_text(
            json.dumps(summary, indent=1) + "\n" + table
        )
        print("PROFILE", json.dumps(summary), flush=True)
        self.prof = None


PRECOMPUTE_S = [0.0]


def time_precompute() -> None:
    """Adds the reference pass's wall time (DPO precompute_ref_log_probs) to PRECOMPUTE_S."""
    from trl.trainer.dpo_trainer import DPOTrainer

    orig = DPOTrainer._precompute_ref_logps

    def timed(self, *a, **kw):
        torch.cuda.synchronize()
        t = time.perf_counter()
        try:
            return orig(self, *a, **kw)
        finally:
            torch.cuda.synchronize()
            PRECOMPUTE_S[0] += time.perf_counter() - t

    DPOTrainer._precompute_ref_logps = timed


def result(
    meter: Meter, steps: int, warmup: int, train_loss: float, wall0: float
) -> dict[str, Any]:
    dt = meter.t1 - meter.t0
    timed = steps - warmup
    ntok = meter.tokens - meter.tok0
    pre = PRECOMPUTE_S[0]
    # The reference pass covers the run's whole data set once (steps x 16 pairs): charge the timed steps
    # their share of it.
    dt_all = dt + pre * timed / steps
    peak = max(meter.setup_peak, meter.train_peak)
    return dict(
        ok=True,
        steps_timed=timed,
        sec_per_step=round(dt_all / timed, 3),
        tokens_timed=int(ntok),
        tokens_per_s=round(ntok / dt_all, 1),
        tokens_per_s_loop_only=round(ntok / dt, 1),
        precompute_s=round(pre, 2),
        tokens_per_step=round(ntok / timed),
        peak_gib=round(peak / 2**30, 3),
        peak_train_gib=round(meter.train_peak / 2**30, 3),
        peak_setup_gib=round(meter.setup_peak / 2**30, 3),
        peak_reserved_gib=round(
            torch.cuda.max_memory_reserved() / 2**30 if torch.cuda.is_available() else 0.0, 3
        ),
        train_loss=round(train_loss, 4),
        wall_s=round(time.perf_counter() - wall0, 1),
    )


def run_runbook(method: str, model_path: str, tok, rows, steps: int, warmup: int) -> dict[str, Any]:
    """The runbook's script, verbatim in every setting it fixes (raw TRL, no cft code)."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    bnb = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    lora = LoraConfig(
        r=8,
        lora_alpha=16,
        lora_dropout=0.05,
        bias="none",
        task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
    )
    wall0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        model_path, quantization_config=bnb, dtype=torch.bfloat16, device_map={"": 0}
    )
    meter = Meter(warmup)
    cfg_cls, tr_cls = (SFTConfig, SFTTrainer) if method == "sft" else (DPOConfig, DPOTrainer)
    args = cfg_cls(
        output_dir=os.path.join(tempfile.gettempdir(), f"out-{method}-runbook"),
        max_steps=steps,
        **COMMON,
        **RUNBOOK,
    )
    tr = tr_cls(
        model=model,
        args=args,
        peft_config=lora,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[meter],
    )
    out = tr.train()
    return result(meter, steps, warmup, out.training_loss, wall0)


def _offload_exit_without_host_sync() -> None:
    """`_exit_wait_stream`: TRL's offloading context ends each micro-batch with a host sync of both
    streams (`s0.synchronize(); s1.synchronize()`) before dropping its stashes, in a step that is
    host-bound. Here the two streams wait for each other on the device instead (every later kernel
    on either stream runs after the copies and the compute issued so far), so the stashed tensors
    can go and the host runs on."""
    from torch.autograd.graph import saved_tensors_hooks
    from trl.models.activation_offloading import OffloadActivations

    def exit_(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if self.use_streams:
                compute = self.s0
                compute.wait_stream(self.s1)
                self.s1.wait_stream(compute)
                self.bwd_tensor_stash.clear()
                self.bwd_ev_stash.clear()
                self.fwd_stash.clear()
        finally:
            result = saved_tensors_hooks.__exit__(self, *args, **kwargs)
        return result

    OffloadActivations.__exit__ = exit_


def run_cft(
    method: str,
    params: dict[str, Any],
    model_path: str,
    rows,
    steps: int,
    warmup: int,
    out_dir: str = "",
    name: str = "",
) -> dict[str, Any]:
    """One candidate through the worker's code path: Hyperparameters -> train_adapter."""
    from app.training.methods import Hyperparameters
    from workers.trainer import trl_factory
    from workers.trainer.base_cache import BaseCache
    from workers.trainer.train import train_adapter

    knobs = {k: v for k, v in params.items() if k.startswith("_")}
    params = {k: v for k, v in params.items() if not k.startswith("_")}
    if "_lm_head_tile" in knobs:
        trl_factory.LM_HEAD_TILE = knobs["_lm_head_tile"]
    if knobs.get("_no_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    if knobs.get("_cudnn_sdp"):
        trl_factory.training_attention = lambda packed_on_cuda: contextlib.nullcontext()
    if knobs.get(
        "_empty_cache"
    ):  # TRL's offloading as it is: the allocator's cache emptied per micro-batch
        trl_factory.keep_allocator_cache = lambda trainer: None
    if knobs.get("_exit_wait_stream"):
        _offload_exit_without_host_sync()
    if "_offload_min_bytes" in knobs:
        import trl.trainer.sft_trainer as sft_trainer

        offload = sft_trainer.get_act_offloading_ctx_manager
        sft_trainer.get_act_offloading_ctx_manager = lambda model, **kw: offload(
            model, **{**kw, "min_offload_size": knobs["_offload_min_bytes"]}
        )
    bases = BaseCache()
    hp = Hyperparameters(**{"max_steps": steps, "seed": 0, **params})
    steps = hp.max_steps
    work = Path(tempfile.mkdtemp(prefix=f"cft-{method}-"))
    data = work / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    wall0 = time.perf_counter()
    meter = Meter(warmup)
    extra: list[Any] = [meter]
    if knobs.get("_profile"):
        extra.append(Profile(warmup, out_dir, name))
    res = train_adapter(
        method,
        data,
        None,
        work / "adapter",
        base_model=model_path,
        models_dir=work / "models",
        params=hp,
        bases=bases,
        callbacks=extra,
    )
    out = result(meter, steps, warmup, res.metrics["train_loss"], wall0)
    out["resolved"] = {
        k: res.metrics.get(k)
        for k in (
            "packing",
            "liger",
            "activation_offloading",
            "precompute_ref_log_probs",
            "optimizer",
            "batch_size",
            "grad_accum",
            "max_length",
            "peak_vram_gib",
        )
    }
    out["hyperparameters"] = {
        k: v for k, v in hp.model_dump().items() if k in params or k == "max_steps"
    }
    return out


def run_unsloth(
    method: str,
    params: dict[str, Any],
    model_path: str,
    rows,
    steps: int,
    warmup: int,
    out_dir: str = "",
    name: str = "",
) -> dict[str, Any]:
    """Unsloth's QLoRA on the same model, data, LoRA, optimizer and examples per step (a peer, no cft code)."""
    from datasets import Dataset
    from unsloth import FastLanguageModel, PatchDPOTrainer

    wall0 = time.perf_counter()
    model, tok = FastLanguageModel.from_pretrained(
        model_name=model_path,
        max_seq_length=params["max_length"],
        dtype=torch.bfloat16,
        load_in_4bit=True,
    )
    model = FastLanguageModel.get_peft_model(
        model,
        r=8,
        lora_alpha=16,
        lora_dropout=params["dropout"],
        bias="none",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        use_gradient_checkpointing="unsloth",
        random_state=0,
    )
    meter = Meter(warmup)
    callbacks: list[Any] = [meter]
    if params.get("_profile"):
        callbacks.append(Profile(warmup, out_dir, name))
    shape = dict(
        per_device_train_batch_size=params["batch_size"],
        gradient_accumulation_steps=params["grad_accum"],
        max_length=params["max_length"],
        optim="paged_adamw_8bit",
        output_dir=os.path.join(tempfile.gettempdir(), f"out-{method}-unsloth"),
        max_steps=steps,
        **COMMON,
    )
    if method == "sft":
        from trl import SFTConfig, SFTTrainer

        args = SFTConfig(packing=params["packing"], **shape)
        tr = SFTTrainer(
            model=model,
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tok,
            callbacks=callbacks,
        )
    else:
        PatchDPOTrainer()
        from trl import DPOConfig, DPOTrainer

        args = DPOConfig(**shape)
        tr = DPOTrainer(
            model=model,
            ref_model=None,
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tok,
            callbacks=callbacks,
        )
    out = tr.train()
    res = result(meter, steps, warmup, out.training_loss, wall0)
    import trl
    import unsloth

    res["unsloth"] = {
        **{k: v for k, v in params.items() if not k.startswith("_")},
        "version": unsloth.__version__,
        "trl": trl.__version__,
    }
    return res


def _peer_env(name: str, unsloth_site: str) -> dict[str, str]:
    """An Unsloth process puts its own site (trl 1.15 and friends) ahead of the main one."""
    env = dict(os.environ)
    if name.startswith("unsloth") and unsloth_site:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (unsloth_site, env.get("PYTHONPATH")) if p)
    return env


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", choices=["sft", "dpo"], required=True)
    ap.add_argument("--tok", default="bench/out/tok")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/out"))
    ap.add_argument("--runbook-steps", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per cft candidate")
    ap.add_argument("--warmup", type=int, default=2, help="steps dropped from the timing")
    ap.add_argument("--only", default="", help="comma-separated candidate names (default: all)")
    ap.add_argument("--single", default="", help="internal: run one configuration in this process")
    ap.add_argument("--peers", default="", help="comma-separated peers to run as well: unsloth")
    ap.add_argument("--tiny", action="store_true", help="a tiny model on the CPU: smoke test only")
    ap.add_argument("--no-runbook", action="store_true", help="skip the runbook (no ratios)")
    ap.add_argument(
        "--unsloth-site",
        default="",
        help="folder with unsloth + trl<=1.15 (put ahead on PYTHONPATH)",
    )
    a = ap.parse_args()

    cands = SFT_CANDIDATES if a.method == "sft" else DPO_CANDIDATES
    names = [n for n in cands if not a.only or n in a.only.split(",")]
    peers = UNSLOTH_SFT if a.method == "sft" else UNSLOTH_DPO
    if "unsloth" in a.peers.split(","):
        # --only picks among the peer's configurations too when it names any of them
        wanted = [n for n in peers if n in a.only.split(",")]
        names += wanted or list(peers)
    if a.only:
        # in --only's order, repeats kept (a name twice runs twice: a cold first process shows
        # up against its warm repeat); a call cut short at its time limit keeps the first ones
        known = set(names)
        names = [n for n in a.only.split(",") if n in known]

    if a.single:
        logging.basicConfig(level=logging.WARNING)
        tok = AutoTokenizer.from_pretrained(a.tok)
        model_path = build_model(a.tok)
        steps = a.runbook_steps if a.single == "runbook" else a.steps
        # SFT: one pool, every run packs or batches from it. DPO: exactly the pairs the run trains on
        # (16 per optimizer step), so a precomputed reference pass costs what one epoch of them costs.
        rows = sft_data(200 if TINY else 2000) if a.method == "sft" else dpo_data(steps * 16)
        time_precompute()
        try:
            if a.single == "runbook":
                res = run_runbook(a.method, model_path, tok, rows, steps, a.warmup)
            elif a.single in peers:
                res = run_unsloth(
                    a.method, peers[a.single], model_path, rows, steps, a.warmup, a.out, a.single
                )
            else:
                res = run_cft(
                    a.method, cands[a.single], model_path, rows, steps, a.warmup, a.out, a.single
                )
        except (
            Exception
        ) as exc:  # an OOM or an unsupported option must not lose the other configurations
            res = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:600]}"}
        res = {"method": a.method, "name": a.single, **res}
        print("RESULT", json.dumps(res), flush=True)
        return 0

    import bitsandbytes
    import peft
    import transformers
    import trl

    try:
        import liger_kernel  # noqa: F401

        liger = True
    except Exception as exc:
        print("liger-kernel unavailable:", exc)
        liger = False
    print(
        f"device {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'} torch {torch.__version__} transformers {transformers.__version__} "
        f"peft {peft.__version__} trl {trl.__version__} bitsandbytes {bitsandbytes.__version__} liger {liger}",
        flush=True,
    )
    build_model(a.tok)

    # One fresh process per configuration: in one process the freed model's memory was not all returned
    # (the load peak grew ~0.2 GiB per configuration), which would bias every peak after the first.
    results = []
    for name in names if a.no_runbook else ["runbook", *names]:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--single", name]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=_peer_env(name, a.unsloth_site)
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if lines:
            res = json.loads(lines[-1][len("RESULT ") :])
            if not res.get("ok"):
                res["stderr"] = proc.stderr[-1500:]
        else:
            res = {"method": a.method, "name": name, "ok": False, "error": proc.stderr[-1500:]}
        print("RESULT", json.dumps(res), flush=True)
        results.append(res)
        Path(a.out).mkdir(parents=True, exist_ok=True)
        Path(a.out, f"gpu_qlora_{a.method}.json").write_text(
            json.dumps({"results": results}, indent=2)
        )

    base = {} if a.no_runbook else results[0]
    ok = [r for r in results[0 if a.no_runbook else 1 :] if r.get("ok")]
    for r in ok:
        if base.get("ok"):
            r["speedup"] = round(r["tokens_per_s"] / base["tokens_per_s"], 2)
            r["vram_ratio"] = round(r["peak_gib"] / base["peak_gib"], 3)
    fits = [r for r in ok if base.get("ok") and r["peak_gib"] <= base["peak_gib"]]
    best = max(fits, key=lambda r: r["tokens_per_s"]) if fits else None
    print(
        f"\n{a.method.upper()}  name | tok/s | tok/s loop | s/step | tok/step | peak GiB (train) | speedup | VRAM ratio"
    )
    for r in results:
        if r.get("ok"):
            print(
                f"  {r['name']:<24} {r['tokens_per_s']:>7.0f} {r['tokens_per_s_loop_only']:>7.0f} "
                f"{r['sec_per_step']:>6.2f} {r['tokens_per_step']:>6} {r['peak_gib']:>6.3f} "
                f"({r['peak_train_gib']:.3f}) {r.get('speedup', 1.0):>5.2f}x {r.get('vram_ratio', 1.0):>6.3f}"
            )
        else:
            print(f"  {r['name']:<24} FAILED {r['error'][-800:]}")
    print("BEST", json.dumps(best), flush=True)
    cft_default = next((r for r in ok if r["name"] == "default"), None)
    for r in ok:
        if cft_default and r["name"].startswith("unsloth"):
            print(
                f"cft default vs {r['name']}: tok/s {cft_default['tokens_per_s'] / r['tokens_per_s']:.2f}x, "
                f"peak VRAM {cft_default['peak_gib'] / r['peak_gib']:.3f}x "
                f"(goal: tok/s >= 1.00x at VRAM <= 1.000x)",
                flush=True,
            )
    Path(a.out).mkdir(parents=True, exist_ok=True)
    Path(a.out, f"gpu_qlora_{a.method}.json").write_text(
        json.dumps({"results": results, "best": best}, indent=2)
    )
    return 0 if base.get("ok") or a.no_runbook else 1


if __name__ == "__main__":
    sys.exit(main())
