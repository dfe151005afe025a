"""``PackedDataLoader``: a DataLoader that reads a packer order and counts the batches the loop
received, so that its ``state_dict`` resumes exactly where training stopped.

Resuming mid-epoch
------------------
The position in an epoch is ``(seed, epoch, consumed)``, ``consumed`` counting samples globally
(see ``packer.order``), so it is valid for any number of workers, ranks and batch sizes. Every
reader keeps its place in a ``packer.order.EpochCursor``. The simple, safe wiring is
``PackedDataLoader``, which deals the order itself (a ``PackedBatchSampler`` over the dataset)
and counts the batches your loop received (a DataLoader prefetches, so a reader cannot know that
by itself)::

    loader = PackedDataLoader(dataset, batch_size=256, order=ReadOrder("random", seed=0), num_workers=8,
                              pin_memory=True, persistent_workers=True)
    if checkpoint:
        loader.load_state_dict(checkpoint["loader"])
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)        # keeps the loaded position for the loaded epoch
        for images, labels in loader:
            ...
            save({"loader": loader.state_dict()})

A loaded position is used once: the pass after ``load_state_dict`` reads the rest of the saved
epoch, and every later pass a whole epoch, of the epoch ``set_epoch`` selects or, in a loop that
never calls it, of the same epoch number again (as ``DistributedSampler`` does). Every packer
reader follows this rule (``packer.order``, "Passes after a resume").

With a plain ``DataLoader``, count yourself and say what you counted:
``batch_sampler.state_dict(batches_consumed=step)`` (its own batches),
``sampler.state_dict(samples_consumed=step * batch_size)`` for a ``PackedSampler``
(``batches_consumed`` on a sampler whose order has no batch size raises rather than resume
at the wrong place), ``dataset.state_dict(batches_consumed=step)`` for a
``PackedIterableDataset``, whose position lives in a small shared-memory tensor so that
``set_epoch``/``load_state_dict`` reach persistent workers. Without an argument a reader
reports what it handed out itself, which is exact only when it is iterated directly.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterator

import torch
import torch.utils.data as torch_data

from ..errors import OptionError
from ..order import ReadOrder, read_order_from
from .collate import collate
from .iterable import PackedIterableDataset
from .mapstyle import PackedDataset
from .samplers import PackedBatchSampler, PackedSampler

#: The DataLoader's arguments, by name (``PackedDataLoader`` reads which ones it was given).
_DATALOADER = inspect.signature(torch_data.DataLoader)

#: How ``PackedDataLoader`` runs its ``num_workers``: ``"auto"`` (threads of this process for a
#: dataset whose batches are copies of stored pixels, else worker processes), or either one.
WORKER_MODES = ("auto", "processes", "threads")

#: DataLoader arguments that run code in, or choose, worker processes: given, ``"auto"`` keeps the
#: processes (``persistent_workers`` and ``prefetch_factor`` mean nothing to threads and are dropped).
_PROCESS_ONLY = ("worker_init_fn", "multiprocessing_context")


class PackedDataLoader(torch_data.DataLoader):
    """A ``DataLoader`` over a packer order that knows how far it got: ``state_dict()`` with no arguments.

    Given a ``PackedDataset`` and no sampler, it deals the order itself: a ``PackedBatchSampler``
    of ``order`` with the loader's ``batch_size`` (a ``PackedSampler`` with ``batch_size=None``)::

        loader = PackedDataLoader(train, batch_size=64, order=ReadOrder("random", seed=0),
                                  num_workers=8, pin_memory=True)
        loader.load_state_dict(checkpoint["loader"])      # if resuming
        for epoch in range(loader.epoch, epochs):
            loader.set_epoch(epoch)
            for images, labels in loader:
                ...
                save({"loader": loader.state_dict()})

    It also reads a packer reader made beforehand: a ``PackedBatchSampler`` as ``batch_sampler``,
    a ``PackedIterableDataset`` as dataset, or a ``PackedSampler`` as ``sampler``; with the
    loader's ``batch_size`` that one is read through a ``PackedBatchSampler`` sharing its order and
    position (the sampler is not changed), so each global step takes the next ``world_size x
    batch_size`` samples of the epoch order and the block order keeps its locality. Whichever it
    reads, it counts the batches it handed to *your loop* (not what its workers prefetched), and
    its ``state_dict`` is that reader's position after them. ``loader.sampler`` is a
    ``PackedSampler`` of the order (``loader.sampler.set_epoch(epoch)`` works, the
    ``DistributedSampler`` habit).

    Args:
        dataset: a ``PackedDataset``, a ``PackedIterableDataset``, or any dataset read by a packer sampler.
        *args, **kwargs: every ``DataLoader`` argument. For a ``PackedDataset`` without a sampler:
            ``batch_size`` (default: the order's, else 1); ``drop_last=True`` is the order's drop
            rule; ``shuffle`` without ``order=``: ``True`` reads ``ReadOrder("random")``, else
            ``ReadOrder("sequential")``, as a DataLoader would.
        order: a ``packer.ReadOrder`` or a kind string, for a ``PackedDataset`` without a sampler
            (a sampler, batch sampler or iterable dataset has its own order).

    Raises:
        OptionError: no packer reader to track; ``order=`` beside a reader that has an order of its
            own, or beside ``shuffle=True``; an order or sampler whose batch size is not the
            loader's; a ``PackedIterableDataset`` whose batches are not the loader's
            (``batch_size=None`` for a batched one, the dataset's ``batch_size`` or None for
            ``batched=False``).
    """

    def __init__(self, dataset: Any, *args: Any, order: ReadOrder | str | None = None, worker_mode: str = "auto",
                 **kwargs: Any) -> None:
        given = _DATALOADER.bind(dataset, *args, **kwargs).arguments
        if worker_mode not in WORKER_MODES:
            raise OptionError(f"worker_mode must be one of {', '.join(WORKER_MODES)}, got {worker_mode!r}")
        sampler = _deal(given, order)
        self.threads = _threads(given, worker_mode)
        if self.threads:  # the batches are made here: DataLoader itself starts no process
            given["num_workers"] = 0
            given.pop("prefetch_factor", None)
            given.pop("persistent_workers", None)
        super().__init__(**given)
        self.worker_mode = "threads" if self.threads else "processes"
        if sampler is not None:
            # A DataLoader reading a batch sampler reports no sampler or batch size of its own, and
            # refuses to be told them; report the order's (loader.sampler.set_epoch, the
            # DistributedSampler habit, and loader.batch_size keep working).
            object.__setattr__(self, "sampler", sampler)
            object.__setattr__(self, "batch_size", self.batch_sampler.batch_size)
            object.__setattr__(self, "drop_last", self.batch_sampler.drop_last)
        reader = self._packer_reader()
        if isinstance(reader, PackedIterableDataset):
            wanted = None if reader.batched else reader.batch_size
            if self.batch_size not in (wanted, None):  # None: the loop receives the reader's items
                kind = "yields batches" if reader.batched else f"yields samples in batches of {reader.batch_size}"
                raise OptionError(f"the PackedIterableDataset {kind}, but the DataLoader's batch_size is "
                                  f"{self.batch_size}: pass batch_size={wanted} to the loader")
        self._yielded = 0

    def _packer_reader(self) -> Any:
        batch_sampler = self.batch_sampler
        if isinstance(batch_sampler, PackedBatchSampler):
            return batch_sampler
        if isinstance(self.sampler, PackedSampler):
            return self.sampler
        if isinstance(self.dataset, PackedIterableDataset):
            return self.dataset
        raise OptionError("PackedDataLoader tracks a packer reader: pass a PackedDataset (with order=), "
                          "batch_sampler=PackedBatchSampler(...), sampler=PackedSampler(...) or a PackedIterableDataset")

    def __iter__(self) -> Iterator[Any]:
        self._yielded = 0
        for batch in (self._thread_batches() if self.threads else super().__iter__()):
            self._yielded += 1  # counted as your loop receives it: prefetched batches are not consumed
            yield batch

    def _thread_batches(self) -> Iterator[Any]:
        """The batch sampler's batches, each made by ``load_batch`` on a thread of this process, in
        order, ``2 x threads`` in flight (as ``packer.threaded.ThreadedLoader`` makes them). The
        images tensor is allocated by this thread: memory the pool's threads allocated would go
        back to their own malloc arenas and fault in again for every batch."""
        dataset: PackedDataset = self.dataset
        pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix=f"packer-loader-{os.getpid()}")
        pending: deque[Future] = deque()
        batches = iter(self.batch_sampler)

        def submit() -> bool:
            indices = next(batches, None)
            if indices is None:
                return False
            pending.append(pool.submit(self._load, indices, dataset.fast_batch_buffer(len(indices))))
            return True

        try:
            more = True
            while True:
                while more and len(pending) < 2 * self.threads:
                    more = submit()
                if not pending:
                    return
                yield pending.popleft().result()  # a failed batch raises here, in order
        finally:  # a loop that stops early (break, exception) cancels what it will not use
            for future in pending:
                future.cancel()
            pool.shutdown(wait=True, cancel_futures=True)

    def _load(self, indices: Any, out: Any) -> Any:
        images, labels = self.dataset.load_batch(indices, out=out)
        if self.pin_memory and torch.cuda.is_available():  # as DataLoader: pinning needs a CUDA device
            images = images.pin_memory()
        return images, labels

    @property
    def epoch(self) -> int:
        return self._packer_reader().epoch

    @property
    def read_order(self) -> ReadOrder:
        """The order the loader reads (its reader's)."""
        return self._packer_reader().read_order

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (forwarded to the reader)."""
        self._packer_reader().set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The position after the batches this loader handed out in its current iteration."""
        reader = self._packer_reader()
        if isinstance(reader, PackedSampler) or (isinstance(reader, PackedIterableDataset) and not reader.batched):
            # the loop receives samples (batch_size=None), or batches of the loader's own size
            return reader.state_dict(samples_consumed=self._yielded * int(self.batch_size or 1))
        return reader.state_dict(batches_consumed=self._yielded)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the reader at a saved position (before iterating)."""
        self._packer_reader().load_state_dict(state)
        self._yielded = 0


def _threads(given: dict[str, Any], worker_mode: str) -> int:
    """How many threads of this process make the batches (0: the DataLoader's own way).

    ``"auto"`` takes threads only where they are known to be faster and mean the same: a
    ``PackedDataset`` whose batches are copies of stored pixels (``copies_batches``), read through
    a ``PackedBatchSampler`` with packer's ``collate``, and none of the arguments that only worker
    processes use. ``"threads"`` asks for them and is refused where they would not mean the same;
    it also takes a dataset that a fused transform decodes into one batch tensor without the GIL
    (``decodes_without_gil``: JPEGs under ``RandomResizedCrop``), which ``"auto"`` leaves to
    worker processes (see ``docs/performance.md``, the JPEG loader against its decode floor).
    """
    workers = given.get("num_workers", 0)
    if worker_mode == "processes" or not workers:
        return 0
    dataset, batch_sampler = given["dataset"], given.get("batch_sampler")
    reasons = []
    if not isinstance(dataset, PackedDataset):
        reasons.append("the dataset is not a PackedDataset")
    elif not isinstance(batch_sampler, PackedBatchSampler):
        reasons.append("the loader does not batch through a PackedBatchSampler")
    elif not dataset.copies_batches() and not (worker_mode == "threads" and dataset.decodes_without_gil()):
        reasons.append("its batches are decoded or transformed in Python (threads would share one GIL)")
    if given.get("collate_fn") not in (None, collate):
        reasons.append("collate_fn is not packer's collate")
    reasons += [f"{name}= is given (it is for worker processes)" for name in _PROCESS_ONLY
                if given.get(name) is not None]
    if not reasons:
        return int(workers)
    if worker_mode == "threads":
        raise OptionError(f"PackedDataLoader(worker_mode='threads'): {'; '.join(reasons)}; leave worker_mode "
                          f"'auto' (processes then) or pass worker_mode='processes'")
    return 0


def _deal(given: dict[str, Any], order: ReadOrder | str | None) -> PackedSampler | None:
    """Put the packer reader of a ``PackedDataLoader`` into ``given``, the DataLoader arguments it
    was called with: a batch sampler of ``order`` for a ``PackedDataset`` without a sampler, or one
    sharing a ``PackedSampler``'s order and position when the loader batches. Returns the
    ``PackedSampler`` the loader reports as its ``sampler`` when it made a batch sampler."""
    dataset, sampler = given["dataset"], given.get("sampler")
    if isinstance(dataset, PackedDataset) and sampler is None and given.get("batch_sampler") is None:
        shuffle = given.pop("shuffle", None)
        if shuffle and order is not None:
            raise OptionError("PackedDataLoader: shuffle=True and order= both say how to read; give the order "
                              "alone (order=ReadOrder('random', ...))")
        read_order = read_order_from(order, reader="PackedDataLoader",
                                     default=ReadOrder("random" if shuffle else "sequential"))
        if given.get("drop_last"):
            read_order = dataclasses.replace(read_order, drop_last=True)
        batch_size = given.pop("batch_size", read_order.batch_size or 1)
        given.pop("drop_last", None)
        if batch_size is None:  # no batching: the loop receives samples
            given["sampler"] = PackedSampler(dataset, order=read_order)
            given["batch_size"] = None
            return None
        read_order = read_order.resolved(batch_size=batch_size, reader="PackedDataLoader")
        given["batch_sampler"] = PackedBatchSampler(dataset, batch_size=batch_size, order=read_order)
        return given["batch_sampler"].sampler
    if order is not None:
        raise OptionError("PackedDataLoader: order= is for a PackedDataset without a sampler; the sampler, batch "
                          "sampler or PackedIterableDataset given reads an order of its own")
    if not isinstance(sampler, PackedSampler) or given.get("batch_sampler") is not None:
        return None
    batch_size = given.get("batch_size", sampler.batch_size or 1)
    if batch_size is None:  # the loop receives the sampler's samples
        return None
    if sampler.batch_size is not None and sampler.batch_size != batch_size:
        raise OptionError(f"the PackedSampler was given batch_size={sampler.batch_size} but the DataLoader's "
                          f"batch_size is {batch_size}: give both the same, or leave the sampler's out")
    read_order = dataclasses.replace(sampler.read_order, batch_size=batch_size,
                                     drop_last=sampler.read_order.drop_last or bool(given.get("drop_last")))
    for name in ("sampler", "batch_size", "drop_last"):
        given.pop(name, None)
    given["batch_sampler"] = PackedBatchSampler._sharing(sampler, read_order)
    return sampler
