"""The reconciler's verified copies: hashed once, checked by fingerprint before each load,
hashed and fetched again when they changed; an artefact fetched once for all its adapters."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core import artefacts
from app.core.artefacts import WEIGHTS_FILE, LocalStore
from app.core.config import get_settings
from tests.support.engines import write_adapter
from workers.reconciler.staging import Desired, Stager

BASE = "smollm2-135m-instruct"


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    store = LocalStore(tmp_path / "store")
    stored = store.put_dir(write_adapter(tmp_path / "src", rank=4, layers=1), "r", "v1")
    settings = get_settings().model_copy(update={"artefact_dir": tmp_path / "store"})
    calls = {"verify": 0, "fetch": 0}
    verify, fetch = artefacts.verify, LocalStore.fetch

    def counted_verify(path: Path, sha256: str) -> Path:
        calls["verify"] += 1
        return verify(path, sha256)

    def counted_fetch(self: LocalStore, uri: str, dest: Path) -> Path:
        calls["fetch"] += 1
        return fetch(self, uri, dest)

    monkeypatch.setattr(artefacts, "verify", counted_verify)
    monkeypatch.setattr(LocalStore, "fetch", counted_fetch)
    return {
        "stager": Stager(tmp_path / "serving", settings),
        "uri": stored.uri,
        "sha": stored.sha256,
        "calls": calls,
    }


def desired(world: dict[str, object], adapter_id: str, **over: str) -> Desired:
    fields = {"weights_uri": str(world["uri"]), "sha256": str(world["sha"]), "base_model": BASE}
    return Desired(id=adapter_id, route="r", rank=1, **(fields | over))


def test_a_copy_is_hashed_once_and_again_when_it_changed(world: dict[str, object]) -> None:
    stager, calls = world["stager"], world["calls"]
    assert isinstance(stager, Stager) and isinstance(calls, dict)
    a = desired(world, "a")
    path = stager.prepare(a)
    assert calls == {"verify": 1, "fetch": 1}
    assert stager.prepare(a) == path and stager.source(a) == path
    assert calls == {"verify": 1, "fetch": 1}  # unchanged: its fingerprints say so
    # Changed on disk (same size): hashed again, refused, fetched and hashed again.
    weights = path / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert stager.source(a) == path
    assert calls == {"verify": 3, "fetch": 2}
    assert artefacts.sha256_file(weights) == world["sha"]


def test_an_artefact_is_fetched_once_for_all_its_adapters(world: dict[str, object]) -> None:
    stager, calls = world["stager"], world["calls"]
    assert isinstance(stager, Stager) and isinstance(calls, dict)
    first = stager.prepare(desired(world, "a"))
    # Another adapter of the same artefact and base, loaded by path: the verified copy.
    assert stager.source(desired(world, "b")) == first
    assert calls == {"verify": 1, "fetch": 1}
    # One that needs a copy of its own: copied from the verified copy, not fetched or hashed.
    own = stager.prepare(desired(world, "c"))
    assert own == stager.path("c") and (own / WEIGHTS_FILE).is_file()
    assert calls == {"verify": 1, "fetch": 1}
    # Another base: a copy of its own that names it (fetched, hashed).
    assert stager.source(desired(world, "d", base_model="another")) == stager.path("d")
    assert calls == {"verify": 2, "fetch": 2}
    # The first copy changed: no adapter is given it; b gets a verified copy of its own.
    (first / WEIGHTS_FILE).write_bytes(b"tampered")
    assert stager.source(desired(world, "b")) in (stager.path("b"), stager.path("c"))
    assert artefacts.sha256_file(stager.source(desired(world, "b")) / WEIGHTS_FILE) == world["sha"]


def test_a_mismatch_is_never_staged(world: dict[str, object]) -> None:
    stager = world["stager"]
    assert isinstance(stager, Stager)
    wrong = desired(world, "x", sha256="0" * 64)
    with pytest.raises(artefacts.ArtefactMismatch):
        stager.source(wrong)
    assert not stager.is_staged("x")
    # A verified copy of the same URI does not stand in for another sha256.
    stager.prepare(desired(world, "a"))
    with pytest.raises(artefacts.ArtefactMismatch):
        stager.source(wrong)
