"""Where a reader runs: its rank and world size (``packer.order.resolve_rank``), whether it is in a
DataLoader worker, and batch tensors allocated in shared memory there."""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Sequence, Union

import torch
import torch.utils.data as torch_data

from ..dataset import Dataset, open_dataset
from ..order import LAUNCHER_VARIABLES, resolve_rank  # noqa: F401  (packer.torch's: the rule lives with the orders)

DecodeFn = Callable[[Any, int], Any]
PathOrDataset = Union[str, "os.PathLike[str]", Dataset]


def _open(source: PathOrDataset, backend: str, verify_checksums: bool) -> Dataset:
    if isinstance(source, Dataset):
        return source
    return open_dataset(source, backend=backend, verify_checksums=verify_checksums)


def _in_worker() -> bool:
    return torch_data.get_worker_info() is not None


def _label_offset(image_bytes: int) -> int:
    """Where a batch's int64 labels start in a storage that holds its images first (8-aligned)."""
    return (image_bytes + 7) // 8 * 8


def _empty_batch(shape: Sequence[int], pool: "BatchPool | None" = None) -> torch.Tensor:
    """An uninitialised uint8 images tensor whose storage has room, after the images, for the
    batch's ``shape[0]`` int64 labels (``_labels_in``); in shared memory inside a worker (from
    ``pool`` when it has a free storage of that size). One storage per batch: it crosses to the
    main process as one file descriptor (``_SharedPair``), where two tensors cost two round
    trips to the worker's resource sharer."""
    image_bytes = math.prod(shape)
    nbytes = _label_offset(image_bytes) + 8 * int(shape[0])
    storage = None
    if _in_worker():
        storage = pool.take(nbytes) if pool is not None else None
        if storage is None:
            storage = torch.UntypedStorage._new_shared(nbytes)
    else:
        storage = torch.UntypedStorage(nbytes)
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, tuple(shape))


# Worker side: the data_ptr of each pooled storage -> (pool token, slot), for _reduce_pair.
_POOLED: dict[int, tuple[str, int]] = {}
# Main side: each pool's flags by token (registered where the pool was made), and the batches
# received from pools whose slots go back to their worker once nothing here uses them.
_POOL_FLAGS: dict[str, Any] = {}
_HELD: list[tuple[Any, str, int]] = []


class BatchPool:
    """Shared-memory batch storages a DataLoader worker reuses once the main process let go of them.

    A fresh shared-memory storage per batch costs its worker ~0.9 ms per 1.5 MB (create, fault
    in and zero every page, unmap; measured on 32x32 batches of 512): about a third of the work
    of a raw batch. Each forked worker keeps up to ``SLOTS`` storages; a storage is written again
    only after the main process has dropped every tensor that uses it (``_release_held``, on
    each received batch, marks its slot free in ``flags``: an anonymous shared mapping made
    here, before the workers fork, one byte per slot). Workers started another way (spawn,
    forkserver) unpickle a pool without flags, and allocate every batch afresh, as do batches
    of another size and batches while every slot is held.
    """

    SLOTS = 8
    MAX_WORKERS = 64

    def __init__(self) -> None:
        import mmap
        import secrets

        self.token = secrets.token_hex(8)
        self.flags: Any = mmap.mmap(-1, self.SLOTS * self.MAX_WORKERS)
        self._storages: dict[int, torch.UntypedStorage] = {}
        _POOL_FLAGS[self.token] = self.flags

    def __getstate__(self) -> dict[str, Any]:
        return {"token": self.token}  # a pickled pool (spawned workers) shares nothing: unpooled

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.token, self.flags, self._storages = state["token"], None, {}

    def take(self, nbytes: int) -> torch.UntypedStorage | None:
        """A storage of ``nbytes`` for this worker's next batch, or None (allocate one afresh)."""
        info = torch_data.get_worker_info()
        if self.flags is None or info is None or info.id >= self.MAX_WORKERS:
            return None
        first = info.id * self.SLOTS
        for slot in range(first, first + self.SLOTS):
            if self.flags[slot] != 0:
                continue  # in the main process (or sent and not yet received)
            storage = self._storages.get(slot)
            if storage is None or storage.nbytes() != nbytes:
                if storage is not None:
                    _POOLED.pop(storage.data_ptr(), None)
                storage = torch.UntypedStorage._new_shared(nbytes)
                self._storages[slot] = storage
                _POOLED[storage.data_ptr()] = (self.token, slot)
            self.flags[slot] = 1
            return storage
        return None


def _release_held() -> None:
    """Give back to their workers the pooled storages no tensor in this process uses any more."""
    kept = []
    for ref, token, slot in _HELD:
        if ref.expired():
            flags = _POOL_FLAGS.get(token)
            if flags is not None:
                flags[slot] = 0
        else:
            kept.append((ref, token, slot))
    _HELD[:] = kept


def _labels_in(images: torch.Tensor, values: Any) -> torch.Tensor:
    """``values`` (int64, one per sample) as a tensor: written after the images in their storage
    when ``_empty_batch`` left room there, else a new tensor."""
    count = len(values)
    storage = images.untyped_storage()
    start = _label_offset(images.numel() * images.element_size())
    column = torch.as_tensor(values, dtype=torch.int64)
    if images.dtype != torch.uint8 or images.storage_offset() != 0 or storage.nbytes() < start + 8 * count:
        return column
    labels = torch.empty(0, dtype=torch.int64).set_(storage, start // 8, (count,))
    return labels.copy_(column)


def _reduce_pair(images: Any, labels: Any, as_list: bool) -> Any:
    """Pickle ``(images, labels)`` as one storage and views when both live in one CPU storage."""
    if (isinstance(images, torch.Tensor) and isinstance(labels, torch.Tensor) and images.device.type == "cpu"
            and labels.device.type == "cpu"
            and images.untyped_storage().data_ptr() == labels.untyped_storage().data_ptr()):
        storage = images.untyped_storage()
        whole = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),))
        return (_rebuild_pair, (whole, images.dtype, tuple(images.shape), images.stride(), images.storage_offset(),
                                labels.storage_offset(), len(labels), as_list, _POOLED.get(storage.data_ptr())))
    return (list if as_list else tuple, ([images, labels],))


class _SharedPair(tuple):
    """``(images, labels)`` that crosses a process boundary as one storage when both live in one
    (``_empty_batch``): one file descriptor instead of two; a plain tuple on the other side.

    Built from one iterable or from the two items; ``_fields`` makes DataLoader's
    ``default_convert`` and ``pin_memory`` rebuild it as this type (their named-tuple rule)
    instead of turning it into a plain list."""

    __slots__ = ()
    _fields = ("images", "labels")

    def __new__(cls, *items: Any) -> "_SharedPair":
        return super().__new__(cls, items[0] if len(items) == 1 else items)

    def __reduce__(self) -> Any:
        return _reduce_pair(self[0], self[1], False)


class _SharedList(list):
    """``[images, labels]`` (what ``default_collate`` returns), crossing as ``_SharedPair`` does."""

    def __reduce__(self) -> Any:
        if len(self) != 2:
            return (list, (list(self),))
        return _reduce_pair(self[0], self[1], True)

    def __copy__(self) -> "_SharedList":  # DataLoader's default_convert copies it, then fills the copy
        return _SharedList(self)


def _rebuild_pair(whole: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], stride: tuple[int, ...],
                  offset: int, label_offset: int, count: int, as_list: bool,
                  pooled: tuple[str, int] | None = None) -> Any:
    storage = whole.untyped_storage()
    _release_held()
    if pooled is not None and pooled[0] in _POOL_FLAGS:  # a worker's pooled storage: watch it
        from torch.multiprocessing.reductions import StorageWeakRef

        _HELD.append((StorageWeakRef(storage), pooled[0], pooled[1]))
    images = torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)
    labels = torch.empty(0, dtype=torch.int64).set_(storage, label_offset, (count,))
    return [images, labels] if as_list else (images, labels)


def _empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor, in shared memory inside a DataLoader worker.

    Like ``default_collate``: a batch built in shared memory crosses to the main process
    without another copy.
    """
    if not _in_worker():
        return torch.empty(tuple(shape), dtype=dtype)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=dtype).set_(storage, 0, tuple(shape))
