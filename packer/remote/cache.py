"""The node-local cache folder: atomic files, per-extent locks shared by every process, eviction.

Layout (``RemoteOptions.cache_dir``, default ``~/.cache/packer``)::

    v1/<dataset key>/<generation>/manifest.json      the manifest this generation was opened from
    v1/<dataset key>/<generation>/<index path>       its index (checked against the manifest)
    v1/<dataset key>/<generation>/headers/<family>-<shard>   each shard's header bytes
    v1/<dataset key>/<generation>/extents/<family>/<shard>/<start>-<end>   checked extents
    v1/<dataset key>/<generation>/locks/<family>-<shard>.lock   one lock byte per extent

The dataset key is the xxh3 of the URL and endpoint (never a credential); the generation is the
xxh3 of the manifest bytes, so two generations of a dataset never share a file and a reader of
one never sees the other's bytes. Every file enters by unique temp name, fsync and rename, so a
reader sees a whole checked file or none, and a file survives restarts. Who downloads an extent
is decided by a POSIX record lock on its byte of the shard's lock file: one process per node
fetches it, the others wait and then read the file.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Callable, Iterable

from .._internal.atomic import write_atomic

__all__ = ["write_cached", "LockFile", "scan_extents", "evict"]

#: Temp files older than this are left over from a killed process and are removed by eviction.
_STALE_TEMP_S = 3600.0


def write_cached(path: Path, pieces: Iterable[bytes | memoryview]) -> int:
    """Write a cache file through ``packer._internal.atomic`` (its folder made first); returns the
    size. Not ``durable``: a cache file is checked when it is read and fetched again if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, pieces, durable=False).size


class LockFile:
    """One lock file whose byte ``k`` is extent ``k``'s lock (POSIX record locks, per process).

    Record locks belong to the process: two threads of one process do not exclude each other, so
    callers serialise per extent inside the process first (the reader's in-flight table). The
    descriptor stays open for the process's lifetime: closing any descriptor of the file would
    drop every lock the process holds on it.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def acquire(self, byte: int, *, blocking: bool = True) -> bool:
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB), 1, byte, os.SEEK_SET)
            return True
        except (BlockingIOError, PermissionError):
            return False

    def release(self, byte: int) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, byte, os.SEEK_SET)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def scan_extents(root: Path) -> list[tuple[Path, int, float]]:
    """Every cached extent under ``root`` (all datasets and generations): (path, size, mtime).

    Stale temp files of killed processes are removed on the way.
    """
    found: list[tuple[Path, int, float]] = []
    now = time.time()
    for folder, _dirs, files in os.walk(root):
        if f"{os.sep}extents{os.sep}" not in folder + os.sep:
            continue
        for name in files:
            full = os.path.join(folder, name)
            try:
                stat = os.stat(full)
            except FileNotFoundError:
                continue
            if name.startswith("."):
                if now - stat.st_mtime > _STALE_TEMP_S:
                    Path(full).unlink(missing_ok=True)
                continue
            found.append((Path(full), stat.st_size, stat.st_mtime))
    return found


def evict(root: Path, bound: int, priority: Callable[[Path, float], tuple[float, ...]], *,
          target: float = 0.9, removed_paths: list[Path] | None = None) -> tuple[int, int]:
    """Bring the cache under ``bound`` bytes: remove extents in ``priority`` order (lowest first)
    until the total is at most ``target * bound``. One process evicts at a time (a lock file).

    A removed file stays readable by a process that has it open or mapped (Linux unlink
    semantics), so eviction never pulls bytes from under a reader; its disk space is freed when
    the last mapping goes, so the evicting process drops its own (``removed_paths`` lists them).

    Returns:
        ``(bytes in the cache after, bytes removed)``.
    """
    root.mkdir(parents=True, exist_ok=True)
    lock = os.open(root / "evict.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = scan_extents(root)
        total = sum(size for _, size, _ in entries)
        removed = 0
        if total > bound:
            for path, size, mtime in sorted(entries, key=lambda e: priority(e[0], e[2])):
                if total <= target * bound:
                    break
                if priority(path, mtime)[0] >= float("inf"):
                    break  # everything left is needed right now
                path.unlink(missing_ok=True)
                total -= size
                removed += size
                if removed_paths is not None:
                    removed_paths.append(path)
        return total, removed
    finally:
        os.close(lock)
