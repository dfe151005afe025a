"""Run coalescing: a batch of sample indices becomes one read per run of consecutive samples.

Samples ``i, i+1, ...`` of one shard are contiguous on disk (only aligned zero padding between
them, formats/SPEC.md §3.3), so a run is one block: one ``read_into`` call, no per-sample
syscalls. Every reader that moves batches (``Dataset.read_batch``, the GPU loaders) plans its
reads here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..format import align_up_array

__all__ = ["RunPlan", "plan_runs", "sorted_unique"]


def sorted_unique(indices: np.ndarray) -> np.ndarray:
    """The distinct values of ``indices``, sorted: sort + adjacent de-duplication.

    About 4x cheaper than ``np.unique`` (which hashes) for batch-sized int64 arrays.
    """
    unique = np.sort(indices)
    if len(unique) > 1:
        unique = unique[np.concatenate(([True], unique[1:] != unique[:-1]))]
    return unique


@dataclass(frozen=True)
class RunPlan:
    """How to read one batch with one read per run (host-side arithmetic only).

    The batch buffer holds the runs' blocks back to back (run ``r`` at ``run_pos[r]``). With
    ``round_to=A`` each block is a whole number of ``A``-byte units, so every run starts
    ``A``-aligned in the buffer when the buffer does.

    Attributes:
        indices: the requested sample indices, in batch order (may repeat).
        unique: the distinct samples, sorted.
        where: ``indices[j] == unique[where[j]]``.
        sample_pos: position of ``unique[u]`` in the buffer.
        sizes: payload size of ``unique[u]``.
        run_shard, run_offset, run_bytes: each run's shard, file offset and block length.
        run_pos: ``len(runs) + 1`` buffer positions; ``run_pos[-1]`` is the buffer size.
    """

    indices: np.ndarray
    unique: np.ndarray
    where: np.ndarray
    sample_pos: np.ndarray
    sizes: np.ndarray
    run_shard: np.ndarray
    run_offset: np.ndarray
    run_bytes: np.ndarray
    run_pos: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.run_pos[-1])

    @property
    def starts(self) -> np.ndarray:
        """Buffer position of each requested sample, in batch order."""
        return self.sample_pos[self.where]

    @property
    def batch_sizes(self) -> np.ndarray:
        """Payload size of each requested sample, in batch order."""
        return self.sizes[self.where]

    def reads(self, max_bytes: int, alignment: int = 1) -> list[tuple[int, int, int, int]]:
        """``(shard, file_offset, buffer_pos, nbytes)`` reads, runs split into pieces of at most ``max_bytes``.

        Pieces are multiples of ``alignment`` (except a run's last), so they stay aligned.
        """
        piece = max(alignment, max_bytes - max_bytes % alignment if alignment > 1 else max_bytes)
        out: list[tuple[int, int, int, int]] = []
        for shard, offset, nbytes, pos in zip(self.run_shard.tolist(), self.run_offset.tolist(),
                                              self.run_bytes.tolist(), self.run_pos[:-1].tolist()):
            done = 0
            while done < nbytes:
                step = min(piece, nbytes - done)
                out.append((shard, offset + done, pos + done, step))
                done += step
        return out


def plan_runs(index: Any, indices: Any, *, round_to: int = 1) -> RunPlan:
    """Group a batch into runs of consecutive samples of one shard and lay their blocks out.

    Args:
        index: the dataset's ``IndexColumns`` (``DatasetIndex.index``).
        indices: sample indices, non-negative and in range (the caller checked them).
        round_to: round each run's end up to a multiple of this. Pass the dataset alignment ``A``
            (or a divisor of it): a payload region ends at ``align_up(end, A)``, which never passes
            the end of the shard file, and whole pages let O_DIRECT / GPUDirect reads skip their
            bounce buffer. ``1`` reads exactly the payload bytes.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    unique = sorted_unique(idx)
    where = np.searchsorted(unique, idx).astype(np.int64)
    shard_of = np.asarray(index.shard[unique], dtype=np.int64)
    offsets = np.asarray(index.offset[unique], dtype=np.int64)
    sizes = np.asarray(index.size[unique], dtype=np.int64)
    breaks = np.ones(len(unique), dtype=bool)
    if len(unique) > 1:
        breaks[1:] = (np.diff(unique) != 1) | (shard_of[1:] != shard_of[:-1])
    run_of = np.cumsum(breaks) - 1
    first = np.flatnonzero(breaks)
    last = np.append(first[1:], len(unique)) - 1
    run_offset = offsets[first]
    ends = offsets[last] + sizes[last]
    if round_to > 1:
        ends = align_up_array(ends, round_to)
    run_bytes = ends - run_offset
    run_pos = np.zeros(len(first) + 1, dtype=np.int64)
    np.cumsum(run_bytes, out=run_pos[1:])
    sample_pos = run_pos[:-1][run_of] + (offsets - run_offset[run_of])
    return RunPlan(indices=idx, unique=unique, where=where, sample_pos=sample_pos, sizes=sizes,
                   run_shard=shard_of[first], run_offset=run_offset, run_bytes=run_bytes, run_pos=run_pos)
