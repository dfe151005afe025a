"""Variable-length values held as one byte blob plus u64 offsets (keys, metadata, field values)."""

from __future__ import annotations

import numpy as np

__all__ = ["gather_blob"]


#: Bytes gathered per vectorised step: the byte-index temporaries are ~24 bytes per byte of it.
_CHUNK_BYTES = 4 << 20


def gather_blob(blob: np.ndarray, offsets: np.ndarray, rows: np.ndarray, *, chunk_rows: int = 1 << 20
                ) -> tuple[np.ndarray, np.ndarray]:
    """Entries ``rows`` of a (blob, offsets) pair, concatenated: vectorised, in bounded memory.

    Works through at most ``chunk_rows`` rows and about ``_CHUNK_BYTES`` bytes at a time, so the
    temporary byte-index arrays stay around ``24 x`` 4 MiB (not ``24 x`` the whole blob: 20 GB for
    100 M keys, or 150 MB for one sample's 6 MB of metadata); an entry larger than a chunk is
    copied as one slice.
    """
    rows = np.asarray(rows, dtype=np.int64)
    starts = offsets[rows].astype(np.int64)
    lengths = offsets[rows + 1].astype(np.int64) - starts
    new_offsets = np.zeros(len(rows) + 1, dtype=np.uint64)
    np.cumsum(lengths, out=new_offsets[1:])
    out = np.empty(int(new_offsets[-1]), dtype=np.uint8)
    ends = new_offsets.astype(np.int64)
    first = 0
    while first < len(rows):
        fits = int(np.searchsorted(ends, ends[first] + _CHUNK_BYTES, side="right")) - 1  # rows [first, fits) fit
        last = min(max(fits, first + 1), first + chunk_rows, len(rows))
        base = int(ends[first])
        total = int(ends[last]) - base
        if last == first + 1:  # one entry (perhaps larger than a chunk): a slice
            out[base:base + total] = blob[int(starts[first]):int(starts[first]) + total]
        elif total:
            chunk_lengths = lengths[first:last]
            # byte p of this chunk comes from starts[row] + (p - (new_offsets[row] - base))
            row_of = np.repeat(np.arange(last - first), chunk_lengths)
            within = np.arange(total, dtype=np.int64) - (ends[first:last] - base)[row_of]
            out[base:base + total] = blob[starts[first:last][row_of] + within]
        first = last
    return out, new_offsets
