"""Past one device: run resource needs, claims by capacity, supervised workers, 2-rank gloo runs.

Real PostgreSQL, real HTTP, real worker processes (`cft worker train --devices …`), and a real
2-process `accelerate launch` (gloo on the CPU) of the bundled SmolLM2-135M in NF4.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from app.core.artefacts import LocalStore
from app.core.auth import create_key
from app.main import create_app
from tests.support.servers import serve_app
from tests.support.training import examples, make_run, make_snapshot, setup_route
from workers.trainer.devices import Capacity
from workers.trainer.worker import Worker, WorkerConfig, claim

ROOT = Path(__file__).resolve().parents[2]
CFT = [sys.executable, "-m", "cft.cli"]
TINY = {
    "max_steps": 2,
    "max_length": 64,
    "batch_size": 2,
    "grad_accum": 1,
    "learning_rate": 3e-3,
    "warmup": 0.0,
}


def _run(conn: Any, run_id: Any) -> dict[str, Any]:
    row: dict[str, Any] = conn.execute(
        "SELECT * FROM train.training_run WHERE id = %s", (run_id,)
    ).fetchone()
    return row


def _cap(kind: str, gpus: int, memory: float | None = None) -> Capacity:
    return Capacity(kind, gpus, memory, "+".join([kind] * gpus), "host-a")


BAD_NEEDS = [
    ({"gpus": 0}, "gpus"),
    ({"gpus": 65}, "gpus"),
    ({"device_kind": "tpu"}, "device_kind"),
    ({"min_gpu_memory_gb": -1}, "min_gpu_memory_gb"),
    ({"device_kind": "cpu", "min_gpu_memory_gb": 16}, "device_kind cpu has no GPU memory"),
    ({"hyperparameters": {"distributed_strategy": "ddp"}}, "set gpus to 2 or more"),
    (
        {"gpus": 2, "device_kind": "cpu", "hyperparameters": {"distributed_strategy": "fsdp"}},
        "on cpu use ddp",
    ),
    ({"gpus": 2, "hyperparameters": {"distributed_strategy": "zero3"}}, "distributed_strategy"),
]


def test_resource_needs_are_validated(conn, db_url) -> None:  # type: ignore[no-untyped-def]
    tenant, route, snap = setup_route(conn)
    key = create_key(conn, tenant_id=tenant["id"], role="trainer")
    body = {"route": route["name"], "method": "sft", "snapshot_id": str(snap["id"])}
    with serve_app(create_app(db_url=db_url)) as api:
        for patch, needle in BAD_NEEDS:
            r = httpx.post(
                f"{api}/v1/training-runs",
                json=body | patch,
                headers={"Authorization": f"Bearer {key}"},
            )
            assert r.status_code == 422, (patch, r.text)
            err = r.json()["error"]
            assert needle in err["message"] and {"type", "code"} <= set(err), (patch, err)
    assert conn.execute("SELECT count(*) AS n FROM train.training_run").fetchone()["n"] == 0


def test_resource_needs_over_http_and_claims_by_capacity(conn, db_url) -> None:  # type: ignore[no-untyped-def]
    tenant, route, snap = setup_route(conn)
    key = create_key(conn, tenant_id=tenant["id"], role="trainer")
    h = {"Authorization": f"Bearer {key}"}
    base = {"route": route["name"], "method": "sft", "snapshot_id": str(snap["id"])}
    with serve_app(create_app(db_url=db_url)) as api:
        big = httpx.post(
            f"{api}/v1/training-runs",
            json=base
            | {"gpus": 2, "min_gpu_memory_gb": 40, "device_kind": "cuda", "priority": 5}
            | {"hyperparameters": {"distributed_strategy": "fsdp"}},
            headers=h,
        )
        assert big.status_code == 201, big.text
        run = big.json()
        assert (run["gpus"], run["min_gpu_memory_gb"], run["device_kind"]) == (2, 40, "cuda")
        assert run["hyperparameters"]["distributed_strategy"] == "fsdp"
        assert run["host"] is None and run["devices"] is None
        plain = httpx.post(f"{api}/v1/training-runs", json=base, headers=h).json()
        assert (plain["gpus"], plain["min_gpu_memory_gb"], plain["device_kind"]) == (1, None, None)
    mid = make_run(conn, snapshot=snap, gpus=1, min_gpu_memory_gb=16, device_kind="cuda")

    # Nobody has polled yet: the queue says so.
    waits = {r["id"]: r for r in conn.execute("SELECT * FROM train.training_run_wait")}
    assert waits[mid["id"]]["reason"] == "no live trainer worker"

    # A 1-device CPU worker takes only the plain run; the cuda runs wait with their reason.
    got = claim(conn, "cpu-1", 60, _cap("cpu", 1))
    assert got is not None and str(got["id"]) == plain["id"]
    assert (got["host"], got["devices"]) == ("host-a", "cpu")
    assert claim(conn, "cpu-1", 60, _cap("cpu", 1)) is None
    waits = {str(r["id"]): r for r in conn.execute("SELECT * FROM train.training_run_wait")}
    assert waits[run["id"]]["reason"] == "needs device_kind cuda; the live workers have cpu"
    # One 24 GB GPU: too small for the 16 GB run? No, enough; the 2-GPU run still waits.
    assert claim(conn, "gpu-1", 60, _cap("cuda", 1, 24.0))["id"] == mid["id"]
    reason = conn.execute(
        "SELECT reason FROM train.training_run_wait WHERE id = %s", (run["id"],)
    ).fetchone()["reason"]
    assert reason == "needs 2 devices in one worker; the largest live worker of kind cuda holds 1"
    # Two GPUs of 24 GB: enough devices, too little memory.
    assert claim(conn, "gpu-2s", 60, _cap("cuda", 2, 24.0)) is None
    reason = conn.execute(
        "SELECT reason FROM train.training_run_wait WHERE id = %s", (run["id"],)
    ).fetchone()["reason"]
    assert reason.startswith("needs 40 GB per GPU on 2 devices") and "is 24 GB" in reason
    # Two GPUs of 80 GB: claimed, with where it runs.
    got = claim(conn, "gpu-2", 60, Capacity("cuda", 2, 79.2, "0,1", "host-b"))
    assert str(got["id"]) == run["id"] and (got["host"], got["devices"]) == ("host-b", "0,1")
    assert conn.execute("SELECT count(*) AS n FROM train.training_run_wait").fetchone()["n"] == 0
    workers = {
        r["worker_id"]: r
        for r in conn.execute("SELECT * FROM train.training_worker ORDER BY worker_id")
    }
    assert set(workers) == {"cpu-1", "gpu-1", "gpu-2s", "gpu-2"}
    assert (workers["gpu-2"]["gpus"], workers["gpu-2"]["gpu_memory_gb"]) == (2, 79.2)
    # A worker that says nothing about itself (the two-argument call) takes 1-device runs only.
    other = make_run(conn, snapshot=snap, gpus=2)
    plain2 = make_run(conn, snapshot=snap)
    assert claim(conn, "legacy", 60)["id"] == plain2["id"]
    assert claim(conn, "legacy", 60) is None
    assert _run(conn, other["id"])["status"] == "queued"


def _home(tmp_path: Path, models_dir: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(models_dir)  # the session's converted base
    return home


@pytest.mark.slow
def test_supervised_workers_drain_a_mixed_queue_with_a_2_rank_run(  # type: ignore[no-untyped-def]
    conn, db_url, tmp_path, models_dir
) -> None:
    """`--devices cpu,cpu+cpu`: a 1-slot and a 2-slot worker drain a queue of mixed needs.

    The 2-rank run trains over gloo (the only training here: CI's 2 cores); the 1-device run is
    a DPO run on SFT examples, which the 1-slot worker claims and fails at once (its data check);
    the run needing 3 devices and the one needing CUDA wait, each with its reason.
    """
    tenant, route, _ = setup_route(conn)
    snap = make_snapshot(
        conn, tenant_id=tenant["id"], route=route["name"], method="sft", train=examples("sft", 8)
    )
    misfit = make_run(conn, snapshot=snap, method="dpo", max_attempts=1)
    dist = make_run(conn, snapshot=snap, params=TINY, gpus=2, device_kind="cpu", max_attempts=1)
    huge = make_run(conn, snapshot=snap, gpus=3)
    gpu = make_run(conn, snapshot=snap, device_kind="cuda", priority=5)
    env = os.environ | {
        "CFT_DATABASE_URL": db_url,
        "CFT_HOME": str(_home(tmp_path, models_dir)),
        "CFT_ARTEFACT_DIR": str(tmp_path / "store"),
    }
    log_path = tmp_path / "workers.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [*CFT, "worker", "train", "--devices", "cpu,cpu+cpu", "--poll", "0.5", "--lease", "60"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 240
            while (_run(conn, dist["id"])["status"], _run(conn, misfit["id"])["status"]) != (
                "succeeded",
                "failed",
            ):
                assert _run(conn, dist["id"])["status"] != "failed", _run(conn, dist["id"])
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.5)
            waits = {
                r["id"]: r["reason"]
                for r in conn.execute("SELECT id, reason FROM train.training_run_wait")
            }
            assert waits == {
                huge["id"]: "needs 3 devices in one worker; the largest live worker holds 2",
                gpu["id"]: "needs device_kind cuda; the live workers have cpu",
            }
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=60)
    logs = log_path.read_text()
    assert rc == 0, logs[-3000:]
    host = socket.gethostname()
    one, two = _run(conn, misfit["id"]), _run(conn, dist["id"])
    assert (one["host"], one["devices"]) == (host, "cpu")
    assert "lacks prompt, chosen, rejected for method dpo" in one["error"]
    assert (two["host"], two["devices"]) == (host, "cpu+cpu")
    assert one["worker_id"] != two["worker_id"]
    workers = conn.execute(
        "SELECT devices, gpus, device_kind FROM train.training_worker ORDER BY gpus"
    ).fetchall()
    assert [tuple(w.values()) for w in workers] == [("cpu", 1, "cpu"), ("cpu+cpu", 2, "cpu")]
    # Rank 0 wrote the artefact, the worker registered one candidate, the manifest says 2 ranks.
    ads = conn.execute("SELECT * FROM serve.adapter").fetchall()
    assert len(ads) == 1 and ads[0]["status"] == "candidate"
    assert ads[0]["training_run_id"] == dist["id"] and two["adapter_id"] == ads[0]["id"]
    stored = Path(ads[0]["weights_uri"].removeprefix("file://"))
    manifest = json.loads((stored / "manifest.json").read_text())
    assert (manifest["world_size"], manifest["strategy"]) == (2, "ddp")
    assert manifest["files"]["adapter_model.safetensors"]["sha256"] == ads[0]["sha256"]
    assert manifest["training_run_id"] == str(dist["id"]) and manifest["method"] == "sft"
    metrics = manifest["metrics"]
    assert (metrics["world_size"], metrics["strategy"], metrics["steps"]) == (2, "ddp", 2)
    assert metrics["train_tokens"] > 0 and metrics["tokens_per_s"] > 0
    assert metrics["loss_last"] < metrics["loss_first"], metrics
    assert sorted(p.name for p in stored.iterdir()) == sorted(
        ["adapter_config.json", "adapter_model.safetensors", "manifest.json", "README.md"]
    )
    assert two["progress"]["step"] == 2 and len(two["progress"]["loss_history"]) == 2
    _assert_adapter_loads(models_dir, stored)


def _assert_adapter_loads(models_dir: Path, adapter: Path) -> None:
    import torch
    from peft import PeftModel

    from workers import base_model as bm

    model = PeftModel.from_pretrained(bm.load_model(bm.BUNDLED, models_dir), str(adapter))
    tok = bm.load_tokenizer(bm.BUNDLED, models_dir)
    ids = tok("What is 3 plus 3?", return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits
    assert torch.isfinite(logits).all()


def _rank_pids(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if "workers.trainer.distributed" in cmd and marker in cmd:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return [p for p in found if "accelerate" not in " ".join(p.cmdline())]


@pytest.mark.slow
def test_a_crashed_rank_fails_the_run_readably(conn, db_url, tmp_path, models_dir) -> None:  # type: ignore[no-untyped-def]
    _, _, snap = setup_route(conn)
    run = make_run(conn, snapshot=snap, params=TINY, gpus=2, max_attempts=1)
    work = tmp_path / "work"
    work.mkdir()
    cfg = WorkerConfig(
        db_url=db_url,
        models_dir=models_dir,
        store=LocalStore(tmp_path / "store"),
        worker_id="w-crash",
        work_dir=work,
        capacity=_cap("cpu", 2),
    )
    t = threading.Thread(target=Worker(cfg).run_once)
    t.start()
    deadline = time.monotonic() + 60
    ranks: list[psutil.Process] = []
    while len(ranks) < 2:
        assert time.monotonic() < deadline and t.is_alive(), "the ranks never started"
        time.sleep(0.2)
        ranks = _rank_pids(str(work))
    victim = next(p for p in ranks if p.environ().get("RANK") == "1")
    victim.send_signal(signal.SIGKILL)
    t.join(timeout=60)
    assert not t.is_alive()
    row = _run(conn, run["id"])
    assert row["status"] == "failed", row
    assert "distributed training failed (accelerate launch, 2 ranks, ddp" in row["error"]
    assert "rank 1 exited with code -9" in row["error"], row["error"]
    assert conn.execute("SELECT count(*) AS n FROM serve.adapter").fetchone()["n"] == 0
    assert not [p for p in _rank_pids(str(work)) if p.is_running()]


def test_cli_queues_a_run_with_its_needs(conn, db_url, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from app.core.config import get_settings
    from cft import cli

    tenant, route, snap = setup_route(conn)
    monkeypatch.setenv("CFT_DATABASE_URL", db_url)
    get_settings.cache_clear()
    try:
        base = ["training-run", "create", "--tenant", tenant["name"], "--route", route["name"]]
        base += ["--method", "sft", "--snapshot-id", str(snap["id"])]
        assert cli.main([*base, "--gpus", "0"]) == 2
        assert "gpus: Input should be greater than or equal to 1" in capsys.readouterr().err
        assert cli.main([*base, "--gpus", "2", "--device-kind", "cpu", "--hp", "rank=4"]) == 0
        run = json.loads(capsys.readouterr().out)
        assert (run["gpus"], run["device_kind"], run["hyperparameters"]["rank"]) == (2, "cpu", 4)
        assert cli.main(["training-run", "waits"]) == 0
        wait = json.loads(capsys.readouterr().out)
        assert wait["id"] == run["id"] and wait["reason"] == "no live trainer worker"
    finally:
        get_settings.cache_clear()
