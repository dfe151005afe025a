"""``PackedIterableDataset``: reads the epoch order itself and splits each rank's batches across
DataLoader workers, with whole-block read-ahead; its position lives in shared memory so that
``set_epoch``/``load_state_dict`` reach persistent workers."""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
import torch.utils.data as torch_data

from ..codecs import check_decodable, dataset_max_pixels
from ..dataset import as_sample_indices
from ..errors import OptionError
from ..order import POSITION_SLOTS, CursorReader, EpochCursor, IndexSpace, Position, RankPlan, ReadOrder, read_order_from
from .collate import collate
from .epochs import _FollowsEpoch, _seeded_crops
from .fieldplan import DEFAULT_FIELDS
from .mapstyle import PackedDataset
from .pipeline import _Pipeline, _raw_fast_batch
from .runtime import BatchPool, DecodeFn, PathOrDataset, _empty, _labels_in, _open, _SharedPair

#: ``PackedIterableDataset``'s order when none is given: the block shuffle, read a block at a time.
DEFAULT_ORDER = ReadOrder("block")

#: Blocks a worker remembers having asked the kernel to read ahead (a small, fixed set).
_ADVISED_BLOCKS = 256


def _worker_share(plan: RankPlan, worker: int, num_workers: int) -> tuple[np.ndarray, np.ndarray]:
    """The indices and batch bounds of one worker's batches (``RankPlan.worker_batches``), compact.

    A worker keeps only its own share of the epoch (int32 when the dataset allows), not the
    whole order, and hands the temporaries of the order back to the OS.
    """
    batches = [plan.batch(k) for k in plan.worker_batches(worker, num_workers)]
    dtype = np.int32 if plan.share.num_samples < 2**31 else np.int64
    indices = np.concatenate(batches).astype(dtype) if batches else np.zeros(0, dtype=dtype)
    bounds = np.zeros(len(batches) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in batches], out=bounds[1:])
    return indices, bounds


def _release_free_heap() -> None:
    """Return freed heap memory to the OS (glibc only; a no-op elsewhere).

    The epoch order's temporaries are tens of MB for millions of samples; glibc keeps such
    freed blocks in the heap after its mmap threshold has grown, which would leave every worker
    holding memory in proportion to the dataset.
    """
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC: Any = None


class _SharedPosition(Position):
    """The position's cells in a shared-memory tensor: one position for the main process and every
    (persistent) DataLoader worker, which claim a loaded start once each (``Position.claim``)."""

    def __init__(self) -> None:
        super().__init__(slots=POSITION_SLOTS)

    def _allocate(self, count: int) -> Any:
        return torch.zeros(count, dtype=torch.int64).share_memory_()


class PackedIterableDataset(_FollowsEpoch, CursorReader, torch_data.IterableDataset):
    """An ``IterableDataset`` that reads its own order and splits it across ranks and workers.

    Each rank's batches (``packer.order``) go round-robin to the DataLoader's workers, which is
    the order the loader returns them in: the loader's ``k``-th batch is the rank's ``k``-th.
    A worker reads each batch with one coalesced ``read_batch`` (a ``raw`` dataset: one gather from
    the shard views, plus one batched crop with a fused transform and ``layout="HWC"``, exactly
    ``PackedDataset``'s batches). With the block order it first
    asks the kernel to read whole blocks ahead (``advise_willneed`` on the shard backend: one
    large read per block, shared through the page cache by every worker) for the current and
    the worker's next batch, so I/O overlaps decoding. With the mmap backend shards are also
    advised ``MADV_SEQUENTIAL`` (sequential order) or ``MADV_RANDOM`` (random and block orders).

    Use ``DataLoader(dataset, batch_size=None, num_workers=..., pin_memory=True)``. Batches are
    ``(images, labels)``: ``images`` one ``(B, ...)`` tensor when every image has the same shape
    (built in shared memory by the worker), else a list; ``labels`` int64 (dicts with ``fields=``,
    made by ``collate_fn``). With
    ``batched=False`` it yields ``(image, label)`` samples in the same order: then give the
    DataLoader the same ``batch_size`` so its batches are this reader's.

    Args:
        source: the dataset folder, or an open ``packer.dataset.Dataset``.
        batch_size: samples per batch on each rank.
        order: a ``packer.ReadOrder`` (kind, seed, ``drop_last``, rank and world size, block
            settings; its ``batch_size`` None or ``batch_size``), or a kind string; default
            ``ReadOrder("block")``. Rank and world size default from ``torch.distributed`` when
            initialised, else 0 and 1.
        decode, layout, transform, target_transform: as for ``PackedDataset``.
        backend, verify_checksums: as for ``packer.open_dataset``.
        batched: yield collated batches (default) or single samples.
        read_ahead: issue the block read-ahead hints (block order).
        fields, multi_hot, geometry: what a sample holds, as for ``PackedDataset``; with any
            other ``fields`` than ``("image", "label")`` batches are dicts (and samples, with
            ``batched=False``).
        collate_fn: collates a batch of dict samples (default ``collate``; ``PaddedCollate()``
            pads the variable fields). Unused for ``(image, label)`` samples.
        **deprecated: the order keywords of earlier releases (``seed=``, ``rank=``, ``world_size=``,
            ``drop_last=``, ``block_bytes=``, ``window=``, ``block_samples=``): still accepted for
            one release, with a ``DeprecationWarning``.

    Raises:
        OptionError: the order's batch size is not ``batch_size`` (and what ``PackedDataset`` refuses).
    """

    def __init__(self, source: PathOrDataset, *, batch_size: int, order: ReadOrder | str | None = None,
                 decode: bool | DecodeFn = True, layout: str = "CHW", transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[Any], Any] | None = None, backend: str = "mmap",
                 verify_checksums: bool = False, batched: bool = True, read_ahead: bool = True,
                 fields: Sequence[str] = DEFAULT_FIELDS, multi_hot: Sequence[str] = (),
                 geometry: Mapping[str, str | Sequence[str]] | None = None,
                 collate_fn: Callable[[Any], Any] | None = None, **deprecated: Any) -> None:
        read_order = read_order_from(order, deprecated, reader="PackedIterableDataset", default=DEFAULT_ORDER)
        self._pipeline = _Pipeline(decode, layout, transform, target_transform)
        self._pool = BatchPool()  # shared-memory batches reused by forked workers (runtime.BatchPool)
        self._crops = _seeded_crops(self)
        self.dataset = _open(source, backend, verify_checksums)
        # Dict samples are PackedDataset's (one way to build them): it reads this same open dataset.
        self._samples: PackedDataset | None = None
        if tuple((fields,) if isinstance(fields, str) else fields) != DEFAULT_FIELDS or multi_hot or geometry:
            self._samples = PackedDataset(self.dataset, decode=decode, layout=layout, transform=transform,
                                          target_transform=target_transform, fields=fields, multi_hot=multi_hot,
                                          geometry=geometry)
        self.collate_fn = collate_fn or collate
        if decode is not False:  # SPEC §6, as for PackedDataset
            check_decodable(self.dataset.manifest.codec, path=self.dataset.path)
            self._pipeline.max_pixels = dataset_max_pixels(self.dataset.manifest)
        self.batched = bool(batched)
        self.read_ahead = bool(read_ahead)
        self.batch_size = batch_size
        # The position lives in shared memory: set_epoch/load_state_dict in the main process must
        # reach persistent workers, which keep the dataset object they were started with. Block
        # boundaries are computed per process on first use, never pickled (IndexSpace).
        self.cursor = EpochCursor(read_order.resolved(batch_size=batch_size, reader="PackedIterableDataset"),
                                  IndexSpace(self.dataset), position=_SharedPosition(),
                                  count_samples=not self.batched)
        self._advised: OrderedDict[int, None] = OrderedDict()
        self._advised_shards: set[int] = set()
        # (epoch, start, batches to skip): a worker's own state (StatefulDataLoader), for its next pass
        self._worker_resume: tuple[int, int, int] | None = None

    # Per-process caches are rebuilt, not pickled: a worker gets options and the manifest only
    # (the cursor's IndexSpace leaves its block boundaries behind too).
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_advised"] = OrderedDict()
        state["_advised_shards"] = set()
        return state

    def __len__(self) -> int:
        share = self.share()
        return share.num_batches if self.batched else share.per_rank

    # --- torchdata's StatefulDataLoader: one state per worker, taken and restored in the worker ---
    def state_dict(self, *, batches_consumed: int | None = None,
                   samples_consumed: int | None = None) -> dict[str, Any]:
        """The resumable position; see ``CursorReader.state_dict``.

        Called inside a DataLoader worker with no argument (what torchdata's
        ``StatefulDataLoader`` does), it returns that worker's state: the iteration's start and
        how many of its own batches the worker handed out. ``load_state_dict`` in the same
        worker of a loader with the same ``num_workers`` continues exactly there.
        """
        info = torch_data.get_worker_info()
        if info is None or batches_consumed is not None or samples_consumed is not None:
            return super().state_dict(batches_consumed=batches_consumed, samples_consumed=samples_consumed)
        worker, num_workers = int(info.id), int(info.num_workers)
        if self._worker_resume is not None:  # loaded, not yet iterated: the loaded state itself
            epoch, start, skip = self._worker_resume
            items = skip if self.batched else skip * self.batch_size
        elif self.cursor.pass_position is not None:  # in (or after) a pass: its start and what went out
            (epoch, start), items = self.cursor.pass_position, self.cursor.handed_out
        else:  # before this worker's first pass: where that pass will start
            epoch, start, items = self.epoch, self.cursor.position.peek(worker, num_workers), 0
        state = self.read_order.state_dict(self.cursor.space, epoch=epoch, consumed=start)
        state.update(worker=worker, num_workers=num_workers, worker_items=items)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved position (see ``CursorReader.load_state_dict``), or a worker's state.

        A worker's state (torchdata's ``StatefulDataLoader``) is for that worker's next pass only;
        later passes are whole epochs of the saved epoch, as after any load.

        Raises:
            OptionError: the state was saved with another order, seed or dataset size, or is a
                worker's state loaded outside that worker of a loader with as many workers.
        """
        if "worker" not in state:
            super().load_state_dict(state)
            return
        info = torch_data.get_worker_info()
        here = (info.id, info.num_workers) if info is not None else None
        if here != (state.get("worker"), state.get("num_workers")):
            raise OptionError(f"this is the state of worker {state.get('worker')} of {state.get('num_workers')}; "
                              f"resume with a loader of as many workers (here: "
                              f"{'no worker' if here is None else f'worker {here[0]} of {here[1]}'})")
        base = {key: value for key, value in state.items() if key not in ("worker", "num_workers", "worker_items")}
        epoch, start = self.read_order.check_state(base, self.cursor.space)
        items = int(state.get("worker_items", 0))
        if not self.batched:  # a sample state: whole batches of this worker
            items //= self.batch_size
        # This worker's next pass resumes from its own state; every worker of the loader loads the
        # same (epoch, start), so the shared position only learns the epoch (its later passes).
        self._worker_resume = (epoch, start, max(0, items))
        self.cursor.position.set(epoch, 0)
        if self._crops is not None:
            self._crops.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        info = torch_data.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        resume, self._worker_resume = self._worker_resume, None
        if resume is not None:  # this worker's own saved state (StatefulDataLoader)
            plan, skip = self.cursor.begin_at(resume[0], resume[1]), resume[2]
        else:
            plan, skip = self.cursor.begin(worker, num_workers), 0
        indices, bounds = _worker_share(plan, worker, num_workers)  # the epoch order is freed here
        del plan
        _release_free_heap()
        self.dataset.plan_reads(indices)  # a dataset in object storage fetches this worker's order ahead
        count = len(bounds) - 1
        skip = min(skip, count)
        self.cursor.handed_out = skip if self.batched else int(bounds[skip])
        for k in range(skip, count):
            batch = indices[bounds[k]:bounds[k + 1]]
            self.dataset.reads_advanced(int(bounds[k]))
            if self.read_ahead:
                self._prepare(batch)
                if k + 1 < count:  # the kernel fetches the next batch's blocks while this one decodes
                    self._prepare(indices[bounds[k + 1]:bounds[k + 2]])
            if self._samples is not None:
                samples = self._samples.__getitems__(batch)
                if self.batched:
                    self.cursor.handed_out += 1
                    yield self.collate_fn(samples)
                else:
                    for sample in samples:
                        self.cursor.handed_out += 1
                        yield sample
                continue
            images, labels, label_list = self._load_batch(batch)
            if self.batched:
                self.cursor.handed_out += 1
                yield _SharedPair(images, labels)  # crosses to the main process as one storage
            else:
                for j in range(len(batch)):
                    self.cursor.handed_out += 1
                    yield images[j], label_list[j]

    # --- I/O hints ---
    def _prepare(self, indices: np.ndarray) -> None:
        """Advise each shard once; with the block order, ask for the batch's whole blocks."""
        ix = self.dataset.index
        kind = self.read_order.kind
        for shard in np.unique(ix.shard[indices]).tolist():
            if shard not in self._advised_shards:
                self._advised_shards.add(shard)
                backend = self.dataset.shard(shard)
                advise = getattr(backend, "advise_sequential" if kind == "sequential" else "advise_random", None)
                if advise is not None:
                    advise()
        bounds = self.cursor.blocks
        if kind != "block" or bounds is None:
            return
        for block in np.unique(np.searchsorted(bounds, indices, side="right") - 1).tolist():
            if block in self._advised:
                self._advised.move_to_end(block)
                continue
            self._advised[block] = None
            if len(self._advised) > _ADVISED_BLOCKS:
                self._advised.popitem(last=False)
            first, last = int(bounds[block]), int(bounds[block + 1]) - 1
            backend = self.dataset.shard(int(ix.shard[first]))
            advise_willneed = getattr(backend, "advise_willneed", None)
            if advise_willneed is not None:
                start = int(ix.offset[first])
                advise_willneed(start, int(ix.offset[last]) + int(ix.size[last]) - start)

    # --- reading and decoding ---
    def _load_batch(self, indices: np.ndarray) -> tuple[torch.Tensor | list[Any], Any, list[Any]]:
        """Read a batch with one coalesced read_batch and decode it straight into one tensor.

        Returns:
            ``(images, collated labels, the labels as a list)``.
        """
        dataset = self.dataset
        pipeline = self._pipeline
        images = _raw_fast_batch(dataset, pipeline, as_sample_indices(indices), pool=self._pool)
        if images is not None:  # raw pixels: one gather (+ one batched crop), as PackedDataset
            labels = [pipeline.label(dataset, i) for i in indices.tolist()]
            if pipeline.target_transform is None:  # one storage with the images: one hand-over
                return images, _labels_in(pipeline.storage_of(images), labels), labels
            try:
                label_tensor = torch.as_tensor(labels, dtype=torch.int64)
            except (TypeError, ValueError, RuntimeError):
                label_tensor = torch_data.default_collate(labels)
            return images, label_tensor, labels
        batch = dataset.read_batch(indices)
        count = len(indices)
        out: torch.Tensor | None = None
        items: list[Any] | None = None
        labels = [pipeline.label(dataset, i) for i in indices.tolist()]
        seen: set[int] = set()  # a repeated index (padding) shares bytes with its first occurrence
        for j, i in enumerate(indices.tolist()):
            start = int(batch.starts[j])
            data = batch.data[start:start + int(batch.sizes[j])]
            tensor = pipeline.tensor(pipeline.pixels(dataset, i, data), owned=i not in seen)
            seen.add(i)
            if pipeline.transform is not None:
                tensor = pipeline.finish(tensor)
            if items is None and isinstance(tensor, torch.Tensor):
                if out is None:
                    out = _empty((count, *tensor.shape), tensor.dtype)
                if tensor.shape == out.shape[1:] and tensor.dtype == out.dtype:
                    out[j].copy_(tensor)  # the one copy: HWC pixels to their (CHW) slot in the batch
                    continue
            if items is None:  # sizes differ: fall back to a list of per-sample tensors
                items = [out[t] for t in range(j)] if out is not None else []
                out = None
            items.append(tensor.contiguous() if isinstance(tensor, torch.Tensor) else tensor)
        try:
            label_tensor = torch.as_tensor(labels, dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError):
            label_tensor = torch_data.default_collate(labels)
        if items is not None:
            return items, label_tensor, labels
        return (out if out is not None else torch.empty((0,), dtype=torch.uint8)), label_tensor, labels
