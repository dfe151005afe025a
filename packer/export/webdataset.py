"""The ``webdataset`` export target: shards ``shard-000000.tar``, ... of ``samples_per_shard`` samples each.

A sample's members are consecutive in one shard: its image under its key (``<key>.<ext>``), a
``.cls`` member holding the label number (as WebDataset readers expect), declared fields as the
members a WebDataset build reads them from, and the ``.json``/``.txt`` metadata a WebDataset
build kept. Each shard is a deterministic tar (``export.tar``), fsynced before publishing.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .plan import SampleNamer
from .safewrite import StagedOutput
from .tar import open_tar, write_members

__all__ = ["write_webdataset", "shard_name"]


def shard_name(number: int) -> bytes:
    return b"shard-%06d.tar" % number


def write_webdataset(namer: SampleNamer, rows: np.ndarray, staged: StagedOutput, result: Any,
                     per_shard: int) -> None:
    """Write samples ``rows`` as WebDataset shards into the folder stage."""
    tree = staged.tree()
    shards = 0
    for first in range(0, len(rows), per_shard):
        with os.fdopen(tree.create(shard_name(shards)), "wb") as handle:
            with open_tar(handle) as archive:
                for sample in namer.planned(rows[first:first + per_shard]):
                    write_members(archive, namer, sample)
                    result.count(namer, sample)
            handle.flush()
            os.fsync(handle.fileno())
        shards += 1
    result.files = shards
