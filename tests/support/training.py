"""Factories for training tests: snapshots with TRL-format examples, queued runs."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from psycopg.types.json import Jsonb


def _user(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"What is {i} plus {i}?"}]


def examples(method: str, n: int = 4) -> list[dict[str, Any]]:
    """n tiny examples in the snapshot contract's format for method."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        answer = [{"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]
        if method == "sft":
            out.append({"messages": _user(i) + answer})
        elif method == "kto":
            wrong = [{"role": "assistant", "content": "Nobody knows."}]
            out.append(
                {"prompt": _user(i), "completion": answer if i % 2 else wrong, "label": bool(i % 2)}
            )
        else:
            out.append(
                {
                    "prompt": _user(i),
                    "chosen": answer,
                    "rejected": [{"role": "assistant", "content": "I will not answer that."}],
                }
            )
    return out


def make_snapshot(
    conn: Any,
    *,
    tenant_id: int,
    route: str,
    method: str,
    train: list[dict[str, Any]] | None = None,
    eval: list[dict[str, Any]] | None = None,
    **over: Any,
) -> dict[str, Any]:
    """Insert a dataset snapshot and its examples (default: 4 train, 0 eval of method)."""
    train = examples(method) if train is None else train
    eval = [] if eval is None else eval
    rows = [("train", e) for e in train] + [("eval", e) for e in eval]
    hashes = [hashlib.sha256(json.dumps(e, sort_keys=True).encode()).digest() for _, e in rows]
    set_hash = hashlib.sha256(b"".join(sorted(hashes))).hexdigest()
    # A sealed snapshot (set_hash set) takes examples only in the transaction creating it.
    with conn.transaction():
        snap = conn.execute(
            "INSERT INTO train.dataset_snapshot (tenant_id, route, method, query_sql, n_train, n_eval,"
            " set_hash) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING *",
            (
                tenant_id,
                route,
                method,
                over.get("query_sql", "-- test"),
                len(train),
                len(eval),
                set_hash,
            ),
        ).fetchone()
        for (split, example), h in zip(rows, hashes, strict=True):
            conn.execute(
                "INSERT INTO train.dataset_example (snapshot_id, example_hash, split, log_ids, example)"
                " VALUES (%s, %s, %s, %s, %s)",
                (snap["id"], h, split, [], Jsonb(example)),
            )
    return snap  # type: ignore[no-any-return]


def make_run(conn: Any, *, snapshot: dict[str, Any], **over: Any) -> dict[str, Any]:
    """Queue a training run for a snapshot (tiny hyperparameters unless told)."""
    row = {
        "tenant_id": snapshot["tenant_id"],
        "route": snapshot["route"],
        "method": snapshot["method"],
        "base_model": "smollm2-135m-instruct",
        "params": {
            "max_steps": 2,
            "max_length": 96,
            "batch_size": 2,
            "grad_accum": 1,
            "learning_rate": 1e-3,
            "warmup": 0.0,
        },
        "snapshot_id": snapshot["id"],
        "priority": 0,
        "max_attempts": 3,
    } | over
    row["params"] = Jsonb(row["params"])
    cols = ", ".join(row)
    vals = ", ".join(f"%({k})s" for k in row)
    return conn.execute(  # type: ignore[no-any-return]
        f"INSERT INTO train.training_run ({cols}) VALUES ({vals}) RETURNING *", row
    ).fetchone()


def setup_route(
    conn: Any, method: str = "sft"
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A tenant, a route and a snapshot of method for it."""
    from tests.support.factories import make_route, make_tenant

    tenant = make_tenant(conn)
    route = make_route(conn, tenant_id=tenant["id"])
    snap = make_snapshot(conn, tenant_id=tenant["id"], route=route["name"], method=method)
    return tenant, route, snap


def tiny_llama(
    *, vocab_size: int = 97, hidden: int = 16, layers: int = 1, heads: int = 2, kv_heads: int = 2
) -> Any:
    """A random-init Llama small enough for CPU tests (seeded: the same weights each call)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config)
