"""A tenant with a row in every table that offboarding must empty, and counts per table."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

from app.core.artefacts import ArtefactStore
from app.core.auth import create_key
from app.finetuning import files as ft_files
from app.finetuning import service as ft_jobs
from app.finetuning.schemas import JobCreate
from tests.support.factories import make_adapter, make_log, make_route, make_tenant
from tests.support.training import make_run, make_snapshot


def populate(
    conn: Any, *, name: str, store: ArtefactStore, adapter_dir: Path, base_model: str
) -> dict[str, Any]:
    """A tenant with logs in two weekly partitions and DEFAULT, edges, a sealed snapshot, a run,
    a prod and a candidate adapter with stored artefacts, evals, policies, loop rows and keys."""
    t = make_tenant(conn, name=name)
    r = make_route(conn, tenant_id=t["id"], name=f"{name}-route", base_model=base_model)
    keys = {role: create_key(conn, tenant_id=t["id"], role=role) for role in ("admin", "reader")}
    conn.execute(  # the reader logged in to the dashboard
        "INSERT INTO auth.dashboard_session (token_hash, api_key_id, expires_at)"
        " SELECT %s, id, now() + interval '1 hour' FROM auth.api_key WHERE prefix = %s",
        (os.urandom(32), keys["reader"][:12]),
    )
    now = datetime.now(UTC)
    logs = [
        make_log(conn, tenant_id=t["id"], route=r["name"], created_at=when)
        for when in (now, now - timedelta(days=7), datetime(2020, 1, 6, tzinfo=UTC))
    ]
    for log in logs:  # (obs.request_key rows come with the log rows, by trigger)
        conn.execute(
            "INSERT INTO obs.prompt_neighbour_scan (log_id, created_at, tenant_id, route)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (log["id"], log["created_at"], t["id"], r["name"]),
        )
    conn.execute(
        "INSERT INTO obs.prompt_neighbour"
        " (tenant_id, route, a_id, a_created_at, b_id, b_created_at, distance)"
        " VALUES (%s, %s, %s, %s, %s, %s, 0.01)",
        (
            t["id"],
            r["name"],
            logs[1]["id"],
            logs[1]["created_at"],
            logs[0]["id"],
            logs[0]["created_at"],
        ),
    )
    snap = make_snapshot(conn, tenant_id=t["id"], route=r["name"], method="sft")
    run = make_run(conn, snapshot=snap, status="succeeded")
    adapters = []
    for version, status in (("v1", "prod"), ("v2", "candidate")):
        stored = store.put_dir(adapter_dir, r["name"], version)
        a = make_adapter(
            conn,
            route=r,
            id=f"{r['name']}-{version}",
            status=status,
            traffic_pct=100 if status == "prod" else 0,
            weights_uri=stored.uri,
            sha256=stored.sha256,
            training_run_id=run["id"],
            dataset_snapshot_id=snap["id"],
        )
        conn.execute(
            "INSERT INTO train.eval_result (adapter_id, suite_id, metric, score)"
            " VALUES (%s, 'tasks', 'accuracy', 0.9)",
            (a["id"],),
        )
        adapters.append(a)
    suite = f"{name}-suite"
    conn.execute(
        "INSERT INTO train.eval_suite (id, tenant_id, name, route) VALUES (%s, %s, %s, %s)",
        (suite, t["id"], suite, r["name"]),
    )
    conn.execute(
        "INSERT INTO train.eval_case (tenant_id, suite_id, messages, check_kind, expected)"
        " VALUES (%s, %s, %s, 'contains', %s)",
        (t["id"], suite, Jsonb([{"role": "user", "content": "hi"}]), Jsonb("hello")),
    )
    conn.execute(
        "INSERT INTO train.eval_request (tenant_id, adapter_id) VALUES (%s, %s)",
        (t["id"], adapters[1]["id"]),
    )
    conn.execute(
        "INSERT INTO train.promotion_policy (tenant_id, route, suite_id, metric, direction)"
        " VALUES (%s, %s, 'tasks', 'accuracy', 'higher')",
        (t["id"], r["name"]),
    )
    conn.execute(
        "INSERT INTO serve.experiment_policy (route, tenant_id) VALUES (%s, %s)",
        (r["name"], t["id"]),
    )
    conn.execute(
        "INSERT INTO serve.experiment_decision"
        " (route, tenant_id, experiment, canary_id, action, code, metric, reason)"
        " VALUES (%s, %s, %s, %s, 'hold', 'too_few', 'thumbs', 'test')",
        (r["name"], t["id"], r["name"], adapters[1]["id"]),
    )
    conn.execute(
        "INSERT INTO loop.policy (route, tenant_id, enabled) VALUES (%s, %s, true)",
        (r["name"], t["id"]),
    )
    cycle = conn.execute(
        "INSERT INTO loop.cycle (tenant_id, route, trigger) VALUES (%s, %s, 'manual') RETURNING id",
        (t["id"], r["name"]),
    ).fetchone()
    conn.execute(
        "INSERT INTO loop.cycle_event (cycle_id, tenant_id, to_state) VALUES (%s, %s, 'triggered')",
        (cycle["id"], t["id"]),
    )
    conn.execute(
        "INSERT INTO auth.forget_request (tenant_id, user_hash, logs_deleted,"
        " request_keys_deleted, snapshots_tainted, adapters_tainted)"
        " VALUES (%s, %s, 0, 0, 0, 0)",
        (t["id"], b"\x01" * 32),
    )
    # A fine-tuning file and job (its run and snapshot come with it), as the API makes them.
    ft_file = ft_files.create(
        conn,
        tenant_id=t["id"],
        filename="train.jsonl",
        purpose="fine-tune",
        content=b'{"messages": [{"role": "user", "content": "hi"},'
        b' {"role": "assistant", "content": "hello"}]}\n',
        max_bytes=1 << 20,
    )
    ft_jobs.create(
        conn,
        tenant_id=t["id"],
        body=JobCreate(model=r["name"], training_file=ft_file.id),
        actor="test",
    )
    return {
        "tenant": t,
        "route": r,
        "keys": keys,
        "adapters": [a["id"] for a in adapters],
        "uris": [a["weights_uri"] for a in adapters],
        "snapshots": [snap["id"]],
        "suites": [suite],
    }


# Rows of one tenant per table (what offboarding must remove), by the ids populate() returned.
COUNTS = {
    "tenant": "SELECT count(*) FROM tenant WHERE id = %(t)s",
    "auth.api_key": "SELECT count(*) FROM auth.api_key WHERE tenant_id = %(t)s",
    "auth.dashboard_session": (
        "SELECT count(*) FROM auth.dashboard_session s JOIN auth.api_key k"
        " ON k.id = s.api_key_id WHERE k.tenant_id = %(t)s"
    ),
    "auth.forget_request": "SELECT count(*) FROM auth.forget_request WHERE tenant_id = %(t)s",
    "obs.inference_log": "SELECT count(*) FROM obs.inference_log WHERE tenant_id = %(t)s",
    "obs.inference_log_default": (
        "SELECT count(*) FROM ONLY obs.inference_log_default WHERE tenant_id = %(t)s"
    ),
    "obs.inference_log partitions": (
        "SELECT count(DISTINCT tableoid) FROM obs.inference_log WHERE tenant_id = %(t)s"
    ),
    "obs.request_key": "SELECT count(*) FROM obs.request_key WHERE tenant_id = %(t)s",
    "obs.prompt_neighbour": "SELECT count(*) FROM obs.prompt_neighbour WHERE tenant_id = %(t)s",
    "obs.prompt_neighbour_scan": (
        "SELECT count(*) FROM obs.prompt_neighbour_scan WHERE tenant_id = %(t)s"
    ),
    "serve.route": "SELECT count(*) FROM serve.route WHERE tenant_id = %(t)s",
    "serve.adapter": "SELECT count(*) FROM serve.adapter WHERE tenant_id = %(t)s",
    "serve.adapter_event": "SELECT count(*) FROM serve.adapter_event WHERE tenant_id = %(t)s",
    "serve.adapter_deployment": (
        "SELECT count(*) FROM serve.adapter_deployment WHERE adapter_id = ANY (%(adapters)s)"
    ),
    "serve.experiment_policy": (
        "SELECT count(*) FROM serve.experiment_policy WHERE tenant_id = %(t)s"
    ),
    "serve.experiment_decision": (
        "SELECT count(*) FROM serve.experiment_decision WHERE tenant_id = %(t)s"
    ),
    "train.eval_result": (
        "SELECT count(*) FROM train.eval_result WHERE adapter_id = ANY (%(adapters)s)"
    ),
    "train.eval_request": "SELECT count(*) FROM train.eval_request WHERE tenant_id = %(t)s",
    "train.eval_suite": "SELECT count(*) FROM train.eval_suite WHERE tenant_id = %(t)s",
    "train.eval_case": "SELECT count(*) FROM train.eval_case WHERE suite_id = ANY (%(suites)s)",
    "train.promotion_policy": (
        "SELECT count(*) FROM train.promotion_policy WHERE route = %(route)s"
    ),
    "train.dataset_snapshot": "SELECT count(*) FROM train.dataset_snapshot WHERE tenant_id = %(t)s",
    "train.dataset_example": (
        "SELECT count(*) FROM train.dataset_example WHERE snapshot_id = ANY (%(snapshots)s)"
    ),
    "train.training_run": "SELECT count(*) FROM train.training_run WHERE tenant_id = %(t)s",
    "train.training_file": "SELECT count(*) FROM train.training_file WHERE tenant_id = %(t)s",
    "train.fine_tuning_job": "SELECT count(*) FROM train.fine_tuning_job WHERE tenant_id = %(t)s",
    "train.fine_tuning_event": (
        "SELECT count(*) FROM train.fine_tuning_event WHERE tenant_id = %(t)s"
    ),
    "loop.policy": "SELECT count(*) FROM loop.policy WHERE tenant_id = %(t)s",
    "loop.cycle": "SELECT count(*) FROM loop.cycle WHERE tenant_id = %(t)s",
    "loop.cycle_event": "SELECT count(*) FROM loop.cycle_event WHERE tenant_id = %(t)s",
}


def counts(conn: Any, world: dict[str, Any]) -> dict[str, int]:
    """The tenant's rows per table (COUNTS)."""
    params = {
        "t": world["tenant"]["id"],
        "adapters": world["adapters"],
        "suites": world["suites"],
        "snapshots": world["snapshots"],
        "route": world["route"]["name"],
    }
    out = {}
    for table, sql in COUNTS.items():
        row = conn.execute(sql, params).fetchone()
        out[table] = int(next(iter(row.values())) if isinstance(row, dict) else row[0])
    return out
