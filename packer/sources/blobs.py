"""Variable-length values held as one byte blob plus u64 offsets (keys, metadata, field values)."""

from __future__ import annotations

import numpy as np

__all__ = ["gather_blob"]


def gather_blob(blob: np.ndarray, offsets: np.ndarray, rows: np.ndarray, *, chunk_rows: int = 1 << 20
                ) -> tuple[np.ndarray, np.ndarray]:
    """Entries ``rows`` of a (blob, offsets) pair, concatenated: vectorised, in bounded memory.

    Works through ``chunk_rows`` rows at a time, so the temporary byte-index arrays stay around
    ``8 x`` one chunk's bytes (not ``8 x`` the whole blob: 20 GB for 100 M keys).
    """
    rows = np.asarray(rows, dtype=np.int64)
    starts = offsets[rows].astype(np.int64)
    lengths = offsets[rows + 1].astype(np.int64) - starts
    new_offsets = np.zeros(len(rows) + 1, dtype=np.uint64)
    np.cumsum(lengths, out=new_offsets[1:])
    out = np.empty(int(new_offsets[-1]), dtype=np.uint8)
    for first in range(0, len(rows), chunk_rows):
        last = min(first + chunk_rows, len(rows))
        chunk_lengths = lengths[first:last]
        base = int(new_offsets[first])
        total = int(new_offsets[last]) - base
        if total == 0:
            continue
        # byte p of this chunk comes from starts[row] + (p - (new_offsets[row] - base))
        row_of = np.repeat(np.arange(last - first), chunk_lengths)
        within = np.arange(total, dtype=np.int64) - (new_offsets[first:last].astype(np.int64) - base)[row_of]
        out[base:base + total] = blob[starts[first:last][row_of] + within]
    return out, new_offsets
