"""Unpacking an uploaded adapter archive: what may not pass, and where the adapter is found."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from app.adapters import archive
from app.core.errors import BadRequest, CftError, PayloadTooLarge, Unprocessable


def _tar(entries: list[tuple[str, bytes, bytes]], mode: str = "w:gz") -> io.BytesIO:
    """(name, type, data) entries; a link's data is its target."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, kind, data in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = data.decode()
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def _zip(entries: list[tuple[str, bytes]]) -> io.BytesIO:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries:
            z.writestr(name, data)
    buf.seek(0)
    return buf


F = tarfile.REGTYPE


@pytest.mark.parametrize(
    ("src", "error", "words"),
    [
        (_tar([("a/x", F, b"1"), ("a/h", tarfile.LNKTYPE, b"a/x")]), Unprocessable, "is a link"),
        (_tar([("a/b/../../../x", F, b"1")]), Unprocessable, "escapes the archive"),
        (_tar([("a\\..\\x", F, b"1")]), Unprocessable, "backslash"),
        (_tar([("a/f", tarfile.FIFOTYPE, b"")]), Unprocessable, "FIFO"),
        (_tar([("a", F, b"1"), ("a/b", F, b"2")]), Unprocessable, "clashes"),
        (_tar([("x", F, b"1"), ("./x", F, b"2")], mode="w"), Unprocessable, "appears twice"),
        (_zip([("x", b"1"), ("x", b"2")]), Unprocessable, "appears twice"),
        (_tar([("big", F, bytes(5000))]), PayloadTooLarge, "unpacks to more than 4096"),
        (_tar([(f"f{i}", F, b"") for i in range(archive.MAX_MEMBERS + 1)]), Unprocessable, "1000"),
        (io.BytesIO(b"\x1f\x8b" + b"not gzip at all"), BadRequest, "not a readable"),
        (io.BytesIO(b""), BadRequest, "empty"),
    ],
)
def test_unsafe_or_broken_archives_are_refused(
    tmp_path: Path, src: io.BytesIO, error: type[CftError], words: str
) -> None:
    with pytest.raises(error) as got:
        archive.unpack(src, tmp_path / "out", max_bytes=4096)
    assert words in got.value.message


def test_a_gzip_bomb_stops_at_the_limit_without_unpacking_it(tmp_path: Path) -> None:
    bomb = _tar([("zeros", F, bytes(50_000_000))])  # 50 MB of zeros, ~50 KB packed
    assert len(bomb.getvalue()) < 100_000
    with pytest.raises(PayloadTooLarge):
        archive.unpack(bomb, tmp_path / "out", max_bytes=1_000_000)
    assert sum(p.stat().st_size for p in (tmp_path / "out").rglob("*") if p.is_file()) <= 1_000_000


def test_the_adapter_folder_is_the_root_or_the_only_one(tmp_path: Path) -> None:
    cfg = b"{}"
    root = archive.unpack(_tar([("adapter_config.json", F, cfg)]), tmp_path / "r", max_bytes=99)
    assert archive.find_adapter_dir(root) == root
    nested = _zip([("out/final/adapter_config.json", cfg), ("out/README.md", b"")])
    found = archive.find_adapter_dir(archive.unpack(nested, tmp_path / "n", max_bytes=99))
    assert found == tmp_path / "n" / "out" / "final"
    two = _tar([("a/adapter_config.json", F, cfg), ("b/adapter_config.json", F, cfg)])
    with pytest.raises(Unprocessable, match="2 adapters found"):
        archive.find_adapter_dir(archive.unpack(two, tmp_path / "t", max_bytes=99))
    with pytest.raises(Unprocessable, match=r"no adapter_config\.json"):
        archive.find_adapter_dir(
            archive.unpack(_tar([("x", F, b"")]), tmp_path / "e", max_bytes=99)
        )
