"""The artefact store: local directory and S3 (real moto server), immutable, sha256-verified."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from app.core.artefacts import (
    ArtefactError,
    ArtefactExists,
    ArtefactMismatch,
    LocalStore,
    S3Store,
    describe,
    verify,
)
from tests.support.servers import free_port


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def _s3(url: str, bucket: str) -> S3Store:
    client = boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id="k",
        aws_secret_access_key="s",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=bucket)
    return S3Store(bucket, client)


def _adapter_dir(path: Path, payload: bytes = b"weights") -> Path:
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(payload * 100)
    (path / "adapter_config.json").write_text('{"r": 8}')
    (path / "manifest.json").write_text("{}")
    return path


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_put_fetch_verify_and_refuse_overwrite(backend: str, tmp_path: Path, moto_url: str) -> None:
    store = (
        LocalStore(tmp_path / "store") if backend == "local" else _s3(moto_url, f"b-{os.getpid()}")
    )
    src = _adapter_dir(tmp_path / "src")
    stored = store.put_dir(src, "support-es", "support-es-v1")
    weights = (src / "adapter_model.safetensors").read_bytes()
    assert stored.sha256 == hashlib.sha256(weights).hexdigest()
    assert stored.size_bytes == len(weights) + len('{"r": 8}') + 2
    assert (
        stored.uri.endswith("/support-es/support-es-v1/")
        if backend == "s3"
        else stored.uri.endswith("/support-es/support-es-v1")
    )
    assert store.exists("support-es", "support-es-v1")

    with pytest.raises(ArtefactExists, match="already exists"):
        store.put_dir(_adapter_dir(tmp_path / "other", b"different"), "support-es", "support-es-v1")

    out = store.fetch(stored.uri, tmp_path / "fetched")
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "manifest.json",
    ]
    assert verify(out, stored.sha256) == out
    assert (out / "adapter_model.safetensors").read_bytes() == weights  # the first version stayed

    (out / "adapter_model.safetensors").write_bytes(b"tampered")
    with pytest.raises(ArtefactMismatch, match="refusing it"):
        verify(out, stored.sha256)


def test_s3_fetch_of_missing_version_is_readable(tmp_path: Path, moto_url: str) -> None:
    store = _s3(moto_url, "missing-check")
    with pytest.raises(ArtefactError, match="does not exist"):
        store.fetch("s3://missing-check/r/v9/", tmp_path / "x")


def test_local_store_errors_are_readable(tmp_path: Path) -> None:
    with pytest.raises(ArtefactError, match=r"no adapter_model\.safetensors"):
        describe(tmp_path)
    with pytest.raises(ArtefactError, match="invalid version"):
        LocalStore(tmp_path).put_dir(_adapter_dir(tmp_path / "a"), "r", "../escape")
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the store's directory should be")
    with pytest.raises(ArtefactError, match="cannot write to"):
        LocalStore(blocker).put_dir(_adapter_dir(tmp_path / "b"), "r", "v1")
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(ArtefactError, match="permission denied"):
            LocalStore(ro).put_dir(_adapter_dir(tmp_path / "c"), "r", "v1")
