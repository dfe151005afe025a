"""An in-process batch loader: the main process and a small thread pool, no worker processes.

For small samples (CIFAR's 32x32, Tiny ImageNet's 64x64, raw pixels) a DataLoader's worker
processes cost more than they give: each batch crosses a process boundary (pickled indices one
way, a shared-memory tensor and its file descriptor the other way) and every worker pays its
own start-up and page-table costs. The batched raw path (``packer.rawcrop``: one gather, one
vectorised crop-resize per batch) spends its time in compiled code that releases the GIL
(packer's ``_rawresample`` gather and resample, or numpy's and torch's kernels without it), so a
few threads of the training process keep up with it.

``ThreadedLoader`` runs ``PackedDataset.load_batch`` (``packer.torch``: ``__getitems__`` +
``collate``, without per-sample objects on raw datasets) for each batch in a
``ThreadPoolExecutor`` of ``threads`` threads, keeping ``prefetch`` batches in flight, and
yields them in order. The order, the rank split, the pad/drop rule and the
resumable position are ``packer.order``'s (``ReadOrder.plan``), exactly as for
``PackedBatchSampler``: the loader's ``k``-th batch is the rank's ``k``-th batch. Because
nothing is prefetched *past the caller's view* (a batch counts as consumed when it is yielded),
``state_dict()`` needs no ``batches_consumed`` argument: it is exact as is.

A seeded fused transform (``RandomResizedCrop(32, seed=0)``) gets ``set_epoch`` from the
loader, so each sample's crop is a function of (seed, epoch, index) whatever the number of
threads; an unseeded one draws from one generator shared by the threads (thread-safe, not
reproducible across thread counts).

Example::

    from packer import ReadOrder
    from packer.threaded import ThreadedLoader
    from packer.transforms import RandomResizedCrop

    loader = ThreadedLoader("packed/cifar-raw32", batch_size=512, order=ReadOrder("random", seed=0),
                            decode=RandomResizedCrop(32, scale=(0.35, 1.0), seed=0), threads=2)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:          # (512, 32, 32, 3) uint8, (512,) int64
            ...
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator

import numpy as np

from .errors import OptionError
from .order import CursorReader, EpochCursor, IndexSpace, ReadOrder, read_order_from

__all__ = ["ThreadedLoader", "DEFAULT_THREADS"]

#: Threads when none are asked for: two (the batched raw path saturates about that many cores;
#: more threads mostly contend with the training loop).
DEFAULT_THREADS = 2
#: The loader's order when none is given.
DEFAULT_ORDER = ReadOrder("random")


class ThreadedLoader(CursorReader):
    """Batches of a packed dataset, made by a thread pool inside this process, in order.

    Args:
        source: the dataset folder, or an open ``packer.dataset.Dataset``.
        batch_size: samples per batch on each rank.
        decode, layout, transform, target_transform: as for ``PackedDataset``: with a fused
            transform from ``packer.transforms`` (or ``decode=True`` on a ``raw`` dataset) each
            batch is decoded or cropped straight into one channels-last tensor: ``(N, H, W, C)``
            with ``layout="HWC"`` (the default here, kept from earlier versions), or an ``(N, C,
            H, W)`` view of the same memory with ``"CHW"`` (what ``PackedDataset`` gives by
            default); either costs the same.
        order: a ``packer.ReadOrder`` (kind, seed, ``drop_last``, rank and world size, block
            settings; its ``batch_size`` None or ``batch_size``), or a kind string; default
            ``ReadOrder("random")``. Rank and world size default from ``torch.distributed`` when
            initialised, else 0 and 1.
        threads: worker threads (default ``DEFAULT_THREADS``).
        prefetch: batches in flight (default ``2 * threads``).
        backend, verify_checksums: as for ``packer.open_dataset``.
        pin_memory: pin each batch's images (for asynchronous copies to a GPU); with
            ``fields=``, every tensor of the dict batch (not those inside per-sample lists).
        fields, multi_hot, geometry: what a sample holds, as for ``PackedDataset``; with any
            other ``fields`` than ``("image", "label")`` batches are dicts.
        collate_fn: collates a batch of dict samples (default ``packer.torch.collate``;
            ``PaddedCollate()`` pads the variable fields).
        **deprecated: the order keywords of earlier releases (``seed=``, ``rank=``, ``world_size=``,
            ``drop_last=``, ``block_bytes=``, ``window=``, ``block_samples=``): still accepted for
            one release, with a ``DeprecationWarning``.

    Raises:
        OptionError: a bad thread or prefetch count, an order whose batch size is not
            ``batch_size`` (and whatever ``ReadOrder`` and ``PackedDataset`` refuse).
    """

    def __init__(self, source: Any, *, batch_size: int, order: ReadOrder | str | None = None, decode: Any = True,
                 layout: str = "HWC", transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[Any], Any] | None = None, threads: int = DEFAULT_THREADS,
                 prefetch: int | None = None, backend: str = "mmap", verify_checksums: bool = False,
                 pin_memory: bool = False, fields: Any = ("image", "label"), multi_hot: Any = (),
                 geometry: Any = None, collate_fn: Callable[[Any], Any] | None = None, **deprecated: Any) -> None:
        from .torch import PackedDataset  # torch is optional: imported here

        read_order = read_order_from(order, deprecated, reader="ThreadedLoader", default=DEFAULT_ORDER)
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise OptionError(f"threads must be a positive integer, got {threads!r}")
        prefetch = 2 * threads if prefetch is None else prefetch
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise OptionError(f"prefetch must be a positive integer, got {prefetch!r}")
        self.dataset = PackedDataset(source, decode=decode, layout=layout, transform=transform,
                                     target_transform=target_transform, backend=backend,
                                     verify_checksums=verify_checksums, fields=fields, multi_hot=multi_hot,
                                     geometry=geometry)
        self.collate_fn = collate_fn
        self._decode = decode
        self.threads = threads
        self.prefetch = prefetch
        self.pin_memory = bool(pin_memory)
        # The position rules are every reader's (packer.order.EpochCursor): a loaded position is
        # used by the one pass that follows the load. Batches count as handed out when yielded.
        self.cursor = EpochCursor(read_order.resolved(batch_size=batch_size, reader="ThreadedLoader"),
                                  IndexSpace(self.dataset.dataset))

    # --- position: packer.order.CursorReader over self.cursor (the rules of packer.torch's readers) ---
    def __len__(self) -> int:
        return self.share().num_batches

    def state_dict(self, batches_consumed: int | None = None) -> dict[str, Any]:  # type: ignore[override]
        """The resumable position (``packer.order``'s state; valid for any world size or threads).

        Args:
            batches_consumed: batches consumed since this epoch's iteration started; default
                the batches this loader has yielded, which is exact (nothing is handed out early).
        """
        return self.cursor.state_dict(batches=batches_consumed)

    # --- iteration ---
    def _load(self, indices: np.ndarray, out: Any) -> Any:
        batch = self.dataset.load_batch(indices, collate_fn=self.collate_fn, out=out)
        if isinstance(batch, dict):  # fields=: pin every tensor of the dict batch
            if self.pin_memory:
                batch = {name: value.pin_memory() if hasattr(value, "pin_memory") else value
                         for name, value in batch.items()}
            return batch
        images, labels = batch
        if self.pin_memory and hasattr(images, "pin_memory"):
            images = images.pin_memory()
        return images, labels

    def _batch_buffer(self, count: int) -> Any:
        """The images tensor of a batch on the batched raw path, allocated by the iterating thread.

        Batches are freed by the training loop's thread: memory the pool's threads allocated would
        go back to their own malloc arenas, which glibc trims eagerly, so every batch would fault
        its pages in again: 190-230 page faults per 1.5 MB batch of 32x32 raw pixels against
        26-54 this way, and 1.15 against 0.42-0.66 ms of CPU per batch read (measured here).
        """
        return self.dataset.fast_batch_buffer(count)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        if getattr(self._decode, "seed", None) is not None and hasattr(self._decode, "set_epoch"):
            self._decode.set_epoch(self.epoch)  # seeded crops follow the loader's epoch
        plan = self.cursor.begin()
        reads = self.dataset.dataset  # a dataset in object storage fetches the rank's order ahead
        reads.plan_reads(plan.indices)
        pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix=f"packer-{os.getpid()}")
        pending: deque[Future] = deque()
        try:
            submitted = 0
            for k in range(plan.num_batches):
                while submitted < plan.num_batches and len(pending) < self.prefetch:
                    indices = plan.batch(submitted)
                    pending.append(pool.submit(self._load, indices, self._batch_buffer(len(indices))))
                    submitted += 1
                reads.reads_advanced(int(plan.batch_bounds[submitted]))
                batch = pending.popleft().result()  # a failed batch raises here, in order
                self.cursor.handed_out = k + 1
                yield batch
        finally:  # a loop that stops early (break, exception) cancels what it will not use
            for future in pending:
                future.cancel()
            pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        self.dataset.close()

    def __enter__(self) -> "ThreadedLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
