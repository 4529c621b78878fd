"""sql/ as the state history's baseline left it, rebuilt from git (the baseline holds no SQL)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

from app.core import migrations
from app.core.sqlfiles import SQL_DIR

ROOT = SQL_DIR.parent


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


def baseline_commit() -> str | None:
    """The commit that added migrations/<BASELINE>; None while that file is not committed, or
    outside a git checkout while no migration follows the baseline (the state is sql/state/)."""
    path = f"migrations/{migrations.BASELINE}"
    try:
        commit = _git("log", "--diff-filter=A", "--format=%H", "-1", "--", path)
    except (OSError, subprocess.CalledProcessError) as exc:
        if migrations.migration_names()[1:]:
            raise RuntimeError(
                "the state history is rebuilt from git, and this tree is not a git checkout"
            ) from exc
        return None
    shallow = commit and _git("rev-parse", "--is-shallow-repository") == "true"
    if shallow and migrations.migration_names()[1:]:
        raise RuntimeError(
            "the state history is rebuilt from git, and this clone is shallow:"
            " fetch its history (git fetch --unshallow) to test the migrations"
        )
    return commit or None


def sql_at_baseline(dest: Path) -> Path:
    """A copy of sql/ whose state files are those of the baseline's commit."""
    commit = baseline_commit()
    if commit is None:  # The rebase itself, before its commit: the working tree is the baseline.
        return Path(shutil.copytree(SQL_DIR, dest / "sql"))
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "sql"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "sql"
