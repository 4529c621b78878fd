"""Fine-tuning jobs: each is a training run on a snapshot frozen from its files.

Creating a job, in the request's transaction: the model names a route (the serving slot the
adapter will be a candidate of), the files are checked line by line again and frozen into a
sealed snapshot (train.create_file_snapshot), "auto" settings are resolved by the loop's rule
(app/finetuning/hyperparameters.py) and the run is queued (app.training). Any error rolls all
of it back. The job's status, error and progress are its run's; its events are written by
train.fine_tuning_run_event as the run changes; its one checkpoint is the trained adapter,
which answers to the job's model name on /v1/chat/completions (app/gateway/finetuned.py).
"""

from __future__ import annotations

import secrets
import string
import time
from typing import Any

from psycopg.types.json import Jsonb

from app.core.db import Connection
from app.core.errors import BadRequest, Conflict, NotFound
from app.finetuning import files, hyperparameters, jsonl
from app.finetuning.schemas import (
    CheckpointMetrics,
    DpoJobHyperparameters,
    DpoMethodOut,
    FineTuningJob,
    JobCheckpoint,
    JobCheckpointList,
    JobCreate,
    JobError,
    JobEvent,
    JobEventList,
    JobHyperparameters,
    JobList,
    MethodOut,
    SupervisedMethodOut,
)
from app.training import service as training
from app.training.methods import Hyperparameters
from app.training.schemas import TrainingRunCreate

# The training method of each job method.
RUN_METHOD = {"supervised": "sft", "dpo": "dpo"}
_SHORT = string.ascii_lowercase + string.digits
_FINISHED = ("succeeded", "failed", "cancelled")
_JOB = (
    "SELECT j.*, t.name AS organization, r.status, r.error, r.progress, r.finished_at,"
    " r.started_at FROM train.fine_tuning_job j"
    " JOIN train.training_run r ON r.id = j.training_run_id"
    " JOIN tenant t ON t.id = j.tenant_id"
)


def resolve_model(conn: Connection, *, tenant_id: int, model: str) -> dict[str, Any]:
    """The tenant's route a job's `model` names: a route, or the base model of exactly one."""
    if model.startswith("ft:"):
        raise BadRequest(
            f"model {model!r} is a fine-tuned model: cft trains from a base; name the route"
            " it serves (or that route's base model)",
            code="model_not_supported",
            param="model",
        )
    routes = conn.execute(
        "SELECT name, base_model FROM serve.route WHERE tenant_id = %s ORDER BY name",
        (tenant_id,),
    ).fetchall()
    named = [r for r in routes if r["name"] == model] or [
        r for r in routes if r["base_model"] == model
    ]
    if len(named) == 1:
        return dict(named[0])
    if named:
        raise BadRequest(
            f"base model {model!r} serves {len(named)} of your routes"
            f" ({', '.join(r['name'] for r in named)}): name the route in model",
            code="model_ambiguous",
            param="model",
        )
    known = ", ".join(r["name"] for r in routes) or "none yet: create one with POST /v1/routes"
    raise NotFound(
        f"model {model!r} does not exist: name one of your routes ({known}) or its base model",
        code="model_not_found",
        param="model",
    )


def _examples(conn: Connection, file_id: str, param: str, fmt: str | None) -> jsonl.ParsedFile:
    row = files.get(conn, file_id=file_id)
    if row is None:
        raise BadRequest(
            f"{param} {file_id!r} is not one of your files: upload it with POST /v1/files",
            code="file_not_found",
            param=param,
        )
    parsed = jsonl.parse(bytes(row["content"]), param=param, name=f"{param} {file_id}")
    if fmt is not None and parsed.format != fmt:
        raise BadRequest(
            f"{param} {file_id} holds {parsed.format} examples; this job's method trains on"
            f" {fmt} examples ({jsonl.METHOD_OF[fmt]} jobs)",
            code="invalid_file_format",
            param=param,
        )
    return parsed


def create(conn: Connection, *, tenant_id: int, body: JobCreate, actor: str) -> FineTuningJob:
    """Check the request and files, freeze the snapshot, queue the run, record the job."""
    route = resolve_model(conn, tenant_id=tenant_id, model=body.model)
    kind = body.method_type
    fmt = "chat" if kind == "supervised" else "preference"
    train = _examples(conn, body.training_file, "training_file", fmt)
    valid = (
        _examples(conn, body.validation_file, "validation_file", fmt)
        if body.validation_file is not None
        else None
    )
    method = RUN_METHOD[kind]
    job_id = files.new_id("ftjob")
    snap = conn.execute(
        "SELECT * FROM train.create_file_snapshot(%s, %s, %s, %s, %s, %s, %s)",
        (
            tenant_id,
            route["name"],
            method,
            Jsonb(train.examples),
            Jsonb(valid.examples if valid else []),
            Jsonb(
                {
                    "fine_tuning_job": job_id,
                    "training_file": body.training_file,
                    "validation_file": body.validation_file,
                }
            ),
            actor,
        ),
    ).fetchone()
    assert snap is not None
    seed = body.seed if body.seed is not None else secrets.randbelow(2**31)
    where = f"method.{kind}.hyperparameters" if body.method else "hyperparameters"
    hp, shown = hyperparameters.resolve(
        method, int(snap["n_train"]), body.given_hyperparameters(), seed=seed, where=where
    )
    run = training.enqueue(
        conn,
        tenant_id=tenant_id,
        body=TrainingRunCreate(
            route=route["name"],
            method=method,  # type: ignore[arg-type]
            snapshot_id=snap["id"],
            hyperparameters=Hyperparameters(**hp),
        ),
        actor=actor,
    )
    tenant = conn.execute("SELECT name FROM tenant WHERE id = %s", (tenant_id,)).fetchone()
    assert tenant is not None
    short = "".join(secrets.choice(_SHORT) for _ in range(8))
    name = f"ft:{route['base_model']}:{tenant['name']}:{body.suffix or ''}:{short}"
    conn.execute(
        "INSERT INTO train.fine_tuning_job (id, tenant_id, training_run_id, model, route, method,"
        " training_file, validation_file, suffix, seed, hyperparameters, fine_tuned_model,"
        " metadata) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            job_id,
            tenant_id,
            run.id,
            body.model,
            route["name"],
            kind,
            body.training_file,
            body.validation_file,
            body.suffix,
            seed,
            Jsonb(shown),
            name,
            Jsonb(body.metadata) if body.metadata is not None else None,
        ),
    )
    counts = snap["counts"]
    left_out = (counts["train_examples"] - counts["train_kept"]) + (
        counts["eval_examples"] - counts["eval_kept"]
    )
    validated = (
        f"Validated files: {snap['n_train']} training and {snap['n_eval']} validation examples"
    )
    if left_out:
        validated += f" ({left_out} repeated examples left out)"
    conn.execute(
        "INSERT INTO train.fine_tuning_event (tenant_id, job_id, level, type, message, data)"
        " VALUES (%s, %s, 'info', 'message', %s, NULL), (%s, %s, 'info', 'message', %s, %s)",
        (
            tenant_id,
            job_id,
            f"Created fine-tuning job: {job_id}",
            tenant_id,
            job_id,
            validated,
            Jsonb(
                {
                    "snapshot_id": str(snap["id"]),
                    "training_run_id": str(run.id),
                    "route": route["name"],
                    "n_train": snap["n_train"],
                    "n_eval": snap["n_eval"],
                }
            ),
        ),
    )
    return get_or_raise(conn, job_id=job_id)


def _ts(value: Any) -> int | None:
    return int(value.timestamp()) if value is not None else None


def _out(row: dict[str, Any]) -> FineTuningJob:
    status = row["status"]
    progress = row["progress"] or {}
    metrics = progress.get("metrics") or {}
    shown = row["hyperparameters"]
    common = {k: shown.get(k) for k in ("batch_size", "learning_rate_multiplier", "n_epochs")}
    if row["method"] == "dpo":
        method = MethodOut(
            type="dpo",
            dpo=DpoMethodOut(hyperparameters=DpoJobHyperparameters(**common, beta=shown["beta"])),
        )
    else:
        method = MethodOut(
            type="supervised",
            supervised=SupervisedMethodOut(hyperparameters=JobHyperparameters(**common)),
        )
    eta = progress.get("eta_s")
    return FineTuningJob(
        id=row["id"],
        created_at=int(row["created_at"].timestamp()),
        error=(
            JobError(code="training_failed", message=row["error"] or "the training run failed")
            if status == "failed"
            else None
        ),
        fine_tuned_model=row["fine_tuned_model"] if status == "succeeded" else None,
        finished_at=_ts(row["finished_at"]) if status in _FINISHED else None,
        hyperparameters=JobHyperparameters(**common),
        model=row["model"],
        organization_id=row["organization"],
        result_files=[],
        seed=row["seed"],
        status=status,
        trained_tokens=(metrics.get("train_tokens") or None) if status == "succeeded" else None,
        training_file=row["training_file"],
        validation_file=row["validation_file"],
        estimated_finish=int(time.time() + eta) if status == "running" and eta else None,
        integrations=[],
        metadata=row["metadata"],
        method=method,
    )


def get(conn: Connection, *, job_id: str) -> dict[str, Any] | None:
    """One job of the tenant joined with its run, or None."""
    row: dict[str, Any] | None = conn.execute(f"{_JOB} WHERE j.id = %s", (job_id,)).fetchone()
    return row


def _row_or_raise(conn: Connection, job_id: str) -> dict[str, Any]:
    row = get(conn, job_id=job_id)
    if row is None:
        raise NotFound(f"no fine-tuning job {job_id!r}", code="fine_tuning_job_not_found")
    return row


def get_or_raise(conn: Connection, *, job_id: str) -> FineTuningJob:
    """One job (404 if absent)."""
    return _out(_row_or_raise(conn, job_id))


def list_jobs(
    conn: Connection, *, limit: int, after: str | None, metadata: dict[str, str]
) -> JobList:
    """The tenant's jobs, newest first; after: the last id of the previous page."""
    rows = conn.execute(
        f"{_JOB} WHERE (%(after)s::text IS NULL OR (j.created_at, j.id) <"
        " (SELECT a.created_at, a.id FROM train.fine_tuning_job a WHERE a.id = %(after)s))"
        " AND (%(meta)s::jsonb = '{}' OR j.metadata @> %(meta)s::jsonb)"
        " ORDER BY j.created_at DESC, j.id DESC LIMIT %(n)s",
        {"after": after, "meta": Jsonb(metadata), "n": limit + 1},
    ).fetchall()
    return JobList(data=[_out(r) for r in rows[:limit]], has_more=len(rows) > limit)


def cancel(conn: Connection, *, job_id: str) -> FineTuningJob:
    """Cancel a queued job now, a running one at its trainer's next step (409 when finished)."""
    row = _row_or_raise(conn, job_id)
    if row["status"] in _FINISHED:
        raise Conflict(
            f"fine-tuning job {job_id} already {row['status']}: there is nothing to cancel",
            code="fine_tuning_job_finished",
        )
    training.cancel(conn, run_id=row["training_run_id"])
    return get_or_raise(conn, job_id=job_id)


def _cursor(after: str | None, prefix: str) -> int | None:
    if after is None:
        return None
    number = after.removeprefix(prefix)
    if not after.startswith(prefix) or not number.isdigit() or len(number) > 18:
        raise BadRequest(
            f"after {after!r} is not an id this list returned ({prefix}<number>)", param="after"
        )
    return int(number)


def events(conn: Connection, *, job_id: str, limit: int, after: str | None) -> JobEventList:
    """A job's events, newest first; after: the last id of the previous page."""
    _row_or_raise(conn, job_id)
    before = _cursor(after, "ftevent-")
    rows = conn.execute(
        "SELECT * FROM train.fine_tuning_event WHERE job_id = %(job)s"
        " AND (%(before)s::bigint IS NULL OR id < %(before)s)"
        " ORDER BY id DESC LIMIT %(n)s",
        {"job": job_id, "before": before, "n": limit + 1},
    ).fetchall()
    data = [
        JobEvent(
            id=f"ftevent-{r['id']}",
            created_at=int(r["created_at"].timestamp()),
            level=r["level"],
            message=r["message"],
            data=r["data"],
            type=r["type"],
        )
        for r in rows[:limit]
    ]
    return JobEventList(data=data, has_more=len(rows) > limit)


def checkpoints(
    conn: Connection, *, job_id: str, limit: int, after: str | None
) -> JobCheckpointList:
    """A job's checkpoints: the trained adapter, once the job succeeded."""
    row = _row_or_raise(conn, job_id)
    data: list[JobCheckpoint] = []
    if row["status"] == "succeeded" and after is None:
        m = (row["progress"] or {}).get("metrics") or {}
        steps = int(m.get("steps") or (row["progress"] or {}).get("step") or 0)
        data.append(
            JobCheckpoint(
                id="ftckpt-" + job_id.removeprefix("ftjob-"),
                created_at=int(row["finished_at"].timestamp()),
                fine_tuned_model_checkpoint=row["fine_tuned_model"],
                fine_tuning_job_id=job_id,
                metrics=CheckpointMetrics(
                    step=float(steps),
                    train_loss=m.get("loss_last", m.get("train_loss")),
                    valid_loss=m.get("eval_loss"),
                    full_valid_loss=m.get("eval_loss"),
                ),
                step_number=steps,
            )
        )
    data = data[:limit]
    return JobCheckpointList(
        data=data,
        has_more=False,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )
