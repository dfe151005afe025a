"""``--reject-duplicates``: a listed file whose bytes are those of a file listed before it (or of a
sample already in the dataset, for ``packer append``) is rejected as ``duplicate-content``.

Applied to the listing before the plan (``plan.make_plan``), so every door (folders, manifests,
archives, Parquet, COCO, samples written from Python) gets it, the plan's shards hold only what
is packed, and a resumed build or a split build's parts reuse the decision saved in the plan.

Which copy is kept: the first in the listing's order (the source's sorted order, before the
seeded shuffle), so the kept file does not depend on ``--seed``; each rejection names it. For
``append``, a sample already in the dataset is always the one kept.

Cost. Only files whose listed size another file (or an existing sample) shares can be copies, so
only those are read: once to hash (xxh3, streamed, nothing kept), and the members of a group of
equal (size, xxh3) once more to compare their bytes, so a checksum collision is never a
duplicate (as ``packer.duplicates.exact`` confirms its groups). Files over ``--max-file-size`` and
files that cannot be read now are left to packing, which rejects them with their own reason.

Against an existing dataset the stored payloads are compared: with the ``passthrough`` codec (the
default) those are the source files' bytes; a re-encoding codec stores other bytes, so a new file
is then compared with the other new files only (in practice: nothing in the dataset matches it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import format as fmt
from .._internal.files import FolderReader
from ..sources import Rejection, SourceListing, select_rows
from ..sources.members import MemberReader
from .sourcefiles import read_source

__all__ = ["REASON", "reject_duplicate_content"]

REASON = "duplicate-content"


def reject_duplicate_content(listing: SourceListing, *, max_file_size: int, existing: Any = None) -> SourceListing:
    """``listing`` without the files whose bytes an earlier listed file (or an ``existing``
    dataset's sample) has; each is added to ``listing.rejected`` as ``duplicate-content``.

    Args:
        max_file_size: files listed larger are not read (packing rejects them).
        existing: an open ``packer.dataset.Dataset`` being appended to, or None.
    """
    count = len(listing)
    sizes = np.asarray(listing.sizes, dtype=np.uint64)
    old_sizes = np.asarray(existing.index.size, dtype=np.uint64) if existing is not None else np.zeros(0, np.uint64)
    values, counts = np.unique(sizes, return_counts=True)
    shared = values[counts > 1]
    candidates = np.flatnonzero((np.isin(sizes, shared) | np.isin(sizes, old_sizes)) & (sizes <= max_file_size))
    if not len(candidates):
        return listing
    old_by_content: dict[tuple[int, int], list[int]] = {}
    if existing is not None:
        old_checksums = np.asarray(existing.index.checksum, dtype=np.uint64).tolist()
        for sample, size in enumerate(old_sizes.tolist()):
            old_by_content.setdefault((size, old_checksums[sample]), []).append(sample)
    keep = np.ones(count, dtype=bool)
    with MemberReader(listing.members) as archive, FolderReader(listing.root) as files:
        groups: dict[tuple[int, int], list[int]] = {}
        for row in candidates.tolist():  # pass 1: hash, keep nothing
            data = read_source(listing, row, archive, files)
            if data is not None:
                groups.setdefault((len(data), fmt.checksum(data)), []).append(row)
        for content, rows in groups.items():  # pass 2: compare the bytes of real candidates only
            olds = old_by_content.get(content, [])
            if len(rows) < 2 and not olds:
                continue
            kept: list[tuple[bytes, str]] = [(bytes(existing.read(sample)), f"{existing.key(sample)!r}, already "
                                              f"in the dataset") for sample in olds]
            for row in rows:
                data = read_source(listing, row, archive, files)
                if data is None:
                    continue
                same = next((name for held, name in kept if held == data), None)
                if same is None:
                    kept.append((data, f"{listing.key(row)!r}, which is kept"))
                else:
                    keep[row] = False
                    listing.rejected.append(Rejection(listing.key(row), REASON, f"the same bytes as {same}"))
    return listing if keep.all() else select_rows(listing, keep)
