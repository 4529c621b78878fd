"""Unpack an uploaded adapter archive (.tar.gz, .tar or .zip) without trusting it.

Every entry is a plain file or a folder with a relative path that stays inside the target
(no absolute path, no `..`, no link, no device or other special file, no entry twice); the
entries are at most MAX_MEMBERS, and what they unpack to is at most `max_bytes`, counted as it
is written, so a zip bomb stops at the limit whatever sizes its headers claim. A gzip stream is
also bounded as a whole, so a tar header that claims gigabytes is refused before it is read.
Then `find_adapter_dir` picks the one folder that holds an adapter.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import stat
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import IO, Any

from app.core.artefacts import CONFIG_FILE
from app.core.errors import BadRequest, PayloadTooLarge, Unavailable, Unprocessable

MAX_MEMBERS = 1000
# Headers and padding of a tar stream on top of its files' bytes.
_TAR_OVERHEAD = 1024 * (MAX_MEMBERS + 2)
_CHUNK = 1 << 20
# How deep below the archive's root an adapter folder is looked for.
MAX_DEPTH = 4


def _unsafe(name: str, why: str) -> Unprocessable:
    return Unprocessable(
        f"the archive's entry {name[:200]!r} {why}: an adapter archive holds plain files and"
        " folders under one root",
        code="unsafe_archive",
    )


def _too_large(max_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the archive unpacks to more than {max_bytes} bytes (CFT_ADAPTER_IMPORT_MAX_BYTES)",
        code="adapter_too_large",
    )


def relative_path(name: str) -> tuple[str, ...]:
    """The entry's path parts inside the target; raises for a path that could leave it."""
    if "\x00" in name or "\\" in name:
        raise _unsafe(name, "has a NUL or backslash in its path")
    path = PurePosixPath(name)
    if path.is_absolute():
        raise _unsafe(name, "has an absolute path")
    if ".." in path.parts:
        raise _unsafe(name, "escapes the archive with '..'")
    return tuple(p for p in path.parts if p not in ("", "."))


class _Budget:
    """Bytes written so far against the limit."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0

    def copy(self, src: IO[bytes], dest: Path, name: str) -> None:
        """Write one entry's bytes to dest (a path no entry has taken), counting them."""
        try:
            _folder(dest.parent, name)
            out = dest.open("xb")
        except FileExistsError as exc:
            raise _unsafe(name, "appears twice") from exc
        with out:
            while chunk := src.read(_CHUNK):
                self.used += len(chunk)
                if self.used > self.max_bytes:
                    raise _too_large(self.max_bytes)
                try:
                    out.write(chunk)
                except OSError as exc:
                    raise Unavailable(f"cannot unpack the upload here: {exc.strerror}") from exc


def _folder(path: Path, name: str) -> None:
    """Make the folder of an entry (a file of another entry in its way is refused)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise _unsafe(name, "clashes with a file of another entry") from exc


class _BoundedReader:
    """A decompressed stream that refuses to yield more than `limit` bytes in all."""

    def __init__(self, raw: IO[bytes], limit: int, max_bytes: int) -> None:
        self.raw = raw
        self.limit = limit
        self.max_bytes = max_bytes
        self.read_bytes = 0

    def read(self, size: int = -1) -> bytes:
        want = self.limit - self.read_bytes + 1 if size < 0 else size
        if self.read_bytes + want > self.limit + 1:
            want = self.limit - self.read_bytes + 1
        data = self.raw.read(want)
        self.read_bytes += len(data)
        if self.read_bytes > self.limit:
            raise _too_large(self.max_bytes)
        return data


def _decompressed(src: IO[bytes], head: bytes) -> Any:
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=src, mode="rb")
    if head.startswith(b"BZh"):
        return bz2.BZ2File(src, mode="rb")
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(src, mode="rb")
    return src


def _untar(src: IO[bytes], head: bytes, dest: Path, budget: _Budget) -> None:
    stream: Any = _BoundedReader(
        _decompressed(src, head), budget.max_bytes + _TAR_OVERHEAD, budget.max_bytes
    )
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for count, member in enumerate(tar, 1):
                if count > MAX_MEMBERS:
                    raise _unsafe(member.name, f"is one more than {MAX_MEMBERS} entries")
                parts = relative_path(member.name)
                if member.issym() or member.islnk():
                    raise _unsafe(member.name, "is a link")
                if member.isdir():
                    _folder(dest.joinpath(*parts), member.name)
                    continue
                if not member.isfile():
                    raise _unsafe(member.name, "is a device, FIFO or other special file")
                if not parts:
                    raise _unsafe(member.name, "is a file without a name")
                if budget.used + member.size > budget.max_bytes:
                    raise _too_large(budget.max_bytes)
                body = tar.extractfile(member)
                assert body is not None  # a regular file
                budget.copy(body, dest.joinpath(*parts), member.name)
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as exc:
        raise BadRequest(
            f"the upload is not a readable .tar.gz, .tar or .zip archive ({exc})",
            code="invalid_archive",
        ) from exc


def _unzip(src: IO[bytes], dest: Path, budget: _Budget) -> None:
    try:
        with zipfile.ZipFile(src) as archive:
            infos = archive.infolist()
            if len(infos) > MAX_MEMBERS:
                raise _unsafe(infos[MAX_MEMBERS].filename, f"is one more than {MAX_MEMBERS}")
            for info in infos:
                parts = relative_path(info.filename)
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    raise _unsafe(info.filename, "is a link")
                if info.is_dir():
                    _folder(dest.joinpath(*parts), info.filename)
                    continue
                if stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # 0: no type recorded
                    raise _unsafe(info.filename, "is a device, FIFO or other special file")
                if info.flag_bits & 0x1:
                    raise _unsafe(info.filename, "is encrypted")
                if not parts:
                    raise _unsafe(info.filename, "is a file without a name")
                with archive.open(info) as body:
                    budget.copy(body, dest.joinpath(*parts), info.filename)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, zlib.error) as exc:
        raise BadRequest(
            f"the upload is not a readable .zip archive ({exc})", code="invalid_archive"
        ) from exc


def unpack(src: IO[bytes], dest: Path, *, max_bytes: int) -> Path:
    """Unpack a .tar.gz / .tgz / .tar (also bz2, xz) or .zip archive into dest; returns dest.

    Raises BadRequest (not an archive), Unprocessable (an unsafe entry) or PayloadTooLarge.
    """
    dest.mkdir(parents=True, exist_ok=True)
    head = src.read(6)
    src.seek(0)
    if not head:
        raise BadRequest("the uploaded archive is empty", code="invalid_archive")
    budget = _Budget(max_bytes)
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        _unzip(src, dest, budget)
    else:
        _untar(src, head, dest, budget)
    return dest


def find_adapter_dir(root: Path) -> Path:
    """The folder under root that holds adapter_config.json: root itself, else the only one
    (up to MAX_DEPTH levels down). Unprocessable when there is none, or several."""
    if (root / CONFIG_FILE).is_file():
        return root
    found: list[Path] = []
    level = [root]
    for _ in range(MAX_DEPTH):
        level = [c for d in level for c in sorted(d.iterdir()) if c.is_dir() and not c.is_symlink()]
        found += [d for d in level if (d / CONFIG_FILE).is_file()]
        if found:
            break
    if not found:
        raise Unprocessable(
            f"no {CONFIG_FILE} found: upload the folder PEFT's save_pretrained wrote (it holds"
            f" {CONFIG_FILE} and adapter_model.safetensors)",
            code="adapter_not_found",
        )
    if len(found) > 1:
        names = ", ".join(str(d.relative_to(root)) for d in found[:5])
        raise Unprocessable(
            f"{len(found)} adapters found ({names}): import one folder, e.g. the final checkpoint",
            code="several_adapters",
        )
    return found[0]
