"""Duplicates and train/test leaks: exact copies (xxh3, confirmed by bytes) and near-duplicates
(a 128-bit perceptual hash, searched by multi-index hashing), within and across datasets.

- ``phash``: the perceptual hash of one image (a 1/8 DCT-scaled grey decode for JPEGs) and of a
  whole dataset;
- ``sidecar``: the hashes file kept beside the index (formats/SPEC.md §16), recomputed when stale;
- ``search``: near pairs among a million hashes without comparing all pairs;
- ``exact``: byte-identical samples from the index's checksums;
- ``report``: ``find_duplicates`` and the ``DuplicateReport`` (groups, leaks, counts, JSON, and
  the samples a view or a build leaves out).

The guide is docs/guides/duplicates.md; ``packer inspect DATASET --duplicates`` is the command.
"""

from __future__ import annotations

from .phash import FLIP_MASK, HASH_BITS, HashTable, hash_dataset, perceptual_hash
from .report import DEFAULT_THRESHOLD, DuplicateGroup, DuplicateReport, Member, find_duplicates
from .search import Pairs, near_pairs

__all__ = ["find_duplicates", "DuplicateReport", "DuplicateGroup", "Member", "DEFAULT_THRESHOLD",
           "perceptual_hash", "hash_dataset", "HashTable", "near_pairs", "Pairs", "HASH_BITS", "FLIP_MASK"]
