"""Recognising an archive by its first bytes: tar (plain or compressed), zip, Parquet."""

from __future__ import annotations

import bz2
import gzip
import lzma
from pathlib import Path
from typing import IO

from ..errors import MissingDependencyError

COMPRESSIONS = {b"\x1f\x8b": "gz", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zst"}


# --- recognising a source ----------------------------------------------------------------------

def is_tar_header(block: bytes) -> bool:
    if len(block) < 512:
        return False
    if block[257:262] == b"ustar":
        return True
    try:  # a v7 tar has no magic: its header checksum must match
        stored = int(block[148:156].replace(b"\x00", b" ").strip() or b"-1", 8)
    except ValueError:
        return False
    return stored == sum(block[:148]) + 256 + sum(block[156:512])


def decompressor(path: Path, name: str, raw: IO[bytes] | None = None) -> IO[bytes]:
    """A decompressing reader of ``path`` (over ``raw``, whose position then counts compressed bytes)."""
    raw = raw if raw is not None else open(path, "rb")
    if name == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if name == "bz2":
        return bz2.BZ2File(raw, "rb")
    if name == "xz":
        return lzma.LZMAFile(raw, "rb")
    try:
        import zstandard
    except ImportError:
        raise MissingDependencyError("reading a .tar.zst needs the zstandard package: "
                                     "pip install 'packer-shards[zstd]'") from None
    return zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)


def sniff_container(path: Path) -> str | None:
    """``"tar"``, ``"tar.gz"``/``"tar.bz2"``/``"tar.xz"``/``"tar.zst"``, ``"zip"`` or None, from the bytes."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(512)
    except OSError:
        return None
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[:4] == b"PAR1":
        return "parquet"
    if is_tar_header(head):
        return "tar"
    for magic, name in COMPRESSIONS.items():
        if head.startswith(magic):
            try:
                with decompressor(path, name) as stream:
                    return f"tar.{name}" if is_tar_header(stream.read(512)) else None
            except (OSError, EOFError, lzma.LZMAError, MissingDependencyError):
                return None
    return None
