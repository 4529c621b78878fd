"""The training worker: claims runs from train.training_run, trains, stores, registers.

A worker holds a lease on the run it trains and renews it from a heartbeat thread, which also
writes live progress and learns of cancellation. If the worker dies, the lease expires and
another worker reclaims the run (bounded by max_attempts, in SQL). On success the adapter row
(status candidate) is inserted in the same transaction that marks the run succeeded; if the
run is no longer this worker's at that point, the transaction rolls back and no row is made.
Workers wake on NOTIFY cft_training and poll as a fallback.

A worker claims only runs its devices can serve (its `Capacity`, passed to the claim SQL). A run
with gpus > 1 is trained through `accelerate launch` on the worker's devices (`launch`); the
worker still does the storing and registering, so the artefact and the candidate come from one
process as for a single-device run.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from app.adapters import service as adapters
from app.core.artefacts import (
    ArtefactError,
    ArtefactExists,
    LocalStore,
    S3Store,
    StoredArtefact,
    describe,
)
from app.core.config import get_settings
from app.core.errors import NotFound
from app.engines import compat
from app.training.methods import Hyperparameters
from workers.trainer.base_cache import BaseCache
from workers.trainer.data import TrainingDataError
from workers.trainer.devices import Capacity, detect_capacity
from workers.trainer.launch import train_distributed
from workers.trainer.train import Progress, TrainingCancelled, TrainResult, train_adapter

log = logging.getLogger(__name__)

CHANNEL = "cft_training"


class LeaseLost(Exception):
    """The run was reclaimed by another worker (or finished) while this one trained it."""


@dataclass
class WorkerConfig:
    """How a worker behaves."""

    db_url: str
    models_dir: Path
    store: LocalStore | S3Store
    worker_id: str = ""
    lease_s: float = 120.0
    heartbeat_s: float = 0.0  # 0: a third of the lease
    poll_s: float = 5.0
    work_dir: Path | None = None
    # Where the NF4 base stays loaded between runs; None: the process-wide cache (base_cache.BASES).
    bases: BaseCache | None = None
    # The devices it serves runs on; None: detected (GPU 0, else the CPU).
    capacity: Capacity | None = None

    def __post_init__(self) -> None:
        if self.capacity is None:
            self.capacity = detect_capacity()
        if not self.worker_id:
            self.worker_id = (
                f"{socket.gethostname()}:{self.capacity.devices}:{os.getpid()}:"
                f"{uuid.uuid4().hex[:6]}"
            )
        if self.heartbeat_s <= 0:
            self.heartbeat_s = max(self.lease_s / 3, 0.2)


def _connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(
        url, autocommit=True, row_factory=dict_row, application_name="cft-trainer"
    )


def _interval(seconds: float) -> str:
    return f"{seconds} seconds"


def adapter_name(
    tenant_id: int, route: str, run_id: uuid.UUID, attempt: int, now: datetime | None = None
) -> str:
    """A new, never reused engine name (and artefact version):
    <route>-<yyyymmddHHMMSS>-t<tenant id>-<short run id>[-a<attempt>]. Route names are unique per
    tenant only: the tenant keeps two tenants' routes of one name from ever sharing an id."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d%H%M%S")
    name = f"{route}-{stamp}-t{tenant_id}-{run_id.hex[:8]}"
    return name if attempt <= 1 else f"{name}-a{attempt}"


class _Heartbeat(threading.Thread):
    """Renews the lease, flushes progress, and notices cancel or a lost lease."""

    def __init__(self, cfg: WorkerConfig, run_id: uuid.UUID) -> None:
        super().__init__(name=f"heartbeat-{run_id.hex[:8]}", daemon=True)
        self.cfg = cfg
        self.run_id = run_id
        self.progress: dict[str, Any] | None = None
        self.cancelled = False
        self.lost = False
        self.done = threading.Event()
        self.kick = threading.Event()
        self.error: str | None = None

    def update(self, progress: Progress) -> bool:
        """Progress from the trainer; True asks it to stop."""
        self.progress = progress.as_dict() | {"updated_at": datetime.now(UTC).isoformat()}
        self.kick.set()
        return self.cancelled or self.lost

    def beat(self, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute(
            "SELECT train.heartbeat_training_run(%s, %s, %s::interval, %s) AS cancel",
            (
                self.run_id,
                self.cfg.worker_id,
                _interval(self.cfg.lease_s),
                Jsonb(self.progress) if self.progress is not None else None,
            ),
        ).fetchone()
        cancel = row["cancel"] if row else None
        if cancel is None:
            self.lost = True
        elif cancel:
            self.cancelled = True

    def run(self) -> None:
        try:
            with _connect(self.cfg.db_url) as conn:
                while not self.done.is_set():
                    self.kick.wait(self.cfg.heartbeat_s)
                    self.kick.clear()
                    if self.done.is_set():
                        break
                    try:
                        self.beat(conn)
                    except psycopg.Error as exc:
                        # A missed beat is not fatal: the lease has slack until it expires.
                        log.warning("heartbeat of run %s failed: %s", self.run_id, exc)
                    if self.lost:
                        log.warning("run %s is no longer ours: stopping", self.run_id)
                        break
        except psycopg.Error as exc:
            self.error = str(exc)
            log.error("heartbeat connection for run %s failed: %s", self.run_id, exc)


def claim(
    conn: psycopg.Connection[Any],
    worker_id: str,
    lease_s: float,
    capacity: Capacity | None = None,
) -> dict[str, Any] | None:
    """Claim one runnable training run for worker_id that its capacity can serve, or None.

    Without a capacity the worker counts as one device of unknown kind and memory (it gets
    only runs that need one device and name no kind or memory).
    """
    if capacity is None:
        row: dict[str, Any] | None = conn.execute(
            "SELECT * FROM train.claim_training_run(%s, %s::interval)",
            (worker_id, _interval(lease_s)),
        ).fetchone()
        return row
    row = conn.execute(
        "SELECT * FROM train.claim_training_run(%s, %s::interval, %s::int, %s::real, %s, %s, %s)",
        (
            worker_id,
            _interval(lease_s),
            capacity.gpus,
            capacity.gpu_memory_gb,
            capacity.kind,
            capacity.host,
            capacity.devices,
        ),
    ).fetchone()
    return row


def export_snapshot(conn: psycopg.Connection[Any], snapshot_id: Any, dest: Path) -> dict[str, Any]:
    """Write a snapshot's examples to dest/train.jsonl and dest/eval.jsonl (stable order)."""
    snap = conn.execute(
        "SELECT id, tenant_id, route, method, set_hash, tainted_at FROM train.dataset_snapshot"
        " WHERE id = %s",
        (snapshot_id,),
    ).fetchone()
    if snap is None:
        raise TrainingDataError(f"dataset snapshot {snapshot_id} does not exist")
    if snap["tainted_at"] is not None:
        raise TrainingDataError(
            f"dataset snapshot {snapshot_id} is tainted (a user it holds was forgotten)"
        )
    dest.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split in ("train", "eval"):
        n = 0
        with (dest / f"{split}.jsonl").open("w") as f:
            cur = conn.execute(
                "SELECT example FROM train.dataset_example WHERE snapshot_id = %s AND split = %s"
                " ORDER BY example_hash",
                (snapshot_id, split),
            )
            for row in cur:
                f.write(json.dumps(row["example"], ensure_ascii=False) + "\n")
                n += 1
        counts[split] = n
    if counts["train"] == 0:
        raise TrainingDataError(f"dataset snapshot {snapshot_id} has no training examples")
    return dict(snap) | {"counts": counts}


class Worker:
    """One training worker process (one run at a time)."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.stop = threading.Event()

    def run_once(self) -> bool:
        """Claim and process at most one run; True when one was processed."""
        with _connect(self.cfg.db_url) as conn:
            run = claim(conn, self.cfg.worker_id, self.cfg.lease_s, self.cfg.capacity)
        if run is None:
            return False
        log.info(
            "worker %s claimed run %s (%s, route %s, gpus %s, attempt %s/%s)",
            self.cfg.worker_id,
            run["id"],
            run["method"],
            run["route"],
            run["gpus"],
            run["attempts"],
            run["max_attempts"],
        )
        self.process(run)
        return True

    def run_forever(self) -> None:
        """Process runs until stop is set: LISTEN for new ones, poll as a fallback."""
        listener = _connect(self.cfg.db_url)
        try:
            listener.execute(f"LISTEN {CHANNEL}")
            while not self.stop.is_set():
                while not self.stop.is_set() and self.run_once():
                    pass
                # Wakes on the first notification or after poll_s (the fallback).
                for _ in listener.notifies(timeout=self.cfg.poll_s, stop_after=1):
                    pass
        finally:
            listener.close()

    def process(self, run: dict[str, Any]) -> None:
        """Train one claimed run and record the outcome."""
        run_id: uuid.UUID = run["id"]
        hb = _Heartbeat(self.cfg, run_id)
        hb.start()
        work = Path(tempfile.mkdtemp(prefix=f"cft-run-{run_id.hex[:8]}-", dir=self.cfg.work_dir))
        try:
            self._train_and_register(run, hb, work)
        except LeaseLost as exc:
            log.warning("run %s: %s", run_id, exc)
        except TrainingCancelled as exc:
            self._fail(run_id, f"cancelled: {exc}", retry=False)
        except (TrainingDataError, ArtefactExists, ValueError) as exc:
            self._fail(run_id, f"{type(exc).__name__}: {exc}", retry=False)
        except Exception as exc:
            log.exception("run %s failed", run_id)
            self._fail(run_id, f"{type(exc).__name__}: {exc}", retry=True)
        finally:
            hb.done.set()
            hb.kick.set()
            hb.join(timeout=10)
            shutil.rmtree(work, ignore_errors=True)

    def _fail(self, run_id: uuid.UUID, error: str, *, retry: bool) -> None:
        with _connect(self.cfg.db_url) as conn:
            row = conn.execute(
                "SELECT train.fail_training_run(%s, %s, %s, %s) AS status",
                (run_id, self.cfg.worker_id, error[:4000], retry),
            ).fetchone()
        log.info("run %s: %s (%s)", run_id, row["status"] if row else "not ours", error)

    def _train_and_register(self, run: dict[str, Any], hb: _Heartbeat, work: Path) -> None:
        """Train a claimed run, store its adapter, and register it as the route's candidate."""
        hp = Hyperparameters(**(run["params"] or {}))
        snap = self._data(run, work / "data")
        result = self._train(run, hp, snap, hb, work)
        if hb.lost:
            raise LeaseLost("lease lost during training; not registering")
        if hb.cancelled:
            raise TrainingCancelled("cancel requested")
        name = adapter_name(run["tenant_id"], run["route"], run["id"], int(run["attempts"]))
        stored = self._store(result, run["route"], name)
        self._register(run, hp, name, stored, result, hb)
        log.info(
            "run %s succeeded: adapter %s at %s (sha256 %s)",
            run["id"],
            name,
            stored.uri,
            stored.sha256,
        )

    def _data(self, run: dict[str, Any], dest: Path) -> dict[str, Any]:
        """The run's snapshot written to dest (train.jsonl, eval.jsonl); its row."""
        if run["snapshot_id"] is None:
            raise TrainingDataError("the run has no dataset snapshot")
        with _connect(self.cfg.db_url) as conn:
            snap = export_snapshot(conn, run["snapshot_id"], dest)
        if snap["tenant_id"] != run["tenant_id"]:
            raise TrainingDataError("the snapshot belongs to another tenant")
        return snap

    def _train(
        self,
        run: dict[str, Any],
        hp: Hyperparameters,
        snap: dict[str, Any],
        hb: _Heartbeat,
        work: Path,
    ) -> TrainResult:
        """Train in this process, or on the worker's devices through accelerate (gpus > 1)."""
        data = work / "data"
        provenance = {
            "snapshot_id": str(run["snapshot_id"]),
            "set_hash": snap["set_hash"],
            "training_run_id": str(run["id"]),
        }
        if int(run["gpus"]) <= 1:
            return train_adapter(
                run["method"],
                data / "train.jsonl",
                data / "eval.jsonl",
                work / "adapter",
                base_model=run["base_model"],
                models_dir=self.cfg.models_dir,
                params=hp,
                progress_cb=hb.update,
                provenance=provenance,
                bases=self.cfg.bases,
            )
        cap = self.cfg.capacity
        assert cap is not None  # set in WorkerConfig.__post_init__
        return train_distributed(
            run["method"],
            data / "train.jsonl",
            data / "eval.jsonl",
            work / "adapter",
            base_model=run["base_model"],
            models_dir=self.cfg.models_dir,
            params=hp,
            world_size=int(run["gpus"]),
            kind=cap.kind,
            gpu_memory_gb=cap.gpu_memory_gb,
            work=work / "launch",
            progress_cb=hb.update,
            should_stop=lambda: hb.cancelled or hb.lost,
            provenance=provenance,
        )

    def _store(self, result: TrainResult, route: str, name: str) -> StoredArtefact:
        """Check the adapter every engine must load, then store it as route/name."""
        # Never register what the engines would refuse (NotLoadable: a ValueError, not retried).
        compat.check_or_raise(result.out_dir, max_lora_rank=get_settings().engine_max_lora_rank)
        sha, _ = describe(result.out_dir)
        if sha != result.manifest["files"]["adapter_model.safetensors"]["sha256"]:
            raise ArtefactError("adapter weights changed between training and upload")
        return self.cfg.store.put_dir(result.out_dir, route, name)

    def _register(
        self,
        run: dict[str, Any],
        hp: Hyperparameters,
        name: str,
        stored: StoredArtefact,
        result: TrainResult,
        hb: _Heartbeat,
    ) -> None:
        """The candidate row and the run's success in one transaction, or neither (LeaseLost:
        the run is no longer this worker's)."""
        progress = (hb.progress or {}) | {"metrics": result.metrics}
        with _connect(self.cfg.db_url) as conn, conn.transaction():
            try:
                adapters.register_candidate(
                    conn,
                    adapter_id=name,
                    tenant_id=run["tenant_id"],
                    route=run["route"],
                    base_model=run["base_model"],
                    base_revision=result.manifest["base_revision"],
                    rank=hp.rank,
                    alpha=hp.alpha,
                    target_modules=hp.target_modules,
                    method=run["method"],
                    training_run_id=run["id"],
                    dataset_snapshot_id=run["snapshot_id"],
                    weights_uri=stored.uri,
                    sha256=stored.sha256,
                    size_bytes=stored.size_bytes,
                    eval_summary={"train": result.metrics},
                )
            except NotFound as exc:
                raise TrainingDataError(str(exc)) from exc
            ok = conn.execute(
                "SELECT train.finish_training_run(%s, %s, %s, %s) AS ok",
                (run["id"], self.cfg.worker_id, name, Jsonb(progress)),
            ).fetchone()
            if not ok or not ok["ok"]:
                # Rolls back the adapter row: the run was reclaimed or cancelled meanwhile.
                raise LeaseLost(f"run {run['id']} is no longer ours; adapter {name} not registered")


def from_settings(**over: Any) -> WorkerConfig:
    """A worker configuration from CFT_* settings (database, models, artefact store)."""
    from app.core import artefacts
    from app.core.config import get_settings
    from app.core.db import database_url

    settings = get_settings()
    fields: dict[str, Any] = {
        "db_url": database_url(settings),
        "models_dir": settings.models_path,
        "store": artefacts.get_store(settings),
    } | over
    return WorkerConfig(**fields)
