"""Where a reader runs: its rank and world size, whether it is in a DataLoader worker, and
batch tensors allocated in shared memory there."""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Sequence, Union

import torch
import torch.utils.data as torch_data

from ..dataset import Dataset, open_dataset
from ..errors import OptionError

DecodeFn = Callable[[Any, int], Any]
PathOrDataset = Union[str, "os.PathLike[str]", Dataset]


def resolve_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else from ``torch.distributed`` when initialised, else (0, 1).

    Raises:
        OptionError: only one of the two is given, or rank is outside ``0..world_size-1``.
    """
    if rank is None and world_size is None:
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        else:
            rank, world_size = 0, 1
    elif rank is None or world_size is None:
        raise OptionError("give both rank and world_size, or neither (to use torch.distributed)")
    if not isinstance(world_size, int) or world_size < 1:
        raise OptionError(f"world_size must be a positive integer, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise OptionError(f"rank must be an integer in 0..{world_size - 1}, got {rank!r}")
    return rank, world_size


def _open(source: PathOrDataset, backend: str, verify_checksums: bool) -> Dataset:
    if isinstance(source, Dataset):
        return source
    return open_dataset(source, backend=backend, verify_checksums=verify_checksums)


def _in_worker() -> bool:
    return torch_data.get_worker_info() is not None


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
