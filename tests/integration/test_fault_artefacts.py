"""Fault injection on the artefact store: a real training run whose store is read-only or full
fails with a readable error, and no candidate adapter is registered."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.core.artefacts import LocalStore
from tests.support.training import make_run, setup_route
from workers.trainer.worker import Worker, WorkerConfig


def _mount(*args: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.fixture(params=["read-only", "disk-full"])
def broken_store(request: Any, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A store root that refuses writes: (path, words the error must contain)."""
    root = tmp_path / "store"
    root.mkdir()
    mounted = False
    if request.param == "read-only":
        if os.geteuid() == 0:  # root ignores mode bits: a read-only filesystem instead
            mounted = _mount("-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(root))
            if not mounted:
                pytest.skip("running as root without mount: cannot make a read-only store")
            words = "permission denied"
        else:
            root.chmod(0o555)
            words = "permission denied"
    else:
        mounted = _mount("-t", "tmpfs", "-o", "size=16k", "tmpfs", str(root))
        if not mounted:
            pytest.skip("a full filesystem needs a tmpfs mount (root)")
        words = "disk is full"
    try:
        yield root, words
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(root)], check=False)
        else:
            root.chmod(0o755)


def test_store_failure_fails_the_run_readably_without_a_candidate(
    conn: Any, db_url: str, tmp_path: Path, models_dir: Path, broken_store: tuple[Path, str]
) -> None:
    root, words = broken_store
    _, _, snap = setup_route(conn)
    run = make_run(conn, snapshot=snap, max_attempts=1)
    cfg = WorkerConfig(
        db_url=db_url, models_dir=models_dir, store=LocalStore(root), worker_id="w-broken"
    )
    assert Worker(cfg).run_once() is True
    row = conn.execute(
        "SELECT status, error, adapter_id FROM train.training_run WHERE id = %s", (run["id"],)
    ).fetchone()
    assert row["status"] == "failed", row
    assert row["adapter_id"] is None
    assert "ArtefactError" in row["error"] and words in row["error"].lower(), row["error"]
    assert str(root) in row["error"]  # says where
    assert conn.execute("SELECT count(*) AS n FROM serve.adapter").fetchone()["n"] == 0
    # Nothing half-written is left in the store either.
    assert not [p for p in root.rglob("*") if p.is_file()]
