"""Order-aware samplers: ``PackedSampler`` (indices) and ``PackedBatchSampler`` (batches of
indices), both dealing ranks from the epoch order of ``packer.order`` and resumable mid-epoch."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import torch.utils.data as torch_data

from ..deprecation import warn_deprecated
from ..errors import OptionError
from ..order import ORDER_KEYWORDS, CursorReader, EpochCursor, ReadOrder, read_order_from, sample_space
from .epochs import _FollowsEpoch, _planned_dataset, _seeded_crops

#: Indices a sampler converts to Python ints at a time (bounded, whatever the epoch length).
_YIELD_CHUNK = 4096
#: The samplers' order when none is given.
DEFAULT_ORDER = ReadOrder("random")
#: ``PackedSampler``'s old order keywords: the common ones, and the DataLoader's batch size.
_SAMPLER_KEYWORDS = {**ORDER_KEYWORDS, "batch_size": "batch_size"}


class PackedSampler(_FollowsEpoch, CursorReader, torch_data.Sampler):
    """Yields this rank's sample indices for one epoch (a drop-in for ``DistributedSampler``).

    The epoch order, the rank split and the pad/drop rule are those of ``packer.order``: each
    global step takes the next ``world_size x batch_size`` samples of the epoch order, and rank
    ``r`` the ``r``-th batch of them. ``PackedDataLoader`` reads a ``PackedSampler`` given with its
    batch size through a ``PackedBatchSampler`` sharing the sampler's order and position. In a plain
    ``DataLoader`` give the loader's batch size in the order (``order=ReadOrder(batch_size=...)``):
    without it ranks take every ``world_size``-th sample like ``DistributedSampler``, which loses
    the block order's locality, and the position can only be saved as
    ``state_dict(samples_consumed=...)``.

    Args:
        data_source: a ``PackedDataset``, a ``packer`` dataset or index (block boundaries are
            measured in bytes from its index), a sample space (``packer.order.SampleSpace``), or a
            sample count.
        order: a ``packer.ReadOrder`` (kind, seed, the DataLoader's ``batch_size``, ``drop_last``,
            rank and world size, block settings), or a kind string; default ``ReadOrder("random")``.
            Rank and world size default from ``torch.distributed`` when initialised, else 0 and 1.
        **deprecated: the order keywords of earlier releases (``seed=``, ``rank=``, ``world_size=``,
            ``batch_size=``, ``drop_last=``, ``block_bytes=``, ``window=``, ``block_samples=``):
            still accepted for one release, with a ``DeprecationWarning``.
    """

    def __init__(self, data_source: Any, *, order: ReadOrder | str | None = None, **deprecated: Any) -> None:
        read_order = read_order_from(order, deprecated, reader="PackedSampler", default=DEFAULT_ORDER,
                                     keywords=_SAMPLER_KEYWORDS)
        self._crops = _seeded_crops(data_source)
        self._reads = _planned_dataset(data_source)
        self.cursor = EpochCursor(read_order.resolved(), sample_space(data_source), count_samples=True)

    @classmethod
    def _over(cls, cursor: EpochCursor, crops: Any, reads: Any) -> "PackedSampler":
        """A sampler of ``cursor``'s order and space, sharing its position."""
        sampler = cls.__new__(cls)
        sampler._crops, sampler._reads = crops, reads
        sampler.cursor = EpochCursor(cursor.read_order, cursor.space, position=cursor.position, count_samples=True)
        return sampler

    @property
    def batch_size(self) -> int | None:
        """The DataLoader batch size the order deals in (``read_order.batch_size``), or None."""
        return self.read_order.batch_size

    def use_batch_size(self, batch_size: int) -> None:
        """Deprecated: give the batch size in ``order=ReadOrder(batch_size=...)``, or pass the sampler
        to ``PackedDataLoader`` with the loader's ``batch_size`` (it reads it through a
        ``PackedBatchSampler`` that shares the sampler's order and position).

        Raises:
            OptionError: the sampler was given another batch size, or a bad one.
        """
        warn_deprecated("PackedSampler.use_batch_size() is deprecated and goes in the next release: give the batch "
                        "size in order=packer.ReadOrder(batch_size=...), or pass the sampler to PackedDataLoader")
        if self.batch_size is not None and self.batch_size != batch_size:
            raise OptionError(f"the PackedSampler was given batch_size={self.batch_size} but the DataLoader's "
                              f"batch_size is {batch_size}: give both the same, or leave the sampler's out")
        self.cursor.read_order = dataclasses.replace(self.cursor.read_order, batch_size=batch_size)

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
            OptionError: ``batches_consumed`` on a sampler whose order has no batch size: it
                yields samples, and counting DataLoader batches as samples would resume at the
                wrong place.
        """
        if batches_consumed is not None and self.batch_size is None:
            raise OptionError(
                "PackedSampler yields samples and does not know your DataLoader's batch size, so "
                "batches_consumed is ambiguous: pass samples_consumed=batches * batch_size, create the "
                "sampler with order=ReadOrder(batch_size=<the DataLoader's batch_size>), or use "
                "packer.torch.PackedDataLoader, which counts the batches it hands out")
        if batches_consumed is not None:
            samples_consumed, batches_consumed = batches_consumed * int(self.batch_size or 1), None
        return super().state_dict(samples_consumed=samples_consumed)


class PackedBatchSampler(_FollowsEpoch, CursorReader, torch_data.BatchSampler):
    """Yields this rank's batches of sample indices: use as ``DataLoader(batch_sampler=...)``.

    A ``torch.utils.data.BatchSampler`` (``isinstance`` holds; ``.sampler``, ``.batch_size`` and
    ``.drop_last`` are what frameworks read), driven by the same order as ``PackedSampler``:
    ``.sampler`` is a ``PackedSampler`` sharing this one's order and position, so ``set_epoch`` on
    either moves both. With ``drop_last=False`` every rank's last batch may be short, by the same
    amount on every rank.

    Args:
        data_source: as for ``PackedSampler``.
        batch_size: samples per batch on each rank.
        order: a ``packer.ReadOrder`` or a kind string, as for ``PackedSampler``; its
            ``batch_size`` is None or ``batch_size``.
        **deprecated: the order keywords of earlier releases, as for ``PackedSampler``.

    Raises:
        OptionError: the order's batch size is not ``batch_size``.
    """

    def __init__(self, data_source: Any, *, batch_size: int, order: ReadOrder | str | None = None,
                 **deprecated: Any) -> None:
        # torch's BatchSampler.__init__ wraps a sampler of its own; this one deals batches itself.
        read_order = read_order_from(order, deprecated, reader="PackedBatchSampler", default=DEFAULT_ORDER)
        cursor = EpochCursor(read_order.resolved(batch_size=batch_size, reader="PackedBatchSampler"),
                             sample_space(data_source))
        self._share(cursor, _seeded_crops(data_source), _planned_dataset(data_source))

    @classmethod
    def _sharing(cls, sampler: PackedSampler, order: ReadOrder) -> "PackedBatchSampler":
        """Batches of ``order`` (``sampler``'s, with a batch size) over ``sampler``'s space, sharing
        its position: what ``PackedDataLoader`` reads a ``PackedSampler`` through."""
        batches = cls.__new__(cls)
        cursor = EpochCursor(order, sampler.cursor.space, position=sampler.cursor.position)
        batches._share(cursor, sampler._crops, sampler._reads)
        return batches

    def _share(self, cursor: EpochCursor, crops: Any, reads: Any) -> None:
        self._crops, self._reads, self.cursor = crops, reads, cursor
        self.sampler = PackedSampler._over(cursor, crops, reads)  # one order, one position for both

    @property
    def batch_size(self) -> int:
        """Samples per batch on each rank (the order's)."""
        return int(self.read_order.batch_size)  # type: ignore[arg-type]  # resolved: never None

    @property
    def drop_last(self) -> bool:
        """Whether each rank gets only full batches (the order's drop rule)."""
        return self.read_order.drop_last

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
