"""Page-cache control for the benchmarks: evict files (or the whole cache) before a cold run.

Shared by ``bench_build.py``, ``bench_verify.py``, ``bench_backends.py`` and ``gpu_check.py``
(each imports it as a sibling module: ``scripts/`` is on ``sys.path`` when a script runs).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

__all__ = ["evict", "drop_all"]


def drop_all() -> bool:
    """Flush and drop the whole page cache (needs root); False when not allowed."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
    except OSError:
        return False
    return True


def evict(paths: Iterable[str | Path], *, whole_cache: bool = False) -> bool:
    """Make the next reads of ``paths`` come from the device; False if some file could not be evicted.

    Without ``whole_cache``, each file is flushed and its pages dropped with
    ``posix_fadvise(DONTNEED)`` (no root needed, other files keep their pages).
    """
    if whole_cache:
        return drop_all()
    ok = True
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)  # dirty pages cannot be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except OSError:
            ok = False
    return ok
