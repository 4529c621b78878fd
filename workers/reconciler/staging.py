"""Verified adapter copies in the serving directory, where every engine reads them.

An artefact is fetched once into CFT_SERVING_DIR/<adapter id>, its sha256 checked against the
registry (a mismatch is never staged), and its adapter_config.json made to name its base as
the engines serve it (base_model_name_or_path = serve.adapter.base_model, which vLLM's
filesystem resolver requires). A staged copy is checked again before each load.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from app.core import artefacts
from app.core.config import Settings
from app.engines.vllm import CONFIG_FILE, stage_config

log = logging.getLogger("cft.reconciler")


@dataclass(frozen=True)
class Desired:
    """An adapter the fleet should serve: its artefact, base, and class in the hot set
    (app/engines/placement.py: CANARY, PROD or PREVIOUS)."""

    id: str
    route: str
    base_model: str
    weights_uri: str
    sha256: str
    rank: int


class Stager:
    """Stages verified copies under one directory; one adapter at a time per id (the engines'
    load threads may ask for the same adapter together)."""

    def __init__(self, serving_dir: Path, settings: Settings):
        self.serving_dir = serving_dir
        self.settings = settings
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def path(self, adapter_id: str) -> Path:
        """Where the adapter's copy is (or will be) staged."""
        return self.serving_dir / adapter_id

    def is_staged(self, adapter_id: str) -> bool:
        """Whether a copy is staged (not checked)."""
        return self.path(adapter_id).is_dir()

    def prepare(self, adapter: Desired) -> Path:
        """The verified artefact under serving_dir/<id> (fetched once, verified again each
        time), naming its base as the engines serve it. Raises artefacts.ArtefactMismatch or
        artefacts.ArtefactError."""
        with self._guard:
            lock = self._locks.setdefault(adapter.id, threading.Lock())
        with lock:
            return self._prepare(adapter)

    def _prepare(self, adapter: Desired) -> Path:
        dest = self.path(adapter.id)
        if dest.is_dir():
            try:
                artefacts.verify(dest, adapter.sha256)
                _stage_config(dest, adapter)
                return dest
            except artefacts.ArtefactError:
                log.warning("serving copy of %s changed on disk: fetching it again", adapter.id)
                shutil.rmtree(dest, ignore_errors=True)
        self.serving_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.serving_dir, prefix=f".{adapter.id}-"))
        try:
            artefacts.fetch_verified(adapter.weights_uri, adapter.sha256, tmp, self.settings)
            _stage_config(tmp, adapter)
            tmp.rename(dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return dest


def _stage_config(path: Path, adapter: Desired) -> None:
    try:
        stage_config(path, adapter.base_model)
    except (OSError, ValueError) as exc:
        raise artefacts.ArtefactError(
            f"cannot stage {adapter.id}: its {CONFIG_FILE} is unreadable ({exc})"
        ) from exc
