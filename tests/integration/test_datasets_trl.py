"""Exports load with `datasets.load_dataset("json", ...)` and pass the matching TRL trainer's
dataset preparation (the trainer is built on a tiny random model; nothing is trained)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.datasets import service as datasets
from tests.support.factories import make_log, make_route, make_tenant
from tests.support.training import tiny_llama

TOKENIZER = Path("/work/shared/data/smollm2-135m-instruct-tokenizer")
if not TOKENIZER.exists():
    TOKENIZER = Path(__file__).resolve().parents[2] / "data" / "smollm2-135m-instruct-tokenizer"

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    return tok, lambda: tiny_llama(vocab_size=len(tok))


def _traffic(conn):
    tenant = make_tenant(conn)
    route = make_route(conn, tenant_id=tenant["id"])
    for i in range(24):
        msgs = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"Question {i}: what is {i} + {i}?"},
        ]
        rej = make_log(
            conn,
            tenant_id=tenant["id"],
            route=route["name"],
            messages=msgs,
            completion=f"I think {i} + {i} is {i}.",
            tokens_out=8,
            fb_regen=True,
            fb_explicit=-1 if i % 2 else None,
            fb_edited=i % 3 == 0,
            edited_completion=f"{i} + {i} = {2 * i}." if i % 3 == 0 else None,
        )
        make_log(
            conn,
            tenant_id=tenant["id"],
            route=route["name"],
            messages=msgs,
            completion=f"It is {2 * i}.",
            tokens_out=6,
            parent_id=rej["id"],
            fb_explicit=1 if i % 2 else None,
        )
    return tenant, route


@pytest.mark.parametrize("method", ["sft", "kto", "dpo", "orpo", "simpo"])
def test_export_loads_and_trainer_prepares_it(conn, tmp_path, tiny, method):
    from datasets import load_dataset

    tenant, route = _traffic(conn)
    snap = datasets.create_snapshot(
        conn, tenant_id=tenant["id"], route=route["name"], method=method, eval_pct=25
    )
    assert snap.n_train > 0 and snap.n_eval > 0
    files = {}
    for split in ("train", "eval"):
        files[split] = str(tmp_path / f"{split}.jsonl")
        n = datasets.write_jsonl(conn, snapshot_id=snap.id, split=split, out=Path(files[split]))
        assert n == getattr(snap, f"n_{split}")
    ds = load_dataset("json", data_files=files)
    assert ds["train"].num_rows == snap.n_train and ds["eval"].num_rows == snap.n_eval

    tok, make_model = tiny
    common = {
        "output_dir": str(tmp_path / "out"),
        "report_to": "none",
        "max_length": 128,
        "per_device_train_batch_size": 2,
        "use_cpu": True,
    }
    if method == "sft":
        from trl import SFTConfig, SFTTrainer

        trainer = SFTTrainer(
            model=make_model(),
            args=SFTConfig(**common, assistant_only_loss=False),
            train_dataset=ds["train"],
            eval_dataset=ds["eval"],
            processing_class=tok,
        )
        cols = {"input_ids"}
    elif method == "kto":
        from trl import KTOConfig, KTOTrainer

        trainer = KTOTrainer(
            model=make_model(),
            ref_model=make_model(),
            args=KTOConfig(**common),
            train_dataset=ds["train"],
            eval_dataset=ds["eval"],
            processing_class=tok,
        )
        cols = {"prompt_ids", "completion_ids", "label"}
    elif method == "dpo":
        from trl import DPOConfig, DPOTrainer

        trainer = DPOTrainer(
            model=make_model(),
            ref_model=make_model(),
            args=DPOConfig(**common),
            train_dataset=ds["train"],
            eval_dataset=ds["eval"],
            processing_class=tok,
        )
        cols = {"prompt_ids", "chosen_ids", "rejected_ids"}
    elif method == "orpo":
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        trainer = ORPOTrainer(
            model=make_model(),
            args=ORPOConfig(**common),
            train_dataset=ds["train"],
            eval_dataset=ds["eval"],
            processing_class=tok,
        )
        cols = {"chosen_input_ids", "rejected_input_ids"}
    else:
        from trl.experimental.cpo import CPOConfig, CPOTrainer

        trainer = CPOTrainer(
            model=make_model(),
            args=CPOConfig(**common, loss_type="simpo", cpo_alpha=0.0),
            train_dataset=ds["train"],
            eval_dataset=ds["eval"],
            processing_class=tok,
        )
        cols = {"chosen_input_ids", "rejected_input_ids"}
    prepared = trainer.train_dataset
    assert cols <= set(prepared.column_names), prepared.column_names
    assert prepared.num_rows == snap.n_train
    # The assistant's text made it into the tokens.
    first = ds["train"][0]
    key = {"sft": "input_ids", "kto": "completion_ids", "dpo": "chosen_ids"}.get(
        method, "chosen_input_ids"
    )
    decoded = tok.decode(prepared[0][key])
    wanted = (
        first["messages"][-1]["content"]
        if method == "sft"
        else first["completion"][0]["content"]
        if method == "kto"
        else first["chosen"][0]["content"]
    )
    assert wanted in decoded
