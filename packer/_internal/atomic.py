"""Atomic file writes, the one helper every writer of packer uses (datasets, the node cache, the
perceptual-hash sidecar, the Python door's saved rows).

A temp name unique to this process and thread beside the target, the bytes fsynced, ``os.replace``
over the target, then (``durable=True``) the folder fsynced so that the rename itself survives a
power cut: readers see the old file or the whole new one, never a part. The temp name,
``.<name>.<pid>-<thread>.tmp``, is what cleanup looks for (a dataset's ``.<name>.*.tmp``, the node
cache's dotfiles).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Iterable, NamedTuple

from .. import format as fmt

__all__ = ["Written", "write_atomic", "fsync_dir", "temp_name"]


class Written(NamedTuple):
    """What ``write_atomic`` wrote: the byte count and the bytes' xxh3-64."""

    size: int
    digest: int


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (the folder's entry, not just the file's bytes)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(path: Path) -> Path:
    """The temp file ``write_atomic`` writes ``path`` through (unique per process and thread)."""
    return path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")


def write_atomic(path: Path, pieces: Iterable[Any], *, durable: bool = True) -> Written:
    """Write ``pieces`` (bytes-like) to ``path`` atomically.

    ``durable=False`` skips the folder's fsync: for files that are checked when read and may be
    fetched again (the node cache), where a power cut may lose the rename but never tears a file.
    The file's own bytes are always fsynced before the rename. On any error (a full disk) the
    temp file is removed and nothing else changes (the order is checked by
    tests/writer/test_durability_order.py).
    """
    hasher = fmt.Hasher()
    temp = temp_name(path)
    size = 0
    try:
        with open(temp, "wb") as handle:
            for piece in pieces:
                hasher.update(piece)
                handle.write(piece)
                size += memoryview(piece).nbytes
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
        if durable:
            fsync_dir(path.parent)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return Written(size, hasher.intdigest())
