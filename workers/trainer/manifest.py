"""The manifest of a trained adapter: base, method, provenance, hyperparameters, metrics, files."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from app.core import artefacts
from app.training.methods import Hyperparameters


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
    try:
        return artefacts.write_manifest(
            out_dir,
            {
                "source": "trained",
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
                "chat_template_sha256": hashlib.sha256(
                    str(tokenizer.chat_template).encode()
                ).hexdigest(),
            },
        )
    except artefacts.ArtefactError as exc:
        raise RuntimeError(f"training finished but {exc}") from exc
