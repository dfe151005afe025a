"""Exact duplicates: samples whose stored bytes are identical, found from the index's xxh3.

Every sample's payload xxh3 and size are already in the index (SPEC §5), so candidates cost no
read: samples are grouped by (checksum, size) with one sort over every dataset's columns. xxh3
is not cryptographic, and an index can be edited, so a candidate group is then confirmed by
reading its members' bytes (through the dataset's read API, local or remote) and comparing them:
only byte-identical samples are reported, and a forged or accidental checksum collision splits
into groups of equal bytes (or none).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["exact_groups"]


def exact_groups(datasets: Sequence[Any]) -> list[list[tuple[int, int]]]:
    """Groups of byte-identical samples across ``datasets`` (open ``Dataset`` objects).

    Returns:
        Each group a sorted list of ``(dataset position, sample number)``, at least two members;
        groups sorted by their first member.
    """
    checksums = np.concatenate([np.asarray(ds.index.checksum, dtype=np.uint64) for ds in datasets] or
                               [np.zeros(0, np.uint64)])
    sizes = np.concatenate([np.asarray(ds.index.size, dtype=np.uint64) for ds in datasets] or [np.zeros(0, np.uint64)])
    owner = np.concatenate([np.full(len(ds), position, dtype=np.int64) for position, ds in enumerate(datasets)] or
                           [np.zeros(0, np.int64)])
    sample = np.concatenate([np.arange(len(ds), dtype=np.int64) for ds in datasets] or [np.zeros(0, np.int64)])
    if len(checksums) < 2:
        return []
    order = np.lexsort((sample, owner, sizes, checksums))
    same = (checksums[order][1:] == checksums[order][:-1]) & (sizes[order][1:] == sizes[order][:-1])
    starts = np.flatnonzero(np.concatenate([[True], ~same]))
    ends = np.concatenate([starts[1:], [len(order)]])
    groups: list[list[tuple[int, int]]] = []
    for start, end in zip(starts.tolist(), ends.tolist()):
        if end - start < 2:
            continue
        members = [(int(owner[k]), int(sample[k])) for k in order[start:end]]
        groups.extend(_confirm(datasets, members))
    return sorted(groups)


def _confirm(datasets: Sequence[Any], members: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Split one candidate group into groups of equal bytes (members in order; singles dropped)."""
    by_bytes: dict[bytes, list[tuple[int, int]]] = {}
    for position, number in members:
        by_bytes.setdefault(datasets[position].read(number), []).append((position, number))
    return [group for group in by_bytes.values() if len(group) > 1]
