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
from .buffers import PAGE

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
    ``A``-aligned in the buffer when the buffer does; with ``pages=`` every run starts at a
    page-aligned file offset and a page-aligned buffer position (a run that ends at the end of
    its shard may be shorter than its slot).

    Attributes:
        indices: the requested sample indices, in batch order (may repeat).
        unique: the distinct samples, sorted.
        where: ``indices[j] == unique[where[j]]``.
        sample_pos: position of ``unique[u]`` in the buffer.
        sizes: payload size of ``unique[u]``.
        run_shard, run_offset, run_bytes: each run's shard, file offset and the bytes to read.
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


def plan_runs(index: Any, indices: Any, *, round_to: int = 1, pages: np.ndarray | None = None) -> RunPlan:
    """Group a batch into runs of consecutive samples of one shard and lay their blocks out.

    Args:
        index: the dataset's ``IndexColumns`` (``DatasetIndex.index``).
        indices: sample indices, non-negative and in range (the caller checked them).
        round_to: round each run's end up to a multiple of this. Pass the dataset alignment ``A``
            (or a divisor of it): a payload region ends at ``align_up(end, A)``, which never passes
            the end of the shard file. ``1`` reads exactly the payload bytes.
        pages: each shard's file size (``DatasetIndex.shard_sizes``), to read whole 4 KiB page
            blocks (formats/SPEC.md §3.4; what O_DIRECT and GPUDirect Storage read without a bounce
            buffer): each run widens to ``align_down(start, PAGE)`` .. ``min(align_up(end, PAGE),
            shard size)``, runs whose pages touch become one read, and each run's place in the
            buffer starts on a page. None: exact runs of consecutive samples.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    unique = sorted_unique(idx)
    where = np.searchsorted(unique, idx).astype(np.int64)
    shard_of = np.asarray(index.shard[unique], dtype=np.int64)
    offsets = np.asarray(index.offset[unique], dtype=np.int64)
    sizes = np.asarray(index.size[unique], dtype=np.int64)
    ends = offsets + sizes
    starts = offsets
    block = 1 if pages is None else PAGE
    if pages is not None:
        starts = offsets & ~np.int64(PAGE - 1)
        ends = np.minimum(align_up_array(ends, PAGE), np.asarray(pages, dtype=np.int64)[shard_of])
    breaks = np.ones(len(unique), dtype=bool)
    if len(unique) > 1:
        # A new run where the next sample is not the next one of the same shard, or (whole blocks)
        # where its first block starts after the previous sample's last block ends.
        adjacent = np.diff(unique) == 1 if block == 1 else starts[1:] <= ends[:-1]
        breaks[1:] = ~adjacent | (shard_of[1:] != shard_of[:-1])
    run_of = np.cumsum(breaks) - 1
    first = np.flatnonzero(breaks)
    last = np.append(first[1:], len(unique)) - 1
    run_offset = starts[first]
    run_ends = ends[last]  # offsets grow with the sample number within a shard, so do the ends
    if round_to > 1:
        run_ends = align_up_array(run_ends, round_to)
    run_bytes = run_ends - run_offset
    slots = align_up_array(run_bytes, block) if block > 1 else run_bytes
    run_pos = np.zeros(len(first) + 1, dtype=np.int64)
    np.cumsum(slots, out=run_pos[1:])
    sample_pos = run_pos[:-1][run_of] + (offsets - run_offset[run_of])
    return RunPlan(indices=idx, unique=unique, where=where, sample_pos=sample_pos, sizes=sizes,
                   run_shard=shard_of[first], run_offset=run_offset, run_bytes=run_bytes, run_pos=run_pos)
