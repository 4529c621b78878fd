"""The manifest of a trained adapter: base, method, provenance, hyperparameters, metrics, files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from app.training.methods import Hyperparameters

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
MANIFEST = "manifest.json"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(
    out_dir: Path,
    *,
    base_name: str,
    revision: str,
    method: str,
    provenance: dict[str, Any] | None,
    requested: Hyperparameters,
    metrics: dict[str, Any],
    tokenizer: Any,
    world_size: int = 1,
    strategy: str = "single",
) -> dict[str, Any]:
    """Check the adapter files are there and write out_dir/manifest.json; returns the manifest."""
    for name in ADAPTER_FILES:
        if not (out_dir / name).exists():
            raise RuntimeError(f"training finished but {name} was not written to {out_dir}")
    manifest = {
        "format": "cft-adapter/1",
        "base_model": base_name,
        "base_revision": revision,
        "method": method,
        "snapshot_id": (provenance or {}).get("snapshot_id"),
        "set_hash": (provenance or {}).get("set_hash"),
        "training_run_id": (provenance or {}).get("training_run_id"),
        "hyperparameters": requested.model_dump(),
        "metrics": metrics,
        # How it was trained: one process ("single"), or world_size ranks under ddp / fsdp.
        "world_size": world_size,
        "strategy": strategy,
        "chat_template_sha256": hashlib.sha256(str(tokenizer.chat_template).encode()).hexdigest(),
        "files": {
            name: {
                "sha256": sha256_file(out_dir / name),
                "size_bytes": (out_dir / name).stat().st_size,
            }
            for name in ADAPTER_FILES
        },
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
