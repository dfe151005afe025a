"""The ``folder`` export target: one file per entry under OUT (class folders, side files)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .plan import SampleNamer
from .safewrite import StagedOutput

__all__ = ["write_folder"]


def write_folder(namer: SampleNamer, rows: np.ndarray, staged: StagedOutput, result: Any, per_shard: int) -> None:
    """Write every entry of samples ``rows`` into the folder stage (``safewrite.SafeTree``)."""
    tree = staged.tree()
    for sample in namer.planned(rows):
        for entry in sample.entries:
            tree.write(entry.name, namer.body(sample, entry))
        result.count(namer, sample)
    result.files = tree.files
