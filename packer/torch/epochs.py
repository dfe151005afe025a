"""What every reader does with epochs: the epoch cursor of a sampler (its order, rank share and
blocks), and following ``set_epoch`` together with the dataset's seeded crops."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dataset import DatasetIndex
from ..errors import OptionError
from ..order import DEFAULT_BLOCK_SAMPLES, EpochCursor, ReadOrder, index_blocks, uniform_blocks
from .runtime import resolve_rank


def _blocks_of(source: Any, order: str, block_bytes: int,
               block_samples: int | None) -> tuple[int, np.ndarray | None]:
    """(sample count, block boundaries for the block order) of a dataset, an index, or a length."""
    inner = getattr(source, "dataset", None)  # a PackedDataset or PackedIterableDataset: its packer dataset
    if isinstance(inner, DatasetIndex):
        source = inner
    if isinstance(source, (int, np.integer)) and not isinstance(source, bool):
        count = int(source)
    else:
        try:
            count = len(source)
        except TypeError:
            raise OptionError(f"expected a packer dataset or a sample count, got {type(source).__name__}") from None
    if order != "block":
        return count, None
    if isinstance(source, DatasetIndex) and block_samples is None:
        ix = source.index
        return count, index_blocks(ix.offset, ix.size, ix.shard, block_bytes)
    return count, uniform_blocks(count, block_samples or DEFAULT_BLOCK_SAMPLES)


def _sampler_cursor(data_source: Any, *, order: str, seed: int, rank: int | None, world_size: int | None,
                    batch_size: int, drop_last: bool, block_bytes: int, window: int,
                    block_samples: int | None, count_samples: bool) -> EpochCursor:
    num_samples, blocks = _blocks_of(data_source, order, block_bytes, block_samples)
    read_order = ReadOrder(kind=order, seed=seed, block_bytes=block_bytes, window=window,
                           batch_size=batch_size, drop_last=drop_last)
    rank, world_size = resolve_rank(rank, world_size)
    return EpochCursor(read_order, num_samples, rank=rank, world_size=world_size, blocks=blocks,
                       count_samples=count_samples)


def _seeded_crops(source: Any) -> Any:
    """The seeded fused transform (``decode=RandomResizedCrop(..., seed=)``) of a packer dataset,
    or None: its draws are a function of (seed, epoch, index), so it must follow the epoch."""
    from ..transforms import DecodeTransform

    decode = getattr(getattr(source, "_pipeline", None), "decode", None)
    return decode if isinstance(decode, DecodeTransform) and getattr(decode, "seed", None) is not None else None


def _planned_dataset(source: Any) -> Any:
    """The ``packer.dataset.Dataset`` under ``source`` (a ``PackedDataset`` or a dataset), or None:
    the reader tells it the order it will read (``plan_reads``), which a dataset in object storage
    prefetches; a sample count has none."""
    for candidate in (source, getattr(source, "dataset", None)):
        if hasattr(candidate, "plan_reads") and hasattr(candidate, "reads_advanced"):
            return candidate
    return None


class _FollowsEpoch:
    """``set_epoch`` and ``load_state_dict`` also move the dataset's seeded crops: a loop that moves
    only the sampler (the DistributedSampler habit), or resumes without calling ``set_epoch``, would
    otherwise train on epoch 0's crops."""

    _crops: Any = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration, and of the dataset's seeded crops if any."""
        super().set_epoch(epoch)  # type: ignore[misc]
        if self._crops is not None:
            self._crops.set_epoch(epoch)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved position (``CursorReader.load_state_dict``); the crops follow its epoch."""
        super().load_state_dict(state)  # type: ignore[misc]
        if self._crops is not None:
            self._crops.set_epoch(self.epoch)  # type: ignore[attr-defined]
