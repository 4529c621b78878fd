"""Verified adapter copies in the serving directory, where every engine reads them.

An artefact is fetched once into CFT_SERVING_DIR/<adapter id>, its sha256 checked against the
registry (a mismatch is never staged), and its adapter_config.json made to name its base as
the engines serve it (base_model_name_or_path = serve.adapter.base_model, which vLLM's
filesystem resolver requires).

A staged copy is checked again before each load, by its files' fingerprints (device, inode,
size, mtime and ctime, as when it was verified): a write to a file, or a file replaced, changes
its ctime, which user space cannot set back (a write within the same tick of the filesystem's
clock as the staging is the exception, as for any timestamp check: only cft may write the
serving directory), and a copy that changed is hashed again (fetched again when its sha256 no
longer matches). An artefact is fetched and hashed once for all its adapters (the same URI
and sha256, on the same base): an engine that loads by path is given the verified copy of
another adapter of it (source()), and a copy of its own (prepare(): a kind that reads
CFT_SERVING_DIR/<adapter id> itself) is copied from that verified copy when it did not change
before or during the copy.
"""

from __future__ import annotations

import logging
import os
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


# A staged file as it was verified or written: (device, inode, size, mtime, ctime in ns).
Fingerprint = tuple[int, int, int, int, int]


def fingerprint(path: Path) -> Fingerprint | None:
    """The file's fingerprint; None when it is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class Verified:
    """A staged copy as verified: the sha256 of its weights, its files' fingerprints."""

    sha256: str
    files: tuple[tuple[str, Fingerprint], ...]

    def intact(self, path: Path, sha256: str) -> bool:
        """Whether the copy at `path` is still the one verified for `sha256`."""
        return sha256.lower() == self.sha256 and all(
            fingerprint(path / name) == fp for name, fp in self.files
        )


class Stager:
    """Stages verified copies under one directory; one adapter at a time per id (the engines'
    load threads may ask for the same adapter together)."""

    def __init__(self, serving_dir: Path, settings: Settings):
        self.serving_dir = serving_dir
        self.settings = settings
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        # Per adapter id, its staged copy as verified; per (URI, sha256, base), the adapter
        # whose copy another of the same artefact is copied from.
        self._verified: dict[str, Verified] = {}
        self._by_artefact: dict[tuple[str, str, str], str] = {}
        self._stores: dict[str, artefacts.LocalStore | artefacts.S3Store] = {}

    def path(self, adapter_id: str) -> Path:
        """Where the adapter's copy is (or will be) staged."""
        return self.serving_dir / adapter_id

    def is_staged(self, adapter_id: str) -> bool:
        """Whether a copy is staged (not checked)."""
        return self.path(adapter_id).is_dir()

    def prepare(self, adapter: Desired) -> Path:
        """The verified artefact under serving_dir/<id> (fetched once, checked again each
        time), naming its base as the engines serve it. Raises artefacts.ArtefactMismatch or
        artefacts.ArtefactError."""
        with self._guard:
            lock = self._locks.setdefault(adapter.id, threading.Lock())
        with lock:
            return self._prepare(adapter)

    def source(self, adapter: Desired) -> Path:
        """A verified copy of the adapter's artefact for an engine that loads it by path: its
        own staged copy, or that of another adapter of the same artefact, when unchanged since
        verified; else its own, staged now (prepare())."""
        known = self._verified.get(adapter.id)
        if known is not None and known.intact(self.path(adapter.id), adapter.sha256):
            return self.path(adapter.id)
        sibling = self._by_artefact.get(_artefact(adapter))
        if sibling is not None and sibling != adapter.id:
            known = self._verified.get(sibling)
            if known is not None and known.intact(self.path(sibling), adapter.sha256):
                return self.path(sibling)
        return self.prepare(adapter)

    def _prepare(self, adapter: Desired) -> Path:
        dest = self.path(adapter.id)
        known = self._verified.get(adapter.id)
        if known is not None and known.intact(dest, adapter.sha256):
            return dest
        self._verified.pop(adapter.id, None)
        if dest.is_dir():
            try:
                artefacts.verify(dest, adapter.sha256)
                _stage_config(dest, adapter)
                self._remember(adapter, dest)
                return dest
            except artefacts.ArtefactError:
                log.warning("serving copy of %s changed on disk: fetching it again", adapter.id)
                shutil.rmtree(dest, ignore_errors=True)
        self.serving_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.serving_dir, prefix=f".{adapter.id}-"))
        try:
            if not self._copy_sibling(adapter, tmp):
                self._store(adapter.weights_uri).fetch(adapter.weights_uri, tmp)
                artefacts.verify(tmp, adapter.sha256)
                _stage_config(tmp, adapter, unseen=True)
            tmp.rename(dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        self._remember(adapter, dest)
        return dest

    def _copy_sibling(self, adapter: Desired, tmp: Path) -> bool:
        """Copy the staged copy of another adapter of the same artefact into tmp, when one
        is verified and unchanged before and after the copy (then what was copied is what
        was verified); False when there is none."""
        sibling = self._by_artefact.get(_artefact(adapter))
        if sibling is None or sibling == adapter.id:
            return False
        known = self._verified.get(sibling)
        src = self.path(sibling)
        if known is None or not known.intact(src, adapter.sha256):
            return False
        try:
            for name, _ in known.files:
                shutil.copyfile(src / name, tmp / name)
        except OSError:
            return False
        return known.intact(src, adapter.sha256)

    def _remember(self, adapter: Desired, dest: Path) -> None:
        """Note the copy at dest as verified for the adapter's sha256 (its files as now)."""
        files = []
        for entry in sorted(os.listdir(dest)):
            fp = fingerprint(dest / entry)
            if fp is not None and os.path.isfile(dest / entry):
                files.append((entry, fp))
        self._verified[adapter.id] = Verified(adapter.sha256.lower(), tuple(files))
        self._by_artefact[_artefact(adapter)] = adapter.id

    def _store(self, uri: str) -> artefacts.LocalStore | artefacts.S3Store:
        """The store that fetches uri (one per scheme, kept: an S3 client is costly to make)."""
        scheme = uri.split("://", 1)[0]
        store = self._stores.get(scheme)
        if store is None:
            store = artefacts.store_for_uri(uri, self.settings)
            self._stores[scheme] = store
        return store


def _artefact(adapter: Desired) -> tuple[str, str, str]:
    return (adapter.weights_uri, adapter.sha256.lower(), adapter.base_model)


def _stage_config(path: Path, adapter: Desired, *, unseen: bool = False) -> None:
    try:
        stage_config(path, adapter.base_model, unseen=unseen)
    except (OSError, ValueError) as exc:
        raise artefacts.ArtefactError(
            f"cannot stage {adapter.id}: its {CONFIG_FILE} is unreadable ({exc})"
        ) from exc
