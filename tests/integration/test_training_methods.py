"""Each method trains end to end: snapshot rows -> worker -> stored, verified artefact -> PeftModel.

Real model (SmolLM2-135M in NF4 on the CPU), real TRL trainers, tiny data (4 examples), 2 steps
of batch 2 at max_length 96. Like one worker process, the module loads the NF4 base once
(`bases`) and every run wraps and unloads its own LoRA around it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch

from app.core.artefacts import LocalStore, S3Store, verify
from app.engines import compat
from app.training.methods import Hyperparameters
from tests.support.servers import free_port
from tests.support.training import examples, make_run, setup_route
from workers import base_model as bm
from workers.trainer.base_cache import BaseCache, base_fingerprint, has_adapter_layers
from workers.trainer.data import check_rows
from workers.trainer.trl_factory import build_trainer
from workers.trainer.worker import Worker, WorkerConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3_store() -> Iterator[S3Store]:
    """A bucket on a real S3-protocol server (moto in server mode)."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket="adapters")
    yield S3Store("adapters", client)
    server.stop()


@pytest.fixture(scope="module")
def bases(models_dir: Path) -> BaseCache:
    """The worker-like context of this module: the NF4 base, loaded once."""
    cache = BaseCache()
    with cache.lease(bm.BUNDLED, models_dir):
        pass
    return cache


def _assert_base_pristine(bases: BaseCache) -> None:
    base = bases.current
    assert base is not None and bases.loads == 1, "the NF4 base was loaded more than once"
    assert not has_adapter_layers(base.model)
    assert base_fingerprint(base.model) == base.fingerprint


@pytest.fixture(scope="module")
def probe(models_dir: Path) -> dict[str, Any]:
    """The base model (unquantised, shared by the module) and a fixed prompt to compare logits."""
    from workers import base_model as bm

    tok = bm.load_tokenizer(bm.BUNDLED, models_dir)
    model = bm.load_model(bm.BUNDLED, models_dir)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 3 plus 3?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    return {"model": model, "peft": None, "inputs": tok(text, return_tensors="pt")}


def _logits_differ(probe: dict[str, Any], path: Path, name: str) -> float:
    from peft import PeftModel

    if probe["peft"] is None:
        probe["peft"] = PeftModel.from_pretrained(probe["model"], str(path), adapter_name=name)
    else:
        probe["peft"].load_adapter(str(path), adapter_name=name)
    peft = probe["peft"]
    peft.set_adapter(name)
    with torch.no_grad():
        on = peft(**probe["inputs"]).logits
        with peft.disable_adapter():
            off = peft(**probe["inputs"]).logits
    return float((on - off).abs().max())


@pytest.mark.parametrize(
    ("method", "backend"),
    [("sft", "local"), ("dpo", "s3"), ("kto", "local"), ("orpo", "local"), ("simpo", "s3")],
)
def test_method_trains_to_verified_artefact(  # type: ignore[no-untyped-def]
    method: str, backend: str, conn, db_url, tmp_path, models_dir, probe, s3_store, bases
) -> None:
    _, route, snap = setup_route(conn, method)
    run = make_run(conn, snapshot=snap)
    store = s3_store if backend == "s3" else LocalStore(tmp_path / "store")
    cfg = WorkerConfig(db_url=db_url, models_dir=models_dir, store=store, lease_s=30, bases=bases)
    started = time.monotonic()
    assert Worker(cfg).run_once()
    elapsed = time.monotonic() - started

    row = conn.execute("SELECT * FROM train.training_run WHERE id = %s", (run["id"],)).fetchone()
    assert row["status"] == "succeeded", row["error"]
    progress = row["progress"]
    assert progress["step"] == 2 and progress["total"] == 2
    assert progress["loss"] is not None and progress["eta_s"] is not None
    assert "tokens_per_s" in progress and progress["metrics"]["steps"] == 2
    _assert_base_pristine(bases)
    ad = conn.execute("SELECT * FROM serve.adapter WHERE id = %s", (row["adapter_id"],)).fetchone()
    assert ad["status"] == "candidate" and ad["method"] == method
    assert ad["id"].startswith(f"{route['name']}-") and ad["id"].endswith(run["id"].hex[:8])
    assert ad["training_run_id"] == run["id"] and ad["dataset_snapshot_id"] == snap["id"]
    assert ad["rank"] == 8 and ad["alpha"] == 16 and ad["base_revision"].startswith("gguf-sha256:")
    assert ad["weights_uri"].startswith("s3://adapters/" if backend == "s3" else "file://")

    local = store.fetch(ad["weights_uri"], tmp_path / "fetched")
    verify(local, ad["sha256"])
    assert sum(p.stat().st_size for p in local.iterdir()) == ad["size_bytes"]
    manifest = json.loads((local / "manifest.json").read_text())
    assert manifest["method"] == method and manifest["snapshot_id"] == str(snap["id"])
    assert manifest["set_hash"] == snap["set_hash"]
    assert manifest["files"]["adapter_model.safetensors"]["sha256"] == ad["sha256"]
    assert manifest["hyperparameters"]["rank"] == 8
    # What vLLM would load (app/engines/compat.py): the trainer checked it too.
    assert compat.check(local).ok, compat.check(local).problems
    config = json.loads((local / "adapter_config.json").read_text())
    assert config["r"] == 8 and set(config["target_modules"]) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
    }

    delta = _logits_differ(probe, local, method)
    assert delta > 1e-4, f"{method} adapter does not change the output (max |Δlogit| {delta})"
    print(
        f"{method}: {elapsed:.1f} s, tokens/s {manifest['metrics']['tokens_per_s']}, Δlogit {delta:.4f}"
    )


def test_sft_loss_covers_only_the_answer(tmp_path, bases) -> None:  # type: ignore[no-untyped-def]
    """SFT rows become prompt-completion pairs: labels are the last assistant turn only."""
    rows = [
        {
            "messages": [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "What is 2 plus 2?"},
                {"role": "assistant", "content": "Four."},
                {"role": "user", "content": "And 3 plus 3?"},
                {"role": "assistant", "content": "3 plus 3 is 6."},
            ]
        },
        *examples("sft", 1),
    ]
    hp = Hyperparameters(max_steps=1, max_length=96, batch_size=2, grad_accum=1)
    train_rows = check_rows("sft", rows, "train")
    assert train_rows[0]["completion"] == [rows[0]["messages"][-1]]
    base = bases.current
    with build_trainer("sft", train_rows, [], tmp_path, hp, base) as trainer:
        batch = next(iter(trainer.get_train_dataloader()))
    _assert_base_pristine(bases)
    tok = base.tokenizer
    seen = set()
    for ids, labels in zip(batch["input_ids"], batch["labels"], strict=True):
        mask = labels != -100
        text = tok.decode(labels[mask])
        seen.add(text.strip())
        # The trained tokens are one contiguous run right after the assistant header.
        first, last = int(mask.nonzero()[0]), int(mask.nonzero()[-1])
        assert int(mask.sum()) == last - first + 1
        assert tok.decode(ids[:first]).endswith("<|im_start|>assistant\n")
    assert seen == {"3 plus 3 is 6.<|im_end|>", "0 plus 0 is 0.<|im_end|>"}, seen


def test_cancel_stops_a_running_worker(conn, db_url, tmp_path, models_dir, bases) -> None:  # type: ignore[no-untyped-def]
    _, _, snap = setup_route(conn, "sft")
    run = make_run(
        conn,
        snapshot=snap,
        params={"max_steps": 50, "max_length": 64, "batch_size": 1, "grad_accum": 1},
    )
    cfg = WorkerConfig(
        db_url=db_url, models_dir=models_dir, store=LocalStore(tmp_path), lease_s=30, bases=bases
    )
    t = threading.Thread(target=Worker(cfg).run_once)
    t.start()
    deadline = time.monotonic() + 120
    while not (
        conn.execute(
            "SELECT progress FROM train.training_run WHERE id = %s", (run["id"],)
        ).fetchone()["progress"]
    ):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    conn.execute("SELECT train.cancel_training_run(%s)", (run["id"],))
    t.join(timeout=120)
    row = conn.execute("SELECT * FROM train.training_run WHERE id = %s", (run["id"],)).fetchone()
    assert row["status"] == "cancelled", row
    assert row["progress"]["step"] < 50 and "cancel" in row["error"]
    assert conn.execute("SELECT count(*) AS n FROM serve.adapter").fetchone()["n"] == 0
    _assert_base_pristine(bases)  # a cancelled run unloads its LoRA too


def test_an_inference_forward_leaves_the_shared_base_pristine(bases, models_dir) -> None:  # type: ignore[no-untyped-def]
    """The in-trainer evaluation runs the NF4 base in eval mode without grad: on a CPU with
    AVX512-BF16, bitsandbytes would repack the weights for inference there, the fingerprint
    would no longer match and every run with an eval split failed (the demo's did)."""
    import torch

    with bases.lease(bm.BUNDLED, models_dir) as base:
        model = base.model
        model.eval()
        with torch.no_grad():
            model(input_ids=torch.tensor([[1, 2, 3, 4]]))
        model.train()
    _assert_base_pristine(bases)
