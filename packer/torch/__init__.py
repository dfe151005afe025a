"""PyTorch readers: which one for which situation (``pip install 'packer-shards[torch]'``).

* **Map-style + a sampler** (the classic DataLoader wiring): ``PackedDataset`` in
  ``PackedDataLoader(dataset, batch_size=..., order=packer.ReadOrder(...))``, a DataLoader that
  deals the order itself (a ``PackedBatchSampler``) and counts what the loop received, for exact
  resume; or with a ``PackedBatchSampler`` / ``PackedSampler`` of your own (or torch's
  ``DistributedSampler``).
  The sampler runs in the main process; workers receive batches of indices (``__getitems__``)
  and decode from zero-copy views of the mapped shards. Modules: ``mapstyle``, ``samplers``,
  ``loader``.
* **Iterable**: ``PackedIterableDataset`` reads the epoch order itself, splits each rank's
  batches across the DataLoader workers and reads whole blocks ahead (best for the block
  shuffle on slow storage). Use ``DataLoader(dataset, batch_size=None)``: it yields batches.
  Module: ``iterable``.
* **Threads instead of worker processes**: ``packer.threaded.ThreadedLoader`` (small images,
  the raw codec, or a machine where forking workers costs too much memory).
* **Batches straight to the GPU**: ``packer.gpu`` (``GpuRawBatches``, GPUDirect Storage).
* **Decode on the GPU with DALI**: ``packer.dali`` (an ``external_source`` callable).

A sample is ``(image, label)`` or, with ``fields=``, a dict (``fieldplan``); batches are made
by ``collate`` or ``PaddedCollate`` (``collate``). Every reader takes its order as one value,
``order=packer.ReadOrder(...)``, and keeps its place in an ``EpochCursor`` (``packer.order``), so
positions are valid for any number of workers, ranks and batch sizes.

This package is the only part of packer that imports torch at module level; ``import packer``
never does.
"""

from __future__ import annotations

from ..errors import MissingDependencyError

try:
    import torch  # noqa: F401
except ImportError as _exc:  # pragma: no cover - exercised only without torch
    raise MissingDependencyError(
        f"packer.torch needs PyTorch, which is not installed ({_exc}); install it with "
        f"pip install 'packer-shards[torch]'") from None

from ..classes import check_classes
from .collate import PaddedCollate, collate
from .fieldplan import FIELDS, GEOMETRY_KINDS, MAX_MULTI_HOT
from .iterable import PackedIterableDataset
from .loader import PackedDataLoader
from .mapstyle import PackedDataset
from .pipeline import LAYOUTS
from .runtime import resolve_rank
from .samplers import PackedBatchSampler, PackedSampler

__all__ = ["PackedDataset", "PackedSampler", "PackedBatchSampler", "PackedIterableDataset", "PackedDataLoader",
           "collate", "PaddedCollate", "resolve_rank", "check_classes", "LAYOUTS", "FIELDS", "GEOMETRY_KINDS",
           "MAX_MULTI_HOT"]
