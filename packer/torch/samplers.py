"""Order-aware samplers: ``PackedSampler`` (indices) and ``PackedBatchSampler`` (batches of
indices), both dealing ranks from the epoch order of ``packer.order`` and resumable mid-epoch."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import torch.utils.data as torch_data

from ..errors import OptionError
from ..order import DEFAULT_BLOCK_BYTES, DEFAULT_WINDOW, CursorReader
from .epochs import _FollowsEpoch, _planned_dataset, _sampler_cursor, _seeded_crops

#: Indices a sampler converts to Python ints at a time (bounded, whatever the epoch length).
_YIELD_CHUNK = 4096


class PackedSampler(_FollowsEpoch, CursorReader, torch_data.Sampler):
    """Yields this rank's sample indices for one epoch (a drop-in for ``DistributedSampler``).

    The epoch order, the rank split and the pad/drop rule are those of ``packer.order``: each
    global step takes the next ``world_size x batch_size`` samples of the epoch order, and rank
    ``r`` the ``r``-th batch of them. ``PackedDataLoader`` tells the sampler its batch size (and
    refuses a sampler given another one). In a plain ``DataLoader`` give the loader's batch size as
    ``batch_size``: without it ranks take every ``world_size``-th sample like
    ``DistributedSampler``, which loses the block order's locality, and the position can only be
    saved as ``state_dict(samples_consumed=...)``.

    Args:
        data_source: a ``PackedDataset``, a ``packer`` dataset or index (block boundaries are
            measured in bytes from its index), or a sample count.
        order: ``"sequential"``, ``"random"`` or ``"block"``.
        seed: the run's seed; orders are functions of (seed, epoch).
        rank, world_size: default from ``torch.distributed`` when initialised, else 0 and 1.
        batch_size: the DataLoader's batch size (default: unknown, shares are per sample).
        drop_last: drop the end of the epoch order (full batches only) instead of padding.
        block_bytes, window: the block shuffle's block span and window (in blocks).
        block_samples: cut blocks by sample count instead of bytes.
    """

    def __init__(self, data_source: Any, *, order: str = "random", seed: int = 0, rank: int | None = None,
                 world_size: int | None = None, batch_size: int | None = None, drop_last: bool = False,
                 block_bytes: int = DEFAULT_BLOCK_BYTES, window: int = DEFAULT_WINDOW,
                 block_samples: int | None = None) -> None:
        #: The DataLoader batch size this sampler was told, or None.
        self.batch_size = batch_size
        self._crops = _seeded_crops(data_source)
        self._reads = _planned_dataset(data_source)
        self.cursor = _sampler_cursor(data_source, order=order, seed=seed, rank=rank, world_size=world_size,
                                      batch_size=1 if batch_size is None else batch_size, drop_last=drop_last,
                                      block_bytes=block_bytes, window=window, block_samples=block_samples,
                                      count_samples=True)

    def use_batch_size(self, batch_size: int) -> None:
        """Deal batch-aligned shares of ``batch_size`` (the DataLoader's): what ``PackedDataLoader``
        calls. The position (epoch, loaded start) is kept: it does not depend on the batch size.

        Raises:
            OptionError: the sampler was given another batch size, or a bad one.
        """
        if self.batch_size is not None and self.batch_size != batch_size:
            raise OptionError(f"the PackedSampler was given batch_size={self.batch_size} but the DataLoader's "
                              f"batch_size is {batch_size}: give both the same, or leave the sampler's out")
        self.cursor.read_order = dataclasses.replace(self.cursor.read_order, batch_size=batch_size)
        self.batch_size = batch_size

    def __len__(self) -> int:
        return self.share().per_rank

    def __iter__(self) -> Iterator[int]:
        indices = self.cursor.begin().indices
        if self._reads is not None:  # this rank's order: a dataset in object storage fetches ahead of it
            self._reads.plan_reads(indices)
        for begin in range(0, len(indices), _YIELD_CHUNK):
            if self._reads is not None:
                self._reads.reads_advanced(begin)
            chunk = indices[begin:begin + _YIELD_CHUNK].tolist()
            for i in chunk:
                self.cursor.handed_out += 1
                yield i

    def state_dict(self, *, batches_consumed: int | None = None,
                   samples_consumed: int | None = None) -> dict[str, Any]:
        """The resumable position; see ``CursorReader.state_dict``.

        Raises:
            OptionError: ``batches_consumed`` on a sampler that was not told the batch size: it
                yields samples, and counting DataLoader batches as samples would resume at the
                wrong place.
        """
        if batches_consumed is not None and self.batch_size is None:
            raise OptionError(
                "PackedSampler yields samples and does not know your DataLoader's batch size, so "
                "batches_consumed is ambiguous: pass samples_consumed=batches * batch_size, create the "
                "sampler with batch_size=<the DataLoader's batch_size>, or use packer.torch.PackedDataLoader, "
                "which counts the batches it hands out")
        if batches_consumed is not None:
            samples_consumed, batches_consumed = batches_consumed * int(self.batch_size or 1), None
        return super().state_dict(samples_consumed=samples_consumed)


class PackedBatchSampler(_FollowsEpoch, CursorReader, torch_data.BatchSampler):
    """Yields this rank's batches of sample indices: use as ``DataLoader(batch_sampler=...)``.

    A ``torch.utils.data.BatchSampler`` (``isinstance`` holds; ``.sampler``, ``.batch_size`` and
    ``.drop_last`` are what frameworks read), driven by the same order as ``PackedSampler``:
    ``.sampler`` is a ``PackedSampler`` sharing this one's position, so ``set_epoch`` on either
    moves both. Same arguments as ``PackedSampler`` (``batch_size`` required). With
    ``drop_last=False`` every rank's last batch may be short, by the same amount on every rank.
    """

    def __init__(self, data_source: Any, *, batch_size: int, order: str = "random", seed: int = 0,
                 rank: int | None = None, world_size: int | None = None, drop_last: bool = False,
                 block_bytes: int = DEFAULT_BLOCK_BYTES, window: int = DEFAULT_WINDOW,
                 block_samples: int | None = None) -> None:
        # torch's BatchSampler.__init__ wraps a sampler of its own; this one deals batches itself.
        settings = dict(order=order, seed=seed, rank=rank, world_size=world_size, drop_last=drop_last,
                        block_bytes=block_bytes, window=window, block_samples=block_samples)
        self._crops = _seeded_crops(data_source)
        self._reads = _planned_dataset(data_source)
        self.cursor = _sampler_cursor(data_source, batch_size=batch_size, count_samples=False, **settings)
        self.sampler = PackedSampler(data_source, batch_size=batch_size, **settings)
        self.sampler.cursor.position = self.cursor.position  # one position for both
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __len__(self) -> int:
        return self.share().num_batches

    def __iter__(self) -> Iterator[list[int]]:
        plan = self.cursor.begin()
        if self._reads is not None:  # this rank's order: a dataset in object storage fetches ahead of it
            self._reads.plan_reads(plan.indices)
        for k in range(plan.num_batches):
            self.cursor.handed_out += 1
            batch = plan.batch(k)
            if self._reads is not None:
                self._reads.reads_advanced(int(plan.batch_bounds[k]))
            yield batch.tolist()
