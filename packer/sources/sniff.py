"""Recognising an archive by its first bytes: tar (plain or compressed), zip, Parquet."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import stat
import zlib
from pathlib import Path
from typing import IO, Any

from ..errors import MissingDependencyError
from .._internal.files import open_nonblocking

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
    zstandard = _zstandard()
    # read_across_frames: a .tar.zst written in several frames (pzstd, zstd -T0 --rsyncable) is one stream
    return zstandard.ZstdDecompressor().stream_reader(raw, closefd=True, read_across_frames=True)


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError:
        raise MissingDependencyError("this source is zstd-compressed (.tar.zst): reading it needs the zstandard "
                                     "package: pip install 'packer-shards[zstd]'") from None
    return zstandard


def sniff_container(path: Path, *, strict: bool = False) -> str | None:
    """``"tar"``, ``"tar.gz"``/``"tar.bz2"``/``"tar.xz"``/``"tar.zst"``, ``"zip"``, ``"parquet"`` or
    None, from the bytes.

    Args:
        strict: when the bytes say the file is zstd-compressed and zstandard is not installed,
            raise ``MissingDependencyError`` naming the extra (source detection), instead of
            answering None ("not an archive").
    """
    try:
        fd, info = open_nonblocking(path)  # a FIFO in place of a file must not block the sniff
    except OSError:
        return None
    try:
        if not stat.S_ISREG(info.st_mode):
            return None
        head = os.read(fd, 512)
    except OSError:
        return None
    finally:
        os.close(fd)
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if head[:4] == b"PAR1":
        return "parquet"
    if is_tar_header(head):
        return "tar"
    for magic, name in COMPRESSIONS.items():
        if head.startswith(magic):
            if name == "zst" and strict:
                _zstandard()  # the bytes say zstd: name the missing extra, not "not a manifest"
            try:
                with decompressor(path, name) as stream:
                    return f"tar.{name}" if is_tar_header(stream.read(512)) else None
            except (OSError, EOFError, lzma.LZMAError, zlib.error, MissingDependencyError):
                return None  # a damaged stream is not a tar: the caller says what the source is not
            except Exception as exc:  # zstandard.ZstdError is not an OSError
                if type(exc).__module__.split(".")[0] == "zstandard":
                    return None
                raise
    return None
