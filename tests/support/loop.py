"""Helpers for loop tests: policies, cycles made due, a simulated trainer and evaluator."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from psycopg.types.json import Jsonb

from app.adapters import service as adapters


def set_policy(conn: Any, route: dict[str, Any], **fields: Any) -> None:
    """Insert or update a route's loop.policy row as the owner."""
    fields = {"enabled": True} | fields
    cols = ", ".join(fields)
    vals = ", ".join(f"%({k})s" for k in fields)
    upd = ", ".join(f"{k} = EXCLUDED.{k}" for k in fields)
    conn.execute(
        f"INSERT INTO loop.policy (route, tenant_id, {cols}) VALUES (%(route)s, %(tenant)s, {vals})"
        f" ON CONFLICT (tenant_id, route) DO UPDATE SET {upd}",
        {k: Jsonb(v) if isinstance(v, dict) else v for k, v in fields.items()}
        | {"route": route["name"], "tenant": route["tenant_id"]},
    )


def trigger(conn: Any, route: dict[str, Any], name: str) -> dict[str, Any]:
    """One trigger's row of loop.triggers(tenant, route) (route: a serve.route row)."""
    key = (route["tenant_id"], route["name"])
    rows = {r["trigger"]: r for r in conn.execute("SELECT * FROM loop.triggers(%s, %s)", key)}
    return rows[name]  # type: ignore[no-any-return]


def make_due(conn: Any, cycle_id: int) -> None:
    """Let a waiting step run now."""
    conn.execute("UPDATE loop.cycle SET next_step_at = now() WHERE id = %s", (cycle_id,))


def refresh(conn: Any) -> None:
    """Refresh the candidate views (the loop worker does it every --refresh seconds)."""
    conn.execute("SELECT train.refresh_dataset_candidates()")


def user(name: str) -> bytes:
    """A 32-byte pseudonym."""
    return hashlib.sha256(name.encode()).digest()


def finish_training(conn: Any, run_id: Any, *, adapter_id: str | None = None) -> str:
    """What the trainer does at the end of a run: register the candidate, mark it succeeded."""
    run = conn.execute("SELECT * FROM train.training_run WHERE id = %s", (run_id,)).fetchone()
    name = adapter_id or f"{run['route']}-{uuid.uuid4().hex[:8]}"
    adapters.register_candidate(
        conn, adapter_id=name, tenant_id=run["tenant_id"], route=run["route"],
        base_model=run["base_model"], base_revision=None, rank=8, alpha=16,
        target_modules=["q_proj"], method=run["method"], training_run_id=run["id"],
        dataset_snapshot_id=run["snapshot_id"], weights_uri=f"file:///tmp/{name}",
        sha256="0" * 64, size_bytes=1, eval_summary={},
    )  # fmt: skip
    conn.execute(
        "UPDATE train.training_run SET status = 'succeeded', adapter_id = %s, finished_at = now()"
        " WHERE id = %s",
        (name, run_id),
    )
    return name


def finish_eval(conn: Any, adapter_id: str, scores: dict[str, float]) -> None:
    """What the evaluator does: eval results and a done request."""
    tenant = conn.execute(
        "SELECT tenant_id FROM serve.adapter WHERE id = %s", (adapter_id,)
    ).fetchone()
    for key, score in scores.items():
        suite, metric = key.split("/")
        conn.execute(
            "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score, judge_model)"
            " VALUES (%s, %s, %s, %s, NULL)",
            (adapter_id, suite, metric, score),
        )
    conn.execute(
        "INSERT INTO train.eval_request (tenant_id, adapter_id, status, finished_at)"
        " VALUES (%s, %s, 'done', now())",
        (tenant["tenant_id"], adapter_id),
    )
