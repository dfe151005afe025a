"""Grain (JAX) access to packed datasets: a random-access data source of numpy records, and packer's
epoch orders as a Grain ``MapDataset`` (``pip install 'packer-shards[grain]'``; no torch).

``PackedDataSource`` implements Grain's ``RandomAccessDataSource`` protocol (``__len__``,
``__getitem__``, a stable ``__repr__`` for checkpoints) and its batched read (``_getitems``, the
``SupportsBatchedReadRandomAccessDataSource`` protocol), so
``grain.MapDataset.source(PackedDataSource(path))`` works with any Grain pipeline: Grain's
``shuffle``, ``batch``, ``map``, its checkpointed iterators and its multiprocessing (a source
pickles as its manifest and options, a few KB).

``EpochOrdered`` is the other way round: a Grain ``MapDataset`` whose element ``k`` is the
``k``-th sample of *this process's* share of packer's epoch order (``packer.order``: the
``"block"`` shuffle that reads ~4 MiB runs, ``"random"``, ``"sequential"``), epoch after epoch,
dealt to processes in global steps exactly like the PyTorch readers. Batch it with the same
``batch_size`` it was dealt with.

A record is a dict of numpy values: ``"image"`` uint8 ``(H, W, 3)`` (HWC, the JAX habit;
``decode=False`` the stored bytes as a 1-D uint8 array, ``--codec raw`` samples as stored),
``"label"`` int64, ``"index"`` int64, ``"key"`` str, ``"metadata"`` the sample's JSON object (a
dict, ``{}`` without one: map it to arrays before ``batch`` when samples' keys differ), and each
declared field: arrays in their dtype and shape, ``classes`` fields their int64 ids, ``text`` a
str, ``image`` fields their stored values (``Dataset.field_image``). The built-in names are every
packer reader's (``packer.fields.READ_FIELDS``).
"""

from __future__ import annotations

import operator
import os
from typing import Any, Callable, Sequence

import numpy as np

from .codecs import codec_for, dataset_max_pixels
from .dataset import Dataset, open_dataset
from .errors import MissingDependencyError, OptionError
from .fields import READ_FIELDS
from .order import ORDER_KEYWORDS, IndexSpace, ReadOrder, check_epoch, read_order_from

try:
    import grain
except ImportError as _exc:  # pragma: no cover - exercised only without grain
    raise MissingDependencyError(f"packer.grain needs Grain, which is not installed ({_exc}); install it with "
                                 f"pip install 'packer-shards[grain]'") from None

__all__ = ["PackedDataSource", "EpochOrdered", "BUILTIN_FIELDS"]

#: What a record may hold besides the dataset's declared fields (every reader's built-in names).
BUILTIN_FIELDS = READ_FIELDS
#: ``EpochOrdered``'s order when none is given: the block shuffle.
DEFAULT_ORDER = ReadOrder("block")
#: ``EpochOrdered``'s old order keywords (Grain's names for the rank and world size among them,
#: and the batch size it dealt in), and the share a call with old keywords read when it left
#: those out.
_EPOCH_KEYWORDS = {**ORDER_KEYWORDS, "process_index": "rank", "process_count": "world_size", "batch_size": "batch_size"}
_EPOCH_OLD_SHARE = {"process_index": 0, "process_count": 1}


class PackedDataSource:
    """A Grain random-access data source over a packed dataset: ``source[i]`` is a dict of numpy values.

    Example::

        import grain
        source = PackedDataSource("packed/train", decode=CenterCrop(224, resize=256))
        data = grain.MapDataset.source(source).shuffle(seed=0).batch(256)
        for batch in data.to_iter_dataset():   # batch["image"]: uint8 (256, 224, 224, 3)
            ...

    Args:
        source: the dataset folder, or an open ``packer.dataset.Dataset``.
        fields: what a record holds: any of ``BUILTIN_FIELDS`` and the declared fields.
        decode: ``True`` (RGB pixels, ``packer.decode.decode_image``), ``False`` (the stored
            bytes) or a callable ``decode(data, image_format) -> (H, W, C) array`` such as
            ``packer.transforms.CenterCrop(224)``; a ``RandomResizedCrop(..., seed=s)`` draws
            from ``(s, epoch, index)`` with the epoch its ``set_epoch`` chose (Grain has no
            epoch hook: prefer Grain's ``random_map`` for per-epoch randomness).
        backend, verify_checksums: as ``packer.open_dataset``.
        classes: the class list the dataset must have (``ClassListMismatchError`` otherwise).

    Raises:
        OptionError: an unknown field (the message lists the dataset's).
        ClassListMismatchError: ``classes`` given and different from the dataset's.
    """

    def __init__(self, source: str | os.PathLike[str] | Dataset, *, fields: Sequence[str] = ("image", "label"),
                 decode: bool | Callable[..., Any] = True, backend: str = "mmap", verify_checksums: bool = False,
                 classes: Sequence[str] | None = None) -> None:
        self.dataset = source if isinstance(source, Dataset) else open_dataset(
            source, backend=backend, verify_checksums=verify_checksums)
        if isinstance(fields, str) or not fields:
            raise OptionError(f"fields must be a non-empty sequence of names, got {fields!r}")
        declared = {spec.name: spec for spec in self.dataset.fields}
        for name in fields:
            if name not in BUILTIN_FIELDS and name not in declared:
                raise OptionError(f"unknown field {name!r}: choose from {list(BUILTIN_FIELDS)} and the dataset's "
                                  f"declared fields {sorted(declared) or '(none)'}")
        if not (decode is True or decode is False or callable(decode)):
            raise OptionError(f"decode must be True, False or a callable, got {decode!r}")
        self._codec = codec_for(self.dataset)
        if decode is not False and "image" in fields:
            self._codec.check_decodable()
        if classes is not None:
            from .classes import check_classes

            check_classes(tuple(classes), self.dataset)
        self.fields = tuple(fields)
        self.decode = decode
        self._max_pixels = dataset_max_pixels(self.dataset.manifest)

    def __len__(self) -> int:
        return len(self.dataset)

    def __repr__(self) -> str:
        # Grain compares a checkpoint's source by its repr: the dataset's identity, not an address.
        index = self.dataset.manifest.index
        return (f"PackedDataSource(path={str(self.dataset.path)!r}, samples={len(self)}, "
                f"index={getattr(index, 'checksum', index)!r}, fields={self.fields!r})")

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(self.dataset.classes)

    def _image(self, i: int) -> np.ndarray:
        dataset = self.dataset
        data = np.frombuffer(dataset.get(i), dtype=np.uint8)
        if self.decode is False:
            return data.copy()  # the mapping is not the record's to keep
        image_format = int(dataset.index.image_format[i])
        pixels = self._codec.stored_pixels(dataset, i, data)
        if pixels is not None:  # stored pixels (codec raw): a view of the mapping, copied or cropped
            return self.decode(pixels, image_format, index=i) if callable(self.decode) else pixels.copy()
        if callable(self.decode):
            from .transforms import DecodeTransform

            if isinstance(self.decode, DecodeTransform):
                return np.asarray(self.decode(data, image_format, index=i))
            return np.asarray(self.decode(data, image_format))
        return self._codec.pixels(dataset, i, data, max_pixels=self._max_pixels)

    def __getitem__(self, record_key: int) -> dict[str, Any]:
        count = len(self.dataset)
        try:
            i = operator.index(record_key)  # an int or numpy integer; int() would take '3' and 2.7
        except TypeError:
            raise OptionError(f"record keys are integers, got {type(record_key).__name__}") from None
        if not 0 <= i < count:
            raise OptionError(f"record key {i} is outside 0..{count - 1}")
        record: dict[str, Any] = {}
        for name in self.fields:
            if name == "image":
                record[name] = self._image(i)
            elif name == "label":
                record[name] = np.int64(self.dataset.labels[i])
            elif name == "index":
                record[name] = np.int64(i)
            elif name == "key":
                record[name] = self.dataset.key(i)
            elif name == "metadata":
                record[name] = self.dataset.metadata(i)
            else:
                record[name] = self.dataset.value(name, i)
        return record

    def _getitems(self, record_keys: Sequence[int]) -> list[dict[str, Any]]:
        """Grain's batched read: the records of ``record_keys``, in order."""
        return [self[key] for key in record_keys]


class EpochOrdered(grain.MapDataset):
    """A Grain ``MapDataset`` of one epoch of packer's order for this process; index past its length for later epochs.

    Element ``k`` is ``indices(k // len)[k % len]``: the samples ``packer.order.deal`` gives rank
    ``process_index`` of ``process_count`` in global steps of ``process_count * batch_size``
    (the end of each epoch padded to an equal share, or dropped to full batches, like the
    PyTorch readers). As in Grain's own ``shuffle``, an index past the length reads the next
    epochs (a new order each), so ``.batch(batch_size).repeat(epochs)`` makes exactly the
    batches ``packer.torch.PackedBatchSampler`` makes on that rank, epoch after epoch
    (``.repeat().batch()`` would batch across epoch ends instead). A Grain iterator over it
    checkpoints its position like any other (``get_state`` / ``set_state``).

    Example::

        order = ReadOrder("block", seed=0, batch_size=256, rank=jax.process_index(),
                          world_size=jax.process_count())
        data = EpochOrdered(PackedDataSource("packed/train"), order=order)
        batches = data.batch(256).repeat(epochs).to_iter_dataset()

    Args:
        source: the ``PackedDataSource`` to read.
        order: a ``packer.ReadOrder`` or a kind string (default ``ReadOrder("block")``: ~``block_bytes``
            runs read together): kind, seed, ``batch_size`` (the batch size the pipeline batches with,
            for the global steps; None: 1), ``drop_last`` (drop each epoch's end, full batches only,
            instead of padding it), this process's ``rank`` of ``world_size`` (``jax.process_index()``
            of ``jax.process_count()``; default from ``torch.distributed`` when a torch process group
            is initialised, else 0 of 1), block settings.
        **deprecated: the order keywords of earlier releases (``seed=``, ``batch_size=``,
            ``process_index=``, ``process_count=``, ``drop_last=``, ``block_bytes=``, ``window=``):
            still accepted for one release, with a ``DeprecationWarning`` (a call using them reads
            process 0 of 1 unless it says otherwise, as it did).

    Raises:
        OptionError: bad settings.
    """

    def __init__(self, source: PackedDataSource, *, order: ReadOrder | str | None = None, **deprecated: Any) -> None:
        read_order = read_order_from(order, deprecated, reader="EpochOrdered", default=DEFAULT_ORDER,
                                     keywords=_EPOCH_KEYWORDS, old_defaults=_EPOCH_OLD_SHARE)
        if not isinstance(source, PackedDataSource):
            raise OptionError(f"EpochOrdered reads a PackedDataSource, got {type(source).__name__}")
        self._read_order = read_order.resolved(reader="EpochOrdered")
        super().__init__(grain.MapDataset.source(source))
        self._source = source
        self._space = IndexSpace(source.dataset)
        self._rank = (int(self._read_order.rank), int(self._read_order.world_size))  # type: ignore[arg-type]
        self._per_epoch = self._read_order.share(self._space.num_samples).per_rank  # a mixture's epoch is its own
        self._cached: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return self._per_epoch

    def __str__(self) -> str:
        rank, world = self._rank
        return f"EpochOrdered(order={self._read_order.kind!r}, seed={self._read_order.seed}, process={rank}/{world})"

    @property
    def read_order(self) -> ReadOrder:
        """The order this dataset reads (its rank and world size resolved)."""
        return self._read_order

    def indices(self, epoch: int) -> np.ndarray:
        """This process's sample indices of ``epoch``, in order (int64)."""
        epoch = check_epoch(epoch)
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, self._read_order.plan(self._space, epoch=epoch).indices)
        return self._cached[1]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        epoch, position = divmod(int(index), self._per_epoch)
        return self._parent[int(self.indices(epoch)[position])]
