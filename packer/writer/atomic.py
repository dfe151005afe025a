"""Durable file writes: unique temp name beside the target, fsync, ``os.replace``, folder fsync."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from .. import format as fmt

__all__ = ["write_atomic", "fsync_dir"]


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (the folder's entry, not just the file's bytes)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, pieces: Iterable[Any]) -> int:
    """Write ``pieces`` to ``path`` atomically and return their xxh3-64.

    Readers see the old file or the whole new one, never a part: the bytes go to a temp name
    unique to this process beside ``path``, are fsynced, then renamed over it, and the folder is
    fsynced so that the rename itself survives a power cut (the order is checked by
    tests/writer/test_durability_order.py). On any error (a full disk) the temp file is removed and
    nothing else changes.
    """
    hasher = fmt.Hasher()
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temp, "wb") as handle:
            for piece in pieces:
                hasher.update(piece)
                handle.write(piece)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
        fsync_dir(path.parent)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return hasher.intdigest()
