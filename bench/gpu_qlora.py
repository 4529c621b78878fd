"""QLoRA SFT and DPO on one GPU: the seed runbook's exact configuration against cft's (issue 5, item 5).

Same random-init ~1.1B Llama-shaped model (real SmolLM2 tokenizer), same synthetic chat data with realistic
variable lengths, measured in one process. For each configuration it prints tokens/s (real, non-pad tokens,
warm-up steps dropped), seconds per optimizer step and peak VRAM (torch.cuda.max_memory_allocated during
training; the model-load peak is printed apart and is the same for every configuration). "cft" is the fastest
candidate whose training peak is <= the runbook's.

Runs on the device machine (see BENCHMARKS.md, "QLoRA on GPU (issue 5)"), from the repo root, with wheels for
bitsandbytes, trl, datasets, dill, multiprocess and liger-kernel in bench/out/wheels and the tokenizer in
bench/out/tok:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site bench/out/wheels/*.whl
    PYTHONPATH=/tmp/site python3 bench/gpu_qlora.py --method sft --out $OUT
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

# bench/ holds a datasets.py of its own: keep it from shadowing the `datasets` package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
warnings.filterwarnings("ignore")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
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

# The seed runbook (shared/seeds/002_*.txt, "Phase 2"): everything it fixes, verbatim.
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
GC_KW = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}}


def sft_candidates(liger: bool) -> list[tuple[str, dict[str, Any]]]:
    """cft SFT candidates: BFD packing (padding-free, block-diagonal attention from position_ids), one packed
    row per micro-batch, accumulation chosen so an optimizer step still sees ~16 conversations."""
    out = []
    for length, ga in ((832, 8), (896, 7), (1024, 6), (1280, 5), (1536, 4)):
        kw = dict(
            per_device_train_batch_size=1,
            gradient_accumulation_steps=ga,
            optim="paged_adamw_8bit",
            max_length=length,
            packing=True,
            packing_strategy="bfd",
            **GC_KW,
        )
        out.append((f"pack{length}", kw))
        if liger:
            out.append((f"pack{length}-liger", {**kw, "use_liger_kernel": True}))
    return out


def dpo_candidates(liger: bool) -> list[tuple[str, dict[str, Any]]]:
    """cft DPO candidates (TRL 1.16 disables padding_free for DPO): larger micro-batch, fewer accumulation steps."""
    out = []
    for bs, ga in ((2, 8), (1, 16)):
        kw = dict(
            per_device_train_batch_size=bs,
            gradient_accumulation_steps=ga,
            optim="paged_adamw_8bit",
            max_length=2048,
            **GC_KW,
        )
        out.append((f"bs{bs}xga{ga}", kw))
        if liger:
            out.append((f"bs{bs}xga{ga}-liger", {**kw, "use_liger_kernel": True}))
    return out


def build_model(tok_dir: str) -> str:
    tok = AutoTokenizer.from_pretrained(tok_dir)
    path = os.path.join(tempfile.gettempdir(), "rand-llama-1b")
    if not os.path.exists(os.path.join(path, "config.json")):
        cfg = LlamaConfig(
            vocab_size=len(tok),
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=22,
            num_attention_heads=32,
            num_key_value_heads=4,
            max_position_embeddings=4096,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        torch.manual_seed(0)
        m = LlamaForCausalLM(cfg).to(torch.bfloat16)
        print(
            f"model: random Llama, {sum(p.numel() for p in m.parameters()) / 1e9:.2f} B params",
            flush=True,
        )
        m.save_pretrained(path)
        tok.save_pretrained(path)
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
    """Times optimizer steps after `warmup` and reads the training-only VRAM peak."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.t0 = self.t1 = 0.0
        self.tok0 = 0
        self.load_peak = 0

    def on_train_begin(self, args, state, control, **kw):
        torch.cuda.synchronize()
        self.load_peak = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()

    def on_step_begin(self, args, state, control, **kw):
        if state.global_step == self.warmup:
            torch.cuda.synchronize()
            self.t0 = time.perf_counter()
            self.tok0 = state.num_input_tokens_seen

    def on_train_end(self, args, state, control, **kw):
        torch.cuda.synchronize()
        self.t1 = time.perf_counter()


def run_one(
    method: str, name: str, kw: dict[str, Any], model_path: str, tok, ds, steps: int, warmup: int
):
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
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
        model_path,
        quantization_config=bnb,
        dtype=torch.bfloat16,
        device_map={"": 0},
        attn_implementation="sdpa",
    )
    out_dir = os.path.join(tempfile.gettempdir(), f"out-{method}-{name}")
    meter = Meter(warmup)
    cfg_cls, tr_cls = (SFTConfig, SFTTrainer) if method == "sft" else (DPOConfig, DPOTrainer)
    args = cfg_cls(output_dir=out_dir, max_steps=steps, **COMMON, **kw)
    tr = tr_cls(
        model=model,
        args=args,
        peft_config=lora,
        train_dataset=ds,
        processing_class=tok,
        callbacks=[meter],
    )
    res: dict[str, Any] = {"method": method, "name": name, "config": {k: v for k, v in kw.items()}}
    try:
        out = tr.train()
        dt = meter.t1 - meter.t0
        timed = steps - warmup
        ntok = tr.state.num_input_tokens_seen - meter.tok0
        res.update(
            ok=True,
            steps_timed=timed,
            sec_per_step=round(dt / timed, 3),
            tokens_timed=int(ntok),
            tokens_per_s=round(ntok / dt, 1),
            tokens_per_step=round(ntok / timed),
            peak_train_gib=round(torch.cuda.max_memory_allocated() / 2**30, 3),
            peak_load_gib=round(meter.load_peak / 2**30, 3),
            train_loss=round(out.training_loss, 4),
            wall_s=round(time.perf_counter() - wall0, 1),
        )
    except (
        Exception
    ) as exc:  # an OOM or an unsupported option must not lose the other configurations
        res.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:400]}")
    print("RESULT", json.dumps(res), flush=True)
    del tr, model
    gc.collect()
    torch.cuda.empty_cache()
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", choices=["sft", "dpo"], required=True)
    ap.add_argument("--tok", default="bench/out/tok")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/out"))
    ap.add_argument("--runbook-steps", type=int, default=10)
    ap.add_argument("--steps", type=int, default=16, help="optimizer steps per cft candidate")
    ap.add_argument("--warmup", type=int, default=2, help="steps dropped from the timing")
    ap.add_argument("--only", default="", help="comma-separated candidate names (default: all)")
    ap.add_argument("--single", default="", help="internal: run one configuration in this process")
    a = ap.parse_args()

    import peft
    import transformers
    import trl
    from datasets import Dataset

    try:
        import liger_kernel  # noqa: F401

        liger = True
    except Exception as exc:
        print("liger-kernel unavailable:", exc)
        liger = False
    import bitsandbytes

    print(
        f"device {torch.cuda.get_device_name(0)} torch {torch.__version__} transformers {transformers.__version__} "
        f"peft {peft.__version__} trl {trl.__version__} bitsandbytes {bitsandbytes.__version__} liger {liger}",
        flush=True,
    )
    tok = AutoTokenizer.from_pretrained(a.tok)
    model_path = build_model(a.tok)
    ds = Dataset.from_list(sft_data(2000) if a.method == "sft" else dpo_data(1000))
    cands = (sft_candidates if a.method == "sft" else dpo_candidates)(liger)
    if a.only:
        keep = set(a.only.split(","))
        cands = [c for c in cands if c[0] in keep]

    if a.single:
        kw = dict(RUNBOOK) if a.single == "runbook" else dict(cands)[a.single]
        steps = a.runbook_steps if a.single == "runbook" else a.steps
        run_one(a.method, a.single, kw, model_path, tok, ds, steps, a.warmup)
        return 0

    # One fresh process per configuration: in one process the freed model's memory was not all returned
    # (the load peak grew ~0.2 GiB per configuration), which would bias every peak after the first.
    results = []
    for name in ["runbook"] + [c[0] for c in cands]:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--single", name]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if lines:
            res = json.loads(lines[-1][len("RESULT ") :])
        else:
            res = {"method": a.method, "name": name, "ok": False, "error": proc.stderr[-600:]}
        print("RESULT", json.dumps(res), flush=True)
        results.append(res)

    base = results[0]
    ok = [r for r in results[1:] if r.get("ok")]
    for r in ok:
        if base.get("ok"):
            r["speedup"] = round(r["tokens_per_s"] / base["tokens_per_s"], 2)
            r["vram_ratio"] = round(r["peak_train_gib"] / base["peak_train_gib"], 3)
    fits = [r for r in ok if base.get("ok") and r["peak_train_gib"] <= base["peak_train_gib"]]
    best = max(fits, key=lambda r: r["tokens_per_s"]) if fits else None
    print(
        f"\n{a.method.upper()}  name | tok/s | s/step | tok/step | peak train GiB | speedup | VRAM ratio"
    )
    for r in results:
        if r.get("ok"):
            print(
                f"  {r['name']:<18} {r['tokens_per_s']:>9.0f} {r['sec_per_step']:>7.2f} {r['tokens_per_step']:>7} "
                f"{r['peak_train_gib']:>7.3f} {r.get('speedup', 1.0):>6.2f}x {r.get('vram_ratio', 1.0):>6.3f}"
            )
        else:
            print(f"  {r['name']:<18} FAILED {r['error']}")
    print("BEST", json.dumps(best), flush=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    Path(a.out, f"gpu_qlora_{a.method}.json").write_text(
        json.dumps({"results": results, "best": best}, indent=2)
    )
    return 0 if base.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
