"""Adapter artefact store: a local directory or S3, immutable per (route, version).

An artefact is a directory (adapter_model.safetensors, adapter_config.json, manifest.json),
written by the trainer or by an adapter import alike. Its registry sha256 is the sha256 of
adapter_model.safetensors (the weights the engine loads); the manifest (`write_manifest`) holds
the sha256 of every file, and size_bytes is the sum of all file sizes.
Layout: local `<root>/<route>/<version>/`, S3 `s3://<bucket>/<route>/<version>/`.
A version that exists is never overwritten: put_dir raises ArtefactExists. `versions()` lists
what a store holds and `delete()` removes one version: the maintenance worker uses them to
remove versions no adapter row references (workers/maintenance/tasks.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from app.core.config import Settings, get_settings

WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
ADAPTER_FILES = (WEIGHTS_FILE, CONFIG_FILE)
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "cft-adapter/1"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


class ArtefactError(Exception):
    """An artefact could not be stored, fetched or verified (message says why)."""


class ArtefactExists(ArtefactError):
    """The version is already stored; versions are immutable."""


class ArtefactMismatch(ArtefactError):
    """The artefact's sha256 differs from the registry's."""


@dataclass(frozen=True)
class StoredArtefact:
    """Where an artefact went, with its registry checksum and total size."""

    uri: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True)
class StoredVersion:
    """One version a store holds: its URI (as put_dir returned it) and when it was last written.

    `partial` marks a local upload's temporary directory that was never renamed into place.
    """

    route: str
    version: str
    uri: str
    modified_at: datetime
    partial: bool = False


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(local_dir: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """Write local_dir/manifest.json: `fields` (base, method, provenance, ...), the format and the
    sha256 and size of each adapter file; returns the manifest."""
    for name in ADAPTER_FILES:
        if not (local_dir / name).is_file():
            raise ArtefactError(f"{name} is missing from {local_dir}")
    manifest = fields | {
        "format": MANIFEST_FORMAT,
        "files": {
            name: {
                "sha256": sha256_file(local_dir / name),
                "size_bytes": (local_dir / name).stat().st_size,
            }
            for name in ADAPTER_FILES
        },
    }
    (local_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def describe(local_dir: Path) -> tuple[str, int]:
    """The registry sha256 (of the weights file) and the total size of an artefact directory."""
    weights = local_dir / WEIGHTS_FILE
    if not weights.is_file():
        raise ArtefactError(f"{local_dir} has no {WEIGHTS_FILE}: not an adapter directory")
    size = sum(p.stat().st_size for p in local_dir.iterdir() if p.is_file())
    return sha256_file(weights), size


def verify(path: Path, sha256: str) -> Path:
    """Check that the artefact at path (a directory or the weights file) has sha256; return it."""
    weights = path / WEIGHTS_FILE if path.is_dir() else path
    if not weights.is_file():
        raise ArtefactError(f"cannot verify {path}: {WEIGHTS_FILE} is missing")
    actual = sha256_file(weights)
    if actual != sha256.lower():
        raise ArtefactMismatch(
            f"artefact {path} has sha256 {actual}, the registry says {sha256}: refusing it"
        )
    return path


def _check_names(route: str, version: str) -> None:
    for what, value in (("route", route), ("version", version)):
        if not _NAME.match(value):
            raise ArtefactError(f"invalid {what} {value!r} for an artefact path")


def _os_error(action: str, where: str, exc: OSError) -> ArtefactError:
    if exc.errno == errno.ENOSPC:
        why = "the disk is full"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = "permission denied (check the owner and mode of the directory)"
    else:
        why = exc.strerror or str(exc)
    return ArtefactError(f"cannot {action} {where}: {why}")


class ArtefactStore(Protocol):
    """Where adapters live between the trainer and the engines."""

    def put_dir(self, local_dir: Path, route: str, version: str) -> StoredArtefact:
        """Store a directory as route/version (refuses to overwrite); return where it went."""
        ...

    def fetch(self, uri: str, dest: Path) -> Path:
        """Copy the artefact at uri into dest (a directory) and return dest."""
        ...

    def exists(self, route: str, version: str) -> bool:
        """True when route/version is already stored."""
        ...

    def versions(self) -> Iterator[StoredVersion]:
        """Every version the store holds (complete or not)."""
        ...

    def delete(self, version: StoredVersion) -> None:
        """Remove one version (every file of it)."""
        ...


class LocalStore:
    """Artefacts under a local directory: <root>/<route>/<version>/."""

    scheme = "file"

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def _target(self, route: str, version: str) -> Path:
        _check_names(route, version)
        return self.root / route / version

    def exists(self, route: str, version: str) -> bool:
        """True when route/version is already stored."""
        return self._target(route, version).exists()

    def put_dir(self, local_dir: Path, route: str, version: str) -> StoredArtefact:
        """Copy into a temporary sibling, then rename: a reader never sees half a version."""
        sha, size = describe(local_dir)
        target = self._target(route, version)
        if target.exists():
            raise ArtefactExists(f"artefact {route}/{version} already exists at {target}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{version}-"))
        except OSError as exc:
            raise _os_error("write to", str(target.parent), exc) from exc
        try:
            for src in sorted(local_dir.iterdir()):
                if src.is_file():
                    shutil.copyfile(src, tmp / src.name)
            for p in tmp.iterdir():
                p.chmod(0o444)
            try:
                # rename(2) of a directory onto an existing one fails when it is non-empty.
                os.rename(tmp, target)
            except OSError as exc:
                if target.exists():
                    raise ArtefactExists(f"artefact {route}/{version} already exists") from exc
                raise
        except OSError as exc:
            raise _os_error("store artefact in", str(target), exc) from exc
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return StoredArtefact(uri=target.as_uri(), sha256=sha, size_bytes=size)

    def versions(self) -> Iterator[StoredVersion]:
        """Directories <root>/<route>/<version>, and leftover `.<version>-*` temporaries."""
        if not self.root.is_dir():
            return
        for route_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for vdir in sorted(p for p in route_dir.iterdir() if p.is_dir()):
                stamps = [vdir.stat().st_mtime] + [f.stat().st_mtime for f in vdir.iterdir()]
                yield StoredVersion(
                    route=route_dir.name,
                    version=vdir.name,
                    uri=vdir.as_uri(),
                    modified_at=datetime.fromtimestamp(max(stamps), UTC),
                    partial=vdir.name.startswith("."),
                )

    def delete(self, version: StoredVersion) -> None:
        """Remove the version's directory (its files are read-only; the directory is not)."""
        path = self.root / version.route / version.version
        names = {version.route, version.version}
        if (
            "/" in version.route + version.version
            or names & {"", ".", ".."}
            or (version.uri != path.as_uri())
        ):
            raise ArtefactError(f"{version.uri} is not a version of the store at {self.root}")
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _os_error("delete", str(path), exc) from exc

    def fetch(self, uri: str, dest: Path) -> Path:
        """Copy a file:// artefact into dest."""
        if not uri.startswith("file://"):
            raise ArtefactError(f"the local store cannot fetch {uri!r}")
        src = Path(uri[len("file://") :])
        if not src.is_dir():
            raise ArtefactError(f"artefact {uri} does not exist")
        try:
            dest.mkdir(parents=True, exist_ok=True)
            for p in src.iterdir():
                if p.is_file():
                    shutil.copyfile(p, dest / p.name)
        except OSError as exc:
            raise _os_error("fetch into", str(dest), exc) from exc
        return dest


class S3Store:
    """Artefacts in an S3 bucket (AWS or MinIO): s3://<bucket>/<route>/<version>/<file>."""

    scheme = "s3"

    def __init__(self, bucket: str, client: Any) -> None:
        self.bucket = bucket
        self.client = client

    @classmethod
    def from_settings(cls, settings: Settings) -> S3Store:
        """A store using the CFT_S3_* settings."""
        import boto3

        secret = settings.s3_secret_access_key
        client = boto3.client(
            "s3",
            endpoint_url=settings.s3_endpoint_url,
            aws_access_key_id=settings.s3_access_key_id,
            aws_secret_access_key=secret.get_secret_value() if secret else None,
            region_name=settings.s3_region,
        )
        return cls(settings.s3_bucket, client)

    def _prefix(self, route: str, version: str) -> str:
        _check_names(route, version)
        return f"{route}/{version}/"

    def exists(self, route: str, version: str) -> bool:
        """True when any object exists under route/version/."""
        resp = self.client.list_objects_v2(
            Bucket=self.bucket, Prefix=self._prefix(route, version), MaxKeys=1
        )
        return bool(resp.get("KeyCount", 0))

    def put_dir(self, local_dir: Path, route: str, version: str) -> StoredArtefact:
        """Upload every file; each PUT is conditional (If-None-Match) so nothing is replaced."""
        from botocore.exceptions import BotoCoreError, ClientError

        sha, size = describe(local_dir)
        prefix = self._prefix(route, version)
        if self.exists(route, version):
            raise ArtefactExists(f"artefact s3://{self.bucket}/{prefix} already exists")
        # The manifest goes last: its presence marks a complete upload.
        files = sorted(
            (p for p in local_dir.iterdir() if p.is_file()), key=lambda p: p.name == MANIFEST_FILE
        )
        try:
            for path in files:
                with path.open("rb") as body:
                    self.client.put_object(
                        Bucket=self.bucket,
                        Key=prefix + path.name,
                        Body=body,
                        IfNoneMatch="*",
                        Metadata={"sha256": sha256_file(path)},
                    )
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise ArtefactExists(
                    f"artefact s3://{self.bucket}/{prefix} already exists"
                ) from exc
            raise ArtefactError(f"cannot upload to s3://{self.bucket}/{prefix}: {exc}") from exc
        except (BotoCoreError, OSError) as exc:
            raise ArtefactError(f"cannot upload to s3://{self.bucket}/{prefix}: {exc}") from exc
        return StoredArtefact(uri=f"s3://{self.bucket}/{prefix}", sha256=sha, size_bytes=size)

    def _objects(self, prefix: str = "") -> Iterator[dict[str, Any]]:
        token: dict[str, str] = {}
        while True:
            resp = self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix, **token)
            yield from resp.get("Contents", [])
            if not resp.get("IsTruncated"):
                return
            token = {"ContinuationToken": resp["NextContinuationToken"]}

    def versions(self) -> Iterator[StoredVersion]:
        """Every <route>/<version>/ prefix holding objects, with its newest object's time."""
        from botocore.exceptions import BotoCoreError, ClientError

        newest: dict[tuple[str, str], datetime] = {}
        try:
            for obj in self._objects():
                parts = obj["Key"].split("/")
                if len(parts) < 3:
                    continue  # not <route>/<version>/<file>
                key = (parts[0], parts[1])
                stamp = obj["LastModified"]
                newest[key] = max(stamp, newest.get(key, stamp))
        except (ClientError, BotoCoreError) as exc:
            raise ArtefactError(f"cannot list s3://{self.bucket}/: {exc}") from exc
        for (route, version), stamp in sorted(newest.items()):
            yield StoredVersion(route, version, f"s3://{self.bucket}/{route}/{version}/", stamp)

    def delete(self, version: StoredVersion) -> None:
        """Delete every object under the version's prefix."""
        from botocore.exceptions import BotoCoreError, ClientError

        prefix = f"{version.route}/{version.version}/"
        if version.uri != f"s3://{self.bucket}/{prefix}":
            raise ArtefactError(f"{version.uri} is not a version of s3://{self.bucket}/")
        try:
            keys = [{"Key": o["Key"]} for o in self._objects(prefix)]
            for i in range(0, len(keys), 1000):
                self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": keys[i : i + 1000], "Quiet": True}
                )
        except (ClientError, BotoCoreError) as exc:
            raise ArtefactError(f"cannot delete {version.uri}: {exc}") from exc

    def fetch(self, uri: str, dest: Path) -> Path:
        """Download every object under an s3:// prefix into dest."""
        from botocore.exceptions import BotoCoreError, ClientError

        if not uri.startswith("s3://"):
            raise ArtefactError(f"the S3 store cannot fetch {uri!r}")
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        prefix = prefix if prefix.endswith("/") else prefix + "/"
        try:
            dest.mkdir(parents=True, exist_ok=True)
            resp = self.client.list_objects_v2(Bucket=bucket, Prefix=prefix)
            keys = [o["Key"] for o in resp.get("Contents", [])]
            if not keys:
                raise ArtefactError(f"artefact {uri} does not exist")
            for key in keys:
                self.client.download_file(bucket, key, str(dest / key[len(prefix) :]))
        except OSError as exc:
            raise _os_error("fetch into", str(dest), exc) from exc
        except (ClientError, BotoCoreError) as exc:
            raise ArtefactError(f"cannot download {uri}: {exc}") from exc
        return dest


def get_store(settings: Settings | None = None) -> LocalStore | S3Store:
    """The store named by CFT_ARTEFACT_STORE (local or s3)."""
    settings = settings or get_settings()
    if settings.artefact_store == "local":
        return LocalStore(settings.artefact_path)
    if settings.artefact_store == "s3":
        return S3Store.from_settings(settings)
    raise ArtefactError(
        f"unknown CFT_ARTEFACT_STORE {settings.artefact_store!r}: choose local or s3"
    )


def store_for_uri(uri: str, settings: Settings | None = None) -> LocalStore | S3Store:
    """The store that can fetch uri."""
    settings = settings or get_settings()
    if uri.startswith("file://"):
        return LocalStore(settings.artefact_path)
    if uri.startswith("s3://"):
        return S3Store.from_settings(settings)
    raise ArtefactError(f"unsupported artefact URI {uri!r}")


def fetch_verified(uri: str, sha256: str, dest: Path, settings: Settings | None = None) -> Path:
    """Fetch an artefact into dest and check its sha256 against the registry's."""
    path = store_for_uri(uri, settings).fetch(uri, dest)
    return verify(path, sha256)
