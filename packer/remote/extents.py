"""The range planner: a dataset's shards cut into extents, and an epoch order turned into fetches.

An *extent* is a run of consecutive samples of one shard spanning about ``extent_bytes``, cut at
sample boundaries (the first sample whose offset passes the next multiple of ``extent_bytes``
from the shard's first sample starts a new extent). It is the unit of the node cache and of
the checksum check on entry: every sample lies in exactly one extent, so an extent is checked
sample by sample against the index's xxh3. The cut is a pure function of the index and
``extent_bytes``, so every process of a node computes the same extents and names the same files.

``FetchPlan`` reads an order (the sample indices one process will read, in order) as the
sequence of extents in first-need order; the prefetcher walks that sequence, coalescing extents
adjacent in a shard into one range GET of up to ``request_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..format import align_up_array

__all__ = ["ExtentTable", "plan_extents", "FetchPlan", "coalesce"]


@dataclass(frozen=True)
class ExtentTable:
    """Extents of one family of shards (the main image shards, or one image field's).

    Attributes:
        shard: each extent's shard (position in the manifest's list).
        start, end: the extent's byte range in its shard file (``end`` aligned, within the file).
        first, stop: the samples ``[first, stop)`` it holds.
        ordinal: the extent's number inside its shard.
        of_sample: each sample's extent.
        shard_extents: ``shard_extents[s]:shard_extents[s+1]`` are shard ``s``'s extents.
    """

    shard: np.ndarray
    start: np.ndarray
    end: np.ndarray
    first: np.ndarray
    stop: np.ndarray
    ordinal: np.ndarray
    of_sample: np.ndarray
    shard_extents: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    def nbytes(self, extent: int) -> int:
        return int(self.end[extent] - self.start[extent])

    def find(self, shard: int, offset: int) -> int:
        """The extent of ``shard`` holding byte ``offset``, or -1 (the header, or past the last sample)."""
        lo, hi = int(self.shard_extents[shard]), int(self.shard_extents[shard + 1])
        k = lo + int(np.searchsorted(self.start[lo:hi], offset, side="right")) - 1
        if k < lo or offset >= int(self.end[k]):
            return -1
        return k


def plan_extents(shard: np.ndarray, offset: np.ndarray, size: np.ndarray, shard_sizes: np.ndarray,
                 alignment: int, extent_bytes: int) -> ExtentTable:
    """Cut samples (in index order, each shard's samples consecutive and ascending) into extents.

    Args:
        shard, offset, size: per-sample shard, byte offset and payload size (the index columns).
        shard_sizes: each shard file's size (extents end inside it).
        alignment: the dataset alignment (an extent ends at its last sample's aligned end).
        extent_bytes: the target span.
    """
    shard = np.asarray(shard, dtype=np.int64)
    offset = np.asarray(offset, dtype=np.int64)
    size = np.asarray(size, dtype=np.int64)
    count = len(offset)
    shard_count = len(shard_sizes)
    if count == 0:
        empty = np.zeros(0, dtype=np.int64)
        return ExtentTable(empty, empty, empty, empty, empty, empty, empty, np.zeros(shard_count + 1, dtype=np.int64))
    new_shard = np.ones(count, dtype=bool)
    new_shard[1:] = shard[1:] != shard[:-1]
    base = offset[np.flatnonzero(new_shard)][np.cumsum(new_shard) - 1]
    bucket = (offset - base) // extent_bytes
    cut = new_shard.copy()
    cut[1:] |= bucket[1:] != bucket[:-1]
    # a sample that starts before its predecessor (never in a valid index) gets an extent of its own
    cut[1:] |= offset[1:] < offset[:-1] + size[:-1]
    first = np.flatnonzero(cut)
    stop = np.append(first[1:], count)
    last = stop - 1
    ext_shard = shard[first]
    end = np.minimum(align_up_array(offset[last] + size[last], alignment),
                     np.asarray(shard_sizes, dtype=np.int64)[ext_shard])
    end = np.maximum(end, offset[last] + size[last])
    of_sample = np.cumsum(cut) - 1
    shard_extents = np.searchsorted(ext_shard, np.arange(shard_count + 1), side="left").astype(np.int64)
    ordinal = np.arange(len(first), dtype=np.int64) - shard_extents[ext_shard]
    return ExtentTable(shard=ext_shard, start=offset[first], end=end, first=first.astype(np.int64),
                       stop=stop.astype(np.int64), ordinal=ordinal, of_sample=of_sample.astype(np.int64),
                       shard_extents=shard_extents)


class FetchPlan:
    """One process's read order as extents: which extent is needed first, next, ... and until when.

    Attributes:
        sequence: the extents in first-need order (each once).
        first_need, last_need: per extent (``-1`` when the order never reads it), the position in
            ``sequence`` terms of its first need, and the sample position of its last need.
        next_need(extent, position): the sample position of its next need (the eviction key).
    """

    def __init__(self, table: ExtentTable, indices: np.ndarray) -> None:
        extents = table.of_sample[np.asarray(indices, dtype=np.int64)]
        unique, first_pos = np.unique(extents, return_index=True)
        order = np.argsort(first_pos, kind="stable")
        self.sequence = unique[order]
        self.first_need = np.full(len(table), -1, dtype=np.int64)
        self.first_need[self.sequence] = np.arange(len(self.sequence), dtype=np.int64)
        #: sample position where each extent of the sequence is first needed
        self.sequence_sample = first_pos[order]
        self.last_need = np.full(len(table), -1, dtype=np.int64)
        if len(extents):
            reverse_unique, reverse_pos = np.unique(extents[::-1], return_index=True)
            self.last_need[reverse_unique] = len(extents) - 1 - reverse_pos
        # every need of every extent, by extent then position (CSR): the next need of an extent
        # after a position is one searchsorted in its slice
        self._need_positions = np.argsort(extents, kind="stable").astype(np.int64)
        self._need_starts = np.searchsorted(extents[self._need_positions], np.arange(len(table) + 1), side="left")

    def __len__(self) -> int:
        return len(self.sequence)

    def next_need(self, extent: int, position: int) -> int:
        """The first sample position at or after ``position`` that reads ``extent``, or -1 (never again)."""
        needs = self._need_positions[self._need_starts[extent]:self._need_starts[extent + 1]]
        k = int(np.searchsorted(needs, position, side="left"))
        return int(needs[k]) if k < len(needs) else -1

    def rank_of_sample(self, position: int) -> int:
        """How many sequence entries are first needed at or before sample ``position``."""
        return int(np.searchsorted(self.sequence_sample, position, side="right"))


def coalesce(table: ExtentTable, extents: list[int], request_bytes: int) -> list[list[int]]:
    """Group extents into range GETs: extents adjacent in one shard join up to ``request_bytes``.

    Groups come back in the order of their first extent in ``extents`` (the order of need).
    """
    if not extents:
        return []
    need = {e: k for k, e in enumerate(extents)}
    groups: list[list[int]] = []
    for e in sorted(extents, key=lambda x: (int(table.shard[x]), int(table.start[x]))):
        if groups:
            g = groups[-1]
            tail = g[-1]
            if (int(table.shard[tail]) == int(table.shard[e]) and int(table.end[tail]) <= int(table.start[e])
                    and tail + 1 == e and int(table.end[e]) - int(table.start[g[0]]) <= request_bytes):
                g.append(e)
                continue
        groups.append([e])
    groups.sort(key=lambda g: min(need[e] for e in g))
    return groups
