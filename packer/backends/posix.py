"""The two plain-file backends: ``mmap`` (zero-copy views, pages shared by every process) and ``pread``."""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

from ..errors import TruncatedFileError

__all__ = ["MmapShard", "PreadShard"]


class MmapShard:
    """The whole shard mapped read-only: zero-copy views, pages shared by every process.

    ``MAP_SHARED`` + ``PROT_READ``: DataLoader workers mapping the same file share the page cache
    instead of each holding a copy. Without ``close()`` the mapping goes with the last reference
    to it (this object, ``array``, or a view).
    """

    def __init__(self, fd: int, path: str, size: int) -> None:
        self.path = path
        self.size = size
        self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        self._view = memoryview(self._map)
        #: The whole shard as a read-only uint8 array (zero-copy): lets readers copy many ranges
        #: with numpy slicing instead of one method call per range.
        self.array = np.frombuffer(self._map, dtype=np.uint8)

    def advise_random(self) -> None:
        """Hint the kernel that access is random (no read-ahead beyond the page)."""
        if hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_RANDOM)

    def advise_sequential(self) -> None:
        if hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_SEQUENTIAL)

    def advise_willneed(self, offset: int, size: int) -> None:
        """Ask the kernel to read ``size`` bytes at ``offset`` ahead, as one large asynchronous read."""
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_WILLNEED") and size > 0:
            start = offset - offset % mmap.PAGESIZE  # madvise wants a page-aligned start
            self._map.madvise(mmap.MADV_WILLNEED, start, min(offset + size, self.size) - start)

    def read_into(self, offset: int, out: Any) -> None:
        target = memoryview(out).cast("B")
        target[:] = self._view[offset:offset + target.nbytes]

    def view(self, offset: int, size: int) -> memoryview:
        return self._view[offset:offset + size]

    def close(self) -> None:
        self.array = None  # type: ignore[assignment]
        self._view.release()
        try:
            self._map.close()
        except BufferError:
            # A caller still holds a zero-copy view; the mapping is freed when that view goes.
            pass


class PreadShard:
    """Plain positional reads (``os.preadv``) into the caller's buffer: no mapping, no shared state."""

    def __init__(self, fd: int, path: str, size: int) -> None:
        self.path = path
        self.size = size
        self._fd = os.dup(fd)

    def read_into(self, offset: int, out: Any) -> None:
        target = memoryview(out).cast("B")
        done = 0
        total = target.nbytes
        while done < total:
            n = os.preadv(self._fd, [target[done:]], offset + done)
            if n == 0:
                raise TruncatedFileError(f"shard ended at {offset + done} while reading {total} bytes at {offset}",
                                         path=self.path, offset=offset + done)
            done += n

    def advise_willneed(self, offset: int, size: int) -> None:
        """Ask the kernel to read ``size`` bytes at ``offset`` into the page cache ahead of use."""
        if hasattr(os, "posix_fadvise") and size > 0:
            os.posix_fadvise(self._fd, offset, size, os.POSIX_FADV_WILLNEED)

    def view(self, offset: int, size: int) -> memoryview:
        buffer = bytearray(size)
        self.read_into(offset, buffer)
        return memoryview(buffer)

    def close(self) -> None:
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        # The dataset's cache drops an evicted shard without closing it (a thread may still be
        # reading): the descriptor closes here, with the last reference (packer.dataset).
        try:
            self.close()
        except Exception:
            pass
