"""Aligned host buffers: the allocation and address arithmetic every aligned reader shares."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import OptionError

__all__ = ["PAGE", "aligned_empty", "buffer_address", "is_aligned"]

#: The page (and O_DIRECT block, and cuFile DMA) alignment: 4 KiB on every platform packer targets.
PAGE = 4096


def buffer_address(buffer: Any) -> int:
    """The memory address of the first byte of a C-contiguous buffer (numpy array, bytearray, mmap)."""
    view = memoryview(buffer)
    if view.nbytes == 0:
        return 0
    return int(np.frombuffer(view.cast("B") if view.format != "B" or view.ndim != 1 else view,
                             dtype=np.uint8).ctypes.data)


def is_aligned(buffer: Any, alignment: int = PAGE) -> bool:
    """Whether a C-contiguous buffer starts at a multiple of ``alignment``."""
    return buffer_address(buffer) % alignment == 0


def aligned_empty(nbytes: int, alignment: int = PAGE) -> np.ndarray:
    """A new uninitialised 1-D uint8 array of ``nbytes`` whose first byte is ``alignment``-aligned.

    ``read_into`` on a ``DirectShard`` reads the whole blocks of such a buffer without a bounce
    copy (pass it, or a slice starting at a multiple of 4096, with an aligned offset).
    """
    if nbytes < 0 or alignment < 1:
        raise OptionError(f"need nbytes >= 0 and alignment >= 1, got {nbytes}, {alignment}")
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    skip = -raw.ctypes.data % alignment
    return raw[skip:skip + nbytes]
