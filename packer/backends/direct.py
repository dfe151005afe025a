"""The O_DIRECT backend: shard reads that bypass the page cache, in 4 KiB-aligned blocks only.

``O_DIRECT`` moves bytes between the device and the caller's memory without the page cache, which
is what a training job reading a dataset larger than RAM wants: no cache thrash, no double
copy, no read-ahead of data nobody asked for. The price is that every read's file offset, length
and memory address must be a multiple of the device's logical block size; ``DIRECT_BLOCK`` =
4096 is a multiple of every common one (512 and 4096), and these reads never do anything else.

How a read of ``[offset, offset + n)`` is done (``DirectShard.read_into``):

* The *window* is the range widened to 4 KiB boundaries: ``align_down(offset)`` to
  ``align_up(offset + n)``. It may end past the end of the file when the dataset's alignment is
  below 4096 (then the file size is not a multiple of 4096): the kernel returns the bytes up to
  the end of the file, which always covers the requested range. With the default dataset
  alignment of 4096 every sample and every run of consecutive samples already starts on a
  block, and shard files are whole blocks (formats/SPEC.md §3.3).
* Zero bounce: when ``offset`` and the caller's buffer address are both 4 KiB-aligned, the
  whole blocks are read straight into the caller's buffer; only a final partial block (a
  sample's last bytes, shorter than 4 KiB) goes through the bounce buffer. ``aligned_empty``
  allocates such buffers.
* Otherwise the window is read, in pieces of at most ``bounce_bytes``, into a page-aligned
  per-thread bounce buffer (anonymous ``mmap`` memory is page-aligned) and the wanted bytes are
  copied out.

Every ``preadv`` this module issues is checked first: an offset, length or address that is not a
multiple of ``DIRECT_BLOCK`` raises ``MisalignedRecordError`` (a bug here, never sent to the
kernel, where it would be ``EINVAL``). A file system that refuses ``O_DIRECT`` (some FUSE and
network file systems, tmpfs before Linux 6.6) makes opening the shard raise
``DirectIOUnsupportedError``: use the ``pread`` or ``mmap`` backend there.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from typing import Any

from ..errors import (DatasetChangedError, DirectIOUnsupportedError, MisalignedRecordError,
                     OffsetOutOfBoundsError, TruncatedFileError)
from .buffers import PAGE, buffer_address

__all__ = ["DIRECT_BLOCK", "DEFAULT_BOUNCE_BYTES", "DirectShard"]

#: Alignment of every O_DIRECT read: file offset, length and memory address.
DIRECT_BLOCK = PAGE
#: Largest piece read through the bounce buffer at once (per thread, allocated on first use).
DEFAULT_BOUNCE_BYTES = 8 << 20


def _align_down(value: int) -> int:
    return value - value % DIRECT_BLOCK


def _align_up(value: int) -> int:
    return -(-value // DIRECT_BLOCK) * DIRECT_BLOCK


class _Bounce(threading.local):
    """One page-aligned bounce buffer per thread, grown on demand up to the backend's limit."""

    buffer: mmap.mmap | None = None
    view: memoryview | None = None


class DirectShard:
    """Reads one shard with ``O_DIRECT`` (see the module docstring for how).

    Args:
        fd: an open descriptor of the shard (already validated); it is not kept: the file is
            reopened with ``O_DIRECT`` through ``/proc/self/fd`` (the same file even if it was
            renamed or deleted meanwhile), or by ``path`` where ``/proc`` is missing.
        path: the shard's path, for messages (and reopening without ``/proc``).
        size: the shard's size in bytes.
        bounce_bytes: the largest piece read through the bounce buffer at once.

    Raises:
        DirectIOUnsupportedError: the file system refuses ``O_DIRECT``.
        DatasetChangedError: without ``/proc``, ``path`` is no longer the file ``fd`` is.

    Thread-safe: reads are positional and each thread has its own bounce buffer.
    """

    def __init__(self, fd: int, path: str, size: int, *, bounce_bytes: int = DEFAULT_BOUNCE_BYTES) -> None:
        self.path = path
        self.size = size
        self.bounce_bytes = max(DIRECT_BLOCK, _align_down(bounce_bytes))
        self._bounce = _Bounce()
        self._fd = -1
        self._fd = self._open_direct(fd, path)
        try:
            # Some file systems accept the open flag and refuse the read: find out now, not mid-epoch.
            self._read_window(0, DIRECT_BLOCK)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _open_direct(fd: int, path: str) -> int:
        flags = os.O_RDONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0)
        proc_path = f"/proc/self/fd/{fd}"
        reopened_by_path = not os.path.exists(proc_path)
        try:
            direct_fd = os.open(path if reopened_by_path else proc_path, flags)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise DirectIOUnsupportedError(
                    "the file system refuses O_DIRECT (EINVAL on open); use backend='pread' or "
                    "'mmap', or keep the dataset on a local ext4/xfs disk", path=path) from None
            raise
        if reopened_by_path:
            before, now = os.fstat(fd), os.fstat(direct_fd)
            if (before.st_dev, before.st_ino) != (now.st_dev, now.st_ino):
                os.close(direct_fd)
                raise DatasetChangedError("the shard file was replaced while it was being opened",
                                          path=path)
        return direct_fd

    # --- the only place that calls preadv ---
    def _pread_blocks(self, target: memoryview, offset: int) -> int:
        """One checked O_DIRECT read of whole blocks into ``target``; returns the bytes read."""
        length = target.nbytes
        address = buffer_address(target)
        if offset % DIRECT_BLOCK or length % DIRECT_BLOCK or address % DIRECT_BLOCK:
            raise MisalignedRecordError(
                f"refusing a misaligned O_DIRECT read (offset {offset}, length {length}, buffer "
                f"address {address:#x}; each must be a multiple of {DIRECT_BLOCK})",
                path=self.path, offset=offset)
        try:
            return os.preadv(self._fd, [target], offset)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise DirectIOUnsupportedError(
                    f"the file system refused an aligned O_DIRECT read ({exc.strerror}); use "
                    f"backend='pread' or 'mmap'", path=self.path, offset=offset) from None
            raise

    def _fill(self, target: memoryview, offset: int, needed: int) -> None:
        """Read aligned blocks into aligned ``target`` until at least ``needed`` bytes are in."""
        done = 0
        while done < needed:
            n = self._pread_blocks(target[done:], offset + done)
            if n == 0 or (n % DIRECT_BLOCK and done + n < needed):
                raise TruncatedFileError(
                    f"shard ended at {offset + done + n} while reading {needed} bytes at {offset}",
                    path=self.path, offset=offset + done + n)
            done += n

    def _bounce_view(self, nbytes: int) -> memoryview:
        local = self._bounce
        if local.view is None or local.view.nbytes < nbytes:
            # Not closed: a caller may still hold a slice of the old one; it goes with the last.
            size = max(nbytes, min(self.bounce_bytes, 1 << 20))
            local.buffer = mmap.mmap(-1, size)  # anonymous memory: page-aligned
            local.view = memoryview(local.buffer)
        return local.view[:nbytes]

    def _read_window(self, start: int, length: int) -> memoryview:
        """Read the aligned window ``[start, start + length)`` into the bounce buffer."""
        view = self._bounce_view(length)
        self._fill(view, start, min(length, self.size - start))
        return view

    # --- the backend protocol ---
    def read_into(self, offset: int, out: Any) -> None:
        """Fill the writable buffer ``out`` with the ``len(out)`` bytes at ``offset``.

        Raises:
            OffsetOutOfBoundsError: the range is not inside the shard.
            TruncatedFileError: the file is shorter than it was when opened.
            DirectIOUnsupportedError: the file system refused an aligned read.
        """
        target = memoryview(out).cast("B")
        total = target.nbytes
        if offset < 0 or offset + total > self.size:
            raise OffsetOutOfBoundsError(f"read of {total} bytes at {offset} is outside the "
                                         f"{self.size}-byte shard", path=self.path, offset=offset)
        if total == 0:
            return
        done = 0
        if offset % DIRECT_BLOCK == 0 and buffer_address(target) % DIRECT_BLOCK == 0:
            whole = _align_down(total)
            if whole:
                self._fill(target[:whole], offset, whole)
                done = whole
        while done < total:
            position = offset + done
            start = _align_down(position)
            end = min(_align_up(offset + total), start + self.bounce_bytes)
            window = self._read_window(start, end - start)
            take = min(total - done, end - position)
            target[done:done + take] = window[position - start:position - start + take]
            done += take

    def view(self, offset: int, size: int) -> memoryview:
        """The ``size`` bytes at ``offset`` in a fresh buffer (read straight into it: no bounce)."""
        if offset < 0 or size < 0 or offset + size > self.size:
            raise OffsetOutOfBoundsError(f"read of {size} bytes at {offset} is outside the "
                                         f"{self.size}-byte shard", path=self.path, offset=offset)
        if size == 0:
            return memoryview(b"")
        start, end = _align_down(offset), _align_up(offset + size)
        buffer = mmap.mmap(-1, end - start)
        window = memoryview(buffer)
        self._fill(window, start, min(end, self.size) - start)
        # The slice keeps the anonymous mapping alive; it is freed with the last view.
        return window[offset - start:offset - start + size]

    def close(self) -> None:
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        # An evicted shard closes with its last reference, never under a reader (packer.dataset).
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "DirectShard":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
