"""PyTorch readers: a map-style dataset, order-aware samplers, an iterable block reader, and collate.

This is the only module of packer that imports torch (``pip install 'packer[torch]'``).

Which to use
------------
* ``PackedDataset`` + ``PackedBatchSampler`` (or ``PackedSampler``, or torch's own
  ``DistributedSampler``): the classic map-style path. The sampler runs in the main process;
  workers receive batches of indices (``__getitems__``): with the mmap backend they decode
  straight from zero-copy views of the mapping; with other backends, or with checksums on, or
  for raw bytes, they read each batch with one coalesced ``read_batch``.
* ``PackedIterableDataset``: reads the order itself, splitting each rank's batches across the
  DataLoader workers, with whole-block read-ahead for the block shuffle. Use it with
  ``DataLoader(dataset, batch_size=None, ...)``: it yields collated batches.

Samples
-------
A sample is ``(image, label)``. ``image`` is a ``torch.uint8`` tensor, decoded with
``packer.decode.decode_image`` (simplejpeg for JPEG, Pillow otherwise; always 3-channel RGB):
``(3, H, W)`` with ``layout="CHW"`` (the default, what torchvision models and transforms
expect) or ``(H, W, 3)`` with ``layout="HWC"``. Samples stored with the ``raw`` codec are
reshaped from the index's height, width and channels instead of decoded (``(C, H, W)`` or
``(H, W, C)``, C as stored). ``decode=False`` gives the stored bytes as a 1-D uint8 tensor.
``decode=<callable>`` replaces the decoder: it is called as ``decode(data, image_format)``
with the sample's bytes (a uint8 numpy array or memoryview) and its ``ImageFormat`` value, and
returns an ``(H, W, C)`` uint8 numpy array or tensor (e.g. a fused decode + random-resized-crop);
the layout is applied to its result. ``transform`` is then applied to the image tensor
(torchvision transforms work) and ``target_transform`` to the int label.

Samples with more than a label
------------------------------
``fields=`` chooses what a sample holds: the built-ins ``image``, ``label``, ``index``, ``key``,
``metadata`` and any field the dataset declares (formats/SPEC.md §14, ``packer.fields``). Any
choice but ``("image", "label")`` makes samples dicts, in the order given::

    PackedDataset(path, fields=("image", "boxes", "labels", "mask", "caption"),
                  decode=RandomResizedCrop(512, seed=0), layout="HWC",
                  geometry={"boxes": "xyxy", "labels": "per-box"})

Arrays are tensors of their declared dtype and shape (variable ones ``(n, *rest)``), class sets
int64 ids (or float32 multi-hot vectors: ``multi_hot=("tags",)``), text a str, image fields
tensors of their stored values (``(H, W)`` for a mask). With a fused transform as ``decode``,
image fields get the image's crop, resize and flip (nearest neighbour), and the array fields
named in ``geometry=`` are moved with it (``packer.transforms.CropGeometry``: boxes clipped and
dropped by a documented rule, per-box rows dropped in step, keypoints made invisible outside).
``collate`` stacks fixed shapes (fixed arrays are gathered for the whole batch from the index's
zero-copy columns, into shared memory inside a worker) and lists variable ones;
``PaddedCollate`` pads them and adds ``<name>_lengths``. The iterable dataset and
``packer.threaded.ThreadedLoader`` take the same options (and ``collate_fn=``).

Memory
------
Nothing here holds per-sample Python objects. Datasets pickle as the manifest bytes plus
options (a few KB whatever the sample count), the index is a shared read-only mapping, shards
are opened lazily in each worker after fork, and samplers (main process) yield indices from
numpy arrays in small chunks. A ``PackedDataset`` worker's own memory does not depend on the
dataset size (``scripts/bench_memory.py``). A ``PackedIterableDataset`` worker computes the
epoch order itself, keeps only its own batches (4 bytes per sample of its share: 2 MB for a
million samples over two workers) and returns the order's temporaries to the OS.

Resuming mid-epoch
------------------
The position in an epoch is ``(seed, epoch, consumed)``, ``consumed`` counting samples globally
(see ``packer.order``), so it is valid for any number of workers, ranks and batch sizes. Every
reader keeps its place in a ``packer.order.EpochCursor``. The simple, safe wiring is
``PackedDataLoader``, which counts the batches your loop received (a DataLoader prefetches, so a
reader cannot know that by itself)::

    sampler = PackedBatchSampler(dataset, batch_size=256, order="random", seed=0)
    loader = PackedDataLoader(dataset, batch_sampler=sampler, num_workers=8, collate_fn=collate,
                              pin_memory=True, persistent_workers=True)
    if checkpoint:
        loader.load_state_dict(checkpoint["loader"])
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)        # keeps the loaded position for the loaded epoch
        for images, labels in loader:
            ...
            save({"loader": loader.state_dict()})

With a plain ``DataLoader``, count yourself and say what you counted:
``batch_sampler.state_dict(batches_consumed=step)`` (its own batches),
``sampler.state_dict(samples_consumed=step * batch_size)`` for a ``PackedSampler``
(``batches_consumed`` on a sampler that was not told the batch size raises rather than resume
at the wrong place), ``dataset.state_dict(batches_consumed=step)`` for a
``PackedIterableDataset``, whose position lives in a small shared-memory tensor so that
``set_epoch``/``load_state_dict`` reach persistent workers. Without an argument a reader
reports what it handed out itself, which is exact only when it is iterated directly.
"""

from __future__ import annotations

import ctypes
import math
import os
from collections import OrderedDict
from typing import Any, Callable, Iterator, Mapping, Sequence, Union

import numpy as np

from .errors import DecodeError, IndexMismatchError, MissingDependencyError, OptionError

try:
    import torch
    import torch.utils.data as torch_data
except ImportError as _exc:  # pragma: no cover - exercised only without torch
    raise MissingDependencyError(
        f"packer.torch needs PyTorch, which is not installed ({_exc}); install it with "
        f"pip install 'packer[torch]'") from None

from . import format as fmt
from .classes import check_classes
from .codecs import check_decodable, dataset_max_pixels, keeps_source_geometry
from .imageinfo import DEFAULT_MAX_PIXELS
from .dataset import Dataset, DatasetIndex, as_sample_indices, open_dataset
from .decode import decode_image  # imported before the workers fork, so they share its pages
from .rawcrop import raw_shape_of, read_raw_batch
from .order import (DEFAULT_BLOCK_BYTES, DEFAULT_BLOCK_SAMPLES, DEFAULT_WINDOW, CursorReader, EpochCursor, Position,
                    RankPlan, ReadOrder, index_blocks, uniform_blocks)

__all__ = ["PackedDataset", "PackedSampler", "PackedBatchSampler", "PackedIterableDataset", "PackedDataLoader",
           "collate", "PaddedCollate", "resolve_rank", "check_classes", "LAYOUTS", "FIELDS", "GEOMETRY_KINDS",
           "MAX_MULTI_HOT"]

LAYOUTS = ("CHW", "HWC")
#: Indices a sampler converts to Python ints at a time (bounded, whatever the epoch length).
_YIELD_CHUNK = 4096
#: Blocks a worker remembers having asked the kernel to read ahead (a small, fixed set).
_ADVISED_BLOCKS = 256

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


def collate(samples: Sequence[Any]) -> Any:
    """Collate ``(image, label)`` samples into ``(images, labels)``, and dict samples into a dict.

    Same-shape, same-dtype image tensors are copied once into one ``(B, ...)`` tensor (in shared
    memory inside a worker, so it reaches the main process without another copy); images of
    different sizes come back as a list of tensors. Samples that ``__getitems__`` decoded straight
    into one batch tensor (fused transforms, ``layout="HWC"``) come back as that tensor, uncopied.
    Labels become an int64 tensor.

    Dict samples (``PackedDataset(fields=...)``) give a dict batch with the same keys:
    ``image`` as above; ``label`` and ``index`` int64 tensors; ``key``, ``metadata`` and
    ``text`` fields lists; fixed-shape fields (fixed arrays, multi-hot class vectors) one
    ``(B, *shape)`` tensor (gathered straight into shared memory by ``__getitems__``: no second
    copy); variable-length fields (variable arrays, class-id sets) a list of tensors
    (``PaddedCollate`` pads them instead); image fields stacked like ``image`` (one tensor when
    every one has the same shape, e.g. after a fused crop, else a list). Which fields are
    variable travels with packer's samples; for a sample rebuilt as a plain dict, tensors are
    stacked when they all have the same shape and listed otherwise.

    Args:
        samples: what ``PackedDataset.__getitems__`` returns.

    Returns:
        ``(images, labels)``, or a dict for dict samples.
    """
    if samples and isinstance(samples[0], dict):
        return _collate_fields(samples)
    labels = [sample[1] for sample in samples]
    try:
        label_tensor = torch.as_tensor(labels, dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError):  # a target_transform made something else
        label_tensor = torch_data.default_collate(labels)
    if isinstance(samples, _BatchSamples) and len(samples) == len(samples.batch):
        return samples.batch, label_tensor  # decoded in place: nothing to stack
    return _stack([sample[0] for sample in samples]), label_tensor


def _collate_fields(samples: Sequence[dict[str, Any]], pad: "PaddedCollate | None" = None) -> dict[str, Any]:
    """Dict samples into one dict batch (see ``collate``); ``pad`` pads the variable fields."""
    first = samples[0]
    # Columns gathered by __getitems__ are valid while the list is the one it returned, whole.
    columns = samples.columns if isinstance(samples, _FieldSamples) and len(samples) == samples.count else {}
    values = {name: [sample[name] for sample in samples] for name in first if name not in columns}
    return _collate_columns(tuple(first), values, columns, getattr(first, "variable", None),
                            getattr(samples, "batch", None), len(samples), pad)


def _collate_columns(names: Sequence[str], by_name: dict[str, list[Any]], columns: dict[str, torch.Tensor],
                     variable: frozenset[str] | None, batch: torch.Tensor | None, count: int,
                     pad: "PaddedCollate | None") -> dict[str, Any]:
    """The dict batch of ``collate``/``PaddedCollate`` from each field's values (``by_name``) or
    ready batch tensor (``columns``); ``variable`` None: decide by the values' shapes."""
    out: dict[str, Any] = {}
    for name in names:
        if name in columns:
            out[name] = columns[name]
            continue
        values = by_name[name]
        if name == "image":
            out[name] = batch if batch is not None and len(batch) == count else _stack(values)
        elif name in ("label", "index"):
            try:
                out[name] = torch.as_tensor(values, dtype=torch.int64)
            except (TypeError, ValueError, RuntimeError):  # a target_transform made something else
                out[name] = torch_data.default_collate(values)
        elif name in ("key", "metadata") or not all(isinstance(value, torch.Tensor) for value in values):
            out[name] = values  # strings and dicts stay lists (no per-key tensors of ragged metadata)
        elif variable is not None and name not in variable:
            out[name] = _stack(values)  # fixed shapes and image fields: one tensor when they agree
        elif variable is None and all(value.shape == values[0].shape for value in values):
            out[name] = _stack(values)
        elif pad is not None:
            padded = pad.pad(name, values)
            if padded is None:
                out[name] = values
            else:
                lengths = f"{name}_lengths"
                if lengths in names:
                    raise OptionError(f"PaddedCollate would add {lengths!r} for field {name!r}, but the samples "
                                      f"already have a field of that name")
                out[name], out[lengths] = padded
        else:
            out[name] = values
    return out


class PaddedCollate:
    """``collate``, with variable-length fields padded into one tensor plus their lengths.

    Each variable field ``F`` (a variable array such as boxes ``(n, 4)``, or a class-id set
    ``(n,)``) becomes ``F``: a ``(B, max n, *rest)`` tensor of its dtype, row ``j`` holding
    sample ``j``'s ``n_j`` rows and then ``pad_value``, and ``F_lengths``: the ``(B,)`` int64
    ``n_j``. Everything else is collated as ``collate`` does (fixed shapes stacked, strings and
    metadata lists). Use it as ``DataLoader(collate_fn=PaddedCollate(...))``, or as
    ``collate_fn=`` of ``PackedIterableDataset`` and ``ThreadedLoader``; it pickles to workers.

    Args:
        pad_value: the padding value, or a mapping of field name to value (fields not named
            pad with 0). Pick one that cannot be a real value when the lengths are not used:
            ``-1`` for class ids (0 is a class) in a signed dtype.

    Raises:
        OptionError: on call, a pad value the field's dtype cannot hold (``-1`` in a ``uint8``
            field), or a ``F_lengths`` name already taken by a field.
    """

    def __init__(self, pad_value: float | Mapping[str, float] = 0) -> None:
        values = pad_value.values() if isinstance(pad_value, Mapping) else (pad_value,)
        if not all(isinstance(v, (int, float)) for v in values):
            raise OptionError(f"pad_value must be a number or a mapping of field names to numbers, got {pad_value!r}")
        self.pad_value = dict(pad_value) if isinstance(pad_value, Mapping) else pad_value

    def value_for(self, name: str) -> float:
        """The padding value of field ``name``."""
        if isinstance(self.pad_value, dict):
            return self.pad_value.get(name, 0)
        return self.pad_value

    def pad(self, name: str, values: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(padded, lengths)`` of one field's values, or None when their trailing shapes or dtypes differ."""
        first = values[0]
        if first.dim() < 1 or not all(v.dim() == first.dim() and v.shape[1:] == first.shape[1:]
                                      and v.dtype == first.dtype for v in values):
            return None
        lengths = torch.tensor([int(v.shape[0]) for v in values], dtype=torch.int64)
        longest = int(lengths.max()) if len(values) else 0
        out = _empty((len(values), longest, *first.shape[1:]), first.dtype)
        value = self.value_for(name)
        try:
            out.fill_(value)
        except RuntimeError as exc:
            raise OptionError(f"PaddedCollate: pad value {value!r} does not fit field {name!r}'s {first.dtype} "
                              f"({exc}); give that field another pad_value") from None
        for j, v in enumerate(values):
            out[j, :v.shape[0]] = v
        return out, lengths

    def __call__(self, samples: Sequence[Any]) -> Any:
        if samples and isinstance(samples[0], dict):
            return _collate_fields(samples, pad=self)
        return collate(samples)

    def __repr__(self) -> str:
        return f"PaddedCollate(pad_value={self.pad_value!r})"


def _stack(images: Sequence[Any]) -> torch.Tensor | list[torch.Tensor]:
    if not images:
        return torch.empty((0,), dtype=torch.uint8)
    first = images[0]
    if (not isinstance(first, torch.Tensor)
            or not all(isinstance(t, torch.Tensor) and t.shape == first.shape and t.dtype == first.dtype
                       for t in images)):
        return list(images)
    out = _empty((len(images), *first.shape), first.dtype)
    return torch.stack(list(images), 0, out=out)


#: The built-in parts a ``PackedDataset`` sample can hold (``fields=``), besides the dataset's
#: declared fields (formats/SPEC.md §14), and the default.
FIELDS = ("image", "label", "index", "key", "metadata")
DEFAULT_FIELDS = ("image", "label")
#: What ``geometry=`` can say of an array field: boxes, keypoints, or rows that go with the boxes.
GEOMETRY_KINDS = ("xyxy", "points", "per-box")
#: The most classes ``multi_hot=`` expands (a float32 per class per sample: 4 MiB a sample here).
MAX_MULTI_HOT = 1 << 20


def _check_fields(fields: Sequence[str], dataset: DatasetIndex) -> tuple[str, ...]:
    chosen = (fields,) if isinstance(fields, str) else tuple(fields)
    declared = [spec.name for spec in dataset.fields]
    unknown = [f for f in chosen if f not in FIELDS and f not in declared]
    if not chosen or unknown or len(set(chosen)) != len(chosen):
        problem = f"unknown: {unknown}" if unknown else "repeated names" if chosen else "none chosen"
        raise OptionError(f"fields must be distinct names from the built-in {list(FIELDS)} and this dataset's "
                          f"declared fields {declared or '(it declares none)'}; got {list(chosen)} ({problem})")
    return chosen


def _check_geometry(geometry: Mapping[str, Any] | None, names: tuple[str, ...], dataset: DatasetIndex,
                    decode: Any) -> dict[str, frozenset[str]]:
    """``geometry=`` as ``{field: kinds}``, every entry checked against its declaration."""
    from .transforms import DecodeTransform

    if not geometry:
        return {}
    if not isinstance(geometry, Mapping):
        raise OptionError(f"geometry must map field names to {list(GEOMETRY_KINDS)}, e.g. "
                          f"{{'boxes': 'xyxy', 'labels': 'per-box'}}; got {geometry!r}")
    if not (decode is True or decode is False or isinstance(decode, DecodeTransform)):
        raise OptionError("geometry= moves fields with packer's fused transforms (decode=RandomResizedCrop/"
                          "CenterCrop) or leaves them as stored (decode=True/False); a decode callable of your "
                          "own does not say how it moved the image")
    checked: dict[str, frozenset[str]] = {}
    for name, given in geometry.items():
        kinds = frozenset((given,) if isinstance(given, str) else given)
        if not kinds or not kinds <= set(GEOMETRY_KINDS) or {"xyxy", "points"} <= kinds:
            raise OptionError(f"geometry[{name!r}] = {given!r}: give one of {list(GEOMETRY_KINDS)}, or "
                              f"('points', 'per-box') for keypoints that go with the boxes")
        if name not in names:
            raise OptionError(f"geometry names {name!r}, which fields= does not ask for ({list(names)})")
        if name in FIELDS:
            raise OptionError(f"geometry is for declared array fields; {name!r} is built in")
        spec = dataset.field_spec(name)
        shape = spec.shape
        if spec.kind != "array":
            raise OptionError(f"geometry[{name!r}]: {spec.describe()} is not an array field")
        if "xyxy" in kinds and not (spec.variable and shape[1:] == (4,)):
            raise OptionError(f"geometry[{name!r}] = 'xyxy' needs boxes declared as DTYPE[N,4], got {spec.describe()}")
        if "points" in kinds and (not shape or shape[-1] not in (2, 3) or shape == (-1,)):
            raise OptionError(f"geometry[{name!r}] = 'points' needs (x, y) or (x, y, visibility) in the last "
                              f"dimension, e.g. float32[N,17,3]; got {spec.describe()}")
        if "per-box" in kinds and not spec.variable:
            raise OptionError(f"geometry[{name!r}] = 'per-box' needs one row per box (DTYPE[N,...]), "
                              f"got {spec.describe()}")
        checked[name] = kinds
    boxes = [name for name, kinds in checked.items() if "xyxy" in kinds]
    moved = [name for name, kinds in checked.items() if kinds & {"xyxy", "points"}]
    if moved and not keeps_source_geometry(dataset.manifest):
        # the coordinates are in the source's pixels; the stored images are not (silently wrong boxes)
        raise OptionError(f"geometry= moves {moved} with the image, but this dataset's codec "
                          f"{dataset.manifest.codec.get('name')!r} resized the stored images (or may have: see "
                          f"packer.codecs.keeps_source_geometry), so coordinates given in source pixels no longer "
                          f"match them; build with --codec passthrough or tiled (or jpeg without --max-size)")
    if len(boxes) > 1:
        raise OptionError(f"geometry has {len(boxes)} 'xyxy' fields {boxes}: per-box fields follow one box field")
    if not boxes and any("per-box" in kinds for kinds in checked.values()):
        raise OptionError("geometry has 'per-box' fields but no 'xyxy' boxes field for them to follow")
    return checked


class _FieldSample(dict):
    """One dict sample; ``variable`` names its variable-length tensor fields (for the collates)."""

    variable: frozenset[str] = frozenset()


class _FieldSamples(list):
    """Dict samples of one batch, with what ``collate`` can pass on without a copy: ``batch`` (the
    images, when decoded into one tensor) and ``columns`` (fixed-shape fields gathered into one
    tensor each, in shared memory inside a worker); ``count`` is how many samples they hold."""

    def __init__(self, samples: Sequence[_FieldSample], batch: torch.Tensor | None,
                 columns: dict[str, torch.Tensor]) -> None:
        super().__init__(samples)
        self.batch = batch
        self.columns = columns
        self.count = len(samples)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class _FieldPlan:
    """How a dict sample is built: the chosen fields, checked against the declarations once.

    Holds names and options only (the declarations are looked up in the dataset, so a
    dataset's many image-field shard entries are not pickled twice to every worker).
    """

    def __init__(self, dataset: DatasetIndex, names: tuple[str, ...], multi_hot: Sequence[str],
                 geometry: Mapping[str, Any] | None, decode: Any, layout: str) -> None:
        from .transforms import DecodeTransform

        self.names = names
        self.layout = layout
        self.decode_bytes = decode is False
        self.kinds = {name: dataset.field_spec(name).kind for name in names if name not in FIELDS}
        chosen = (multi_hot,) if isinstance(multi_hot, str) else tuple(multi_hot or ())
        for name in chosen:
            if name not in self.kinds:
                raise OptionError(f"multi_hot names {name!r}, which is not a declared field that fields= asks for "
                                  f"({[n for n in names if n not in FIELDS]})")
            spec = dataset.field_spec(name)
            if spec.kind != "classes":
                raise OptionError(f"multi_hot is for classes fields; {spec.describe()} is not one")
            if spec.num_classes > MAX_MULTI_HOT:
                raise OptionError(f"multi_hot: field {name!r} has {spec.num_classes} classes, over the {MAX_MULTI_HOT} "
                                  f"a dense vector is built for; read its ids (leave it out of multi_hot)")
        self.multi_hot = frozenset(chosen)
        self.geometry = _check_geometry(geometry, names, dataset, decode)
        self.boxes = next((name for name, kinds in self.geometry.items() if "xyxy" in kinds), None)
        self.per_box = frozenset(name for name, kinds in self.geometry.items() if "per-box" in kinds) - {self.boxes}
        self.image_fields = tuple(name for name, kind in self.kinds.items() if kind == "image")
        # Only packer's fused transforms move the image; ask them for the crop when a field follows it.
        self.wants_geometry = isinstance(decode, DecodeTransform) and bool(self.geometry or self.image_fields)
        self.decodes_image = "image" in names or self.wants_geometry
        if (self.wants_geometry and self.image_fields and dataset.manifest.codec.get("name") == "raw"
                and not keeps_source_geometry(dataset.manifest)):
            # raw centre-crops each image to its fixed size: a second image kept as stored shows
            # another framing, and no scale maps one onto the other
            raise OptionError(f"image fields {list(self.image_fields)} cannot follow a crop of a raw-codec "
                              f"dataset (raw centre-cropped and resampled the images, not the fields); build with "
                              f"--codec passthrough or tiled, or read the fields without a crop transform")
        self.variable = frozenset(name for name, kind in self.kinds.items()
                                  if (kind == "classes" and name not in self.multi_hot)
                                  or (kind == "array" and dataset.field_spec(name).variable))

    def read(self, dataset: Dataset, idx: np.ndarray, images: list[Any] | None, labels: list[Any] | torch.Tensor,
             geometries: list[Any] | None,
             min_visibility: float) -> tuple[dict[str, list[Any]], dict[str, torch.Tensor]]:
        """Every chosen field of the batch ``idx``: ``(values, columns)``, ``values`` a list per
        field (one value per sample), ``columns`` the fixed-shape fields as one ``(B, ...)``
        tensor each instead. ``images`` and ``labels`` are the samples' (None: the images are a
        batch tensor the caller has; a tensor of labels is a column), ``geometries`` their crops
        (None entries, or no list: the image as stored)."""
        count = len(idx)
        index_list = idx.tolist()
        crops = geometries if geometries is not None else [None] * count
        values: dict[str, list[Any]] = {}
        columns: dict[str, torch.Tensor] = {}
        keeps: list[np.ndarray | None] = [None] * count
        if self.boxes is not None:  # first: the per-box fields drop the rows it drops
            values[self.boxes], keeps = self._boxes(dataset, self.boxes, index_list, crops, min_visibility)
        for name in self.names:
            if name in values:
                continue
            if name == "image":
                values[name] = images if images is not None else []
            elif name == "label":
                if isinstance(labels, torch.Tensor):
                    columns[name] = labels
                else:
                    values[name] = labels
            elif name == "index":
                values[name] = index_list
            elif name == "key":
                values[name] = [dataset.key(i) for i in index_list]
            elif name == "metadata":
                values[name] = [dataset.metadata(i) for i in index_list]
            else:
                kind = self.kinds[name]
                if kind == "text":
                    values[name] = [dataset.field_value(name, i) for i in index_list]
                elif kind == "image":
                    values[name] = [self._image(dataset, name, i, crop) for i, crop in zip(index_list, crops)]
                elif kind == "classes" and name in self.multi_hot:
                    columns[name] = self._multi_hot(dataset, name, index_list)
                elif kind == "array" and name not in self.variable:
                    columns[name] = self._fixed(dataset, name, idx, crops)
                else:
                    values[name] = [self._variable(dataset, name, i, crop, keep)
                                    for i, crop, keep in zip(index_list, crops, keeps)]
        return values, columns

    def samples(self, values: dict[str, list[Any]], columns: dict[str, torch.Tensor],
                batch: torch.Tensor | None) -> _FieldSamples:
        """``read``'s values as dict samples (a column's rows are views of it)."""
        values = dict(values)
        for name, column in columns.items():
            values[name] = list(column.unbind(0))
        rows = []
        for row in zip(*(values[name] for name in self.names)):
            sample = _FieldSample(zip(self.names, row))
            sample.variable = self.variable
            rows.append(sample)
        return _FieldSamples(rows, batch, columns)

    def _boxes(self, dataset: Dataset, name: str, index_list: list[int], crops: Sequence[Any],
               min_visibility: float) -> tuple[list[torch.Tensor], list[np.ndarray | None]]:
        tensors, keeps = [], []
        for i, crop in zip(index_list, crops):
            boxes = dataset.field_value(name, i)
            if crop is None:
                tensors.append(torch.from_numpy(boxes if boxes.flags.writeable else boxes.copy()))
                keeps.append(None)
                continue
            mapped, keep = crop.map_boxes(boxes, min_visibility)
            tensors.append(torch.from_numpy(np.ascontiguousarray(mapped[keep])))
            keeps.append(keep)
        return tensors, keeps

    def _variable(self, dataset: Dataset, name: str, i: int, crop: Any, keep: np.ndarray | None) -> torch.Tensor:
        value = dataset.field_value(name, i)
        if name in self.per_box and keep is not None:
            if len(value) != len(keep):
                raise IndexMismatchError(
                    f"field {name!r} has {len(value)} rows but {self.boxes!r} has {len(keep)} boxes (geometry= says "
                    f"{name!r} is per-box: one row per box) (key {dataset.key(i)!r})", path=dataset.path, sample=i)
            value = value[keep]
        if crop is not None and "points" in self.geometry.get(name, ()):
            value = crop.map_points(value)
        return torch.from_numpy(np.array(value, copy=True) if not value.flags.writeable else value)

    def _fixed(self, dataset: Dataset, name: str, idx: np.ndarray, crops: Sequence[Any]) -> torch.Tensor:
        """A fixed-shape array field for the whole batch: one gather from the zero-copy column."""
        column = dataset.field_array(name)
        if "points" in self.geometry.get(name, ()) and any(crop is not None for crop in crops):
            gathered = column[idx]
            moved = np.stack([crop.map_points(value) if crop is not None else value.astype(np.float32)
                              for value, crop in zip(gathered, crops)]) if len(idx) else gathered
            out = _empty(moved.shape, _torch_dtype(moved.dtype))
            out.numpy()[...] = moved
            return out
        out = _empty((len(idx), *column.shape[1:]), _torch_dtype(column.dtype))
        np.take(column, idx, axis=0, out=out.numpy())
        return out

    def _multi_hot(self, dataset: Dataset, name: str, index_list: list[int]) -> torch.Tensor:
        out = _empty((len(index_list), dataset.field_spec(name).num_classes), torch.float32)
        out.zero_()
        view = out.numpy()
        for j, i in enumerate(index_list):
            view[j, dataset.field_value(name, i)] = 1
        return out

    def _image(self, dataset: Dataset, name: str, i: int, crop: Any) -> torch.Tensor:
        if self.decode_bytes:  # decode=False: every image as its stored bytes
            return torch.from_numpy(np.frombuffer(dataset.field_bytes(name, i), dtype=np.uint8).copy())
        array = dataset.field_image(name, i)  # a fresh array, values as stored
        if crop is not None:
            array = crop.resample_nearest(array)
        tensor = torch.from_numpy(array)
        if tensor.dim() == 3 and self.layout == "CHW":
            tensor = tensor.permute(2, 0, 1).contiguous()
        return tensor


def _refuse_decode_transform(transform: Any) -> None:
    """packer's crops decode the stored bytes: as ``transform=`` they would get a tensor and fail
    on every sample with an obscure error (the torchvision habit is to pass crops as transform)."""
    from .errors import OptionError
    from .transforms import DecodeTransform

    if isinstance(transform, DecodeTransform):
        name = type(transform).__name__
        raise OptionError(f"packer.transforms.{name} decodes the stored bytes itself: pass it as decode=, "
                          f"not transform= (e.g. PackedDataset(path, decode={name}(...))); transform= is for "
                          f"functions of the decoded image tensor (torchvision transforms)")


class _Pipeline:
    """Bytes -> image tensor -> transform, and label -> target_transform. Holds options only."""

    def __init__(self, decode: bool | DecodeFn, layout: str, transform: Callable[[Any], Any] | None,
                 target_transform: Callable[[Any], Any] | None) -> None:
        if layout not in LAYOUTS:
            raise OptionError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
        if not (decode is True or decode is False or callable(decode)):
            raise OptionError(f"decode must be True, False or a callable, got {decode!r}")
        self.decode = decode
        self.layout = layout
        #: The pixel limit of ``decode_image`` (the dataset's recorded one, set by the dataset).
        self.max_pixels = DEFAULT_MAX_PIXELS
        self.transform = transform
        self.target_transform = target_transform

    def pixels(self, dataset: Dataset, i: int, data: np.ndarray, geometries: list[Any] | None = None) -> Any:
        """The sample's image before layout: HWC pixels, or the 1-D payload when not decoding.

        With ``geometries`` (a list, and a fused transform), the crop this decode used is
        appended to it (``DecodeTransform.decode_with_geometry``).
        """
        if self.decode is False:
            return data
        from .transforms import DecodeTransform

        image_format = int(dataset.index.image_format[i])
        fused = isinstance(self.decode, DecodeTransform)
        if self.decode is True or fused:
            if image_format == fmt.ImageFormat.RAW:
                ix = dataset.index
                shape = (int(ix.height[i]), int(ix.width[i]), int(ix.channels[i]))
                if math.prod(shape) != data.size:
                    raise DecodeError(f"raw payload of {data.size} bytes does not hold the index's "
                                      f"{shape[0]}x{shape[1]}x{shape[2]} pixels", path=dataset.path, sample=i)
                if fused:  # crop and resize the raw pixels; the index keys seeded draws
                    return self._fused(data.reshape(shape), image_format, geometries, index=i, name=dataset.key(i))
                return data.reshape(shape)
            if fused:
                return self._fused(data, image_format, geometries, index=i)
            try:
                return decode_image(data, image_format, max_pixels=self.max_pixels)
            except DecodeError as exc:
                raise DecodeError(f"{exc.message} (key {dataset.key(i)!r})", path=dataset.path, sample=i) from None
        return self.decode(data, image_format)

    def _fused(self, data: Any, image_format: int, geometries: list[Any] | None, **options: Any) -> Any:
        if geometries is None:
            return self.decode(data, image_format, **options)
        pixels, geometry = self.decode.decode_with_geometry(data, image_format, **options)
        geometries.append(geometry)
        return pixels

    def tensor(self, pixels: Any, *, owned: bool) -> torch.Tensor:
        """``pixels`` as a tensor in the chosen layout: a view when possible (maybe non-contiguous).

        Args:
            pixels: what ``pixels`` returned.
            owned: ``pixels`` may be wrapped without a copy (a fresh, writable buffer).
        """
        if isinstance(pixels, torch.Tensor):
            tensor = pixels
        else:
            array = np.asarray(pixels)
            if not owned or not array.flags.writeable:
                array = array.copy()
            tensor = torch.from_numpy(array)
        if self.decode is not False and self.layout == "CHW" and tensor.dim() == 3:
            tensor = tensor.permute(2, 0, 1)
        return tensor

    def batch_shape(self, count: int) -> tuple[int, ...] | None:
        """``(count, H, W, 3)`` when samples can be decoded straight into a batch: a decode
        transform with a fixed ``output_shape`` that takes ``out=`` (``packer.transforms``), the
        HWC layout and no ``transform``; else None."""
        from .transforms import DecodeTransform

        if (self.layout != "HWC" or self.transform is not None or count < 1
                or not isinstance(self.decode, DecodeTransform)):
            return None
        return (count, *self.decode.output_shape)

    def finish(self, tensor: torch.Tensor) -> Any:
        """Apply the transform (to a contiguous tensor); without one, make the tensor contiguous."""
        tensor = tensor.contiguous()
        return self.transform(tensor) if self.transform is not None else tensor

    def label(self, dataset: Dataset, i: int) -> Any:
        label = int(dataset.index.label[i])
        return self.target_transform(label) if self.target_transform is not None else label


class PackedDataset(torch_data.Dataset):
    """A map-style ``torch.utils.data.Dataset`` over a packed dataset: ``ds[i] -> (image, label)``.

    See the module docstring for what ``image`` is. ``__getitems__`` (used by the DataLoader
    when it has a batch sampler or ``batch_size``) decodes from zero-copy mmap views, or reads a
    whole batch with one coalesced ``read_batch`` first (other backends, checksums, raw bytes).

    torchvision's ``ImageFolder`` names that fit a flat index are here: ``classes``,
    ``class_to_idx``, ``targets`` (a read-only zero-copy int64 array, not a list) and ``root``.
    Deliberately missing: ``samples`` and ``imgs`` (a list of ``(path, label)`` tuples costs
    ~150 bytes of Python objects per sample, per worker: use ``dataset.key(i)``), ``loader``
    and ``extensions`` (packer decides by the bytes), and ``find_classes`` (the class list is
    fixed at build time: ``packer build --classes``).

    Args:
        source: the dataset folder, or an open ``packer.dataset.Dataset``.
        decode: ``True`` (decode to pixels), ``False`` (stored bytes) or a callable
            ``decode(data, image_format) -> HWC array`` such as ``packer.transforms.RandomResizedCrop``.
        layout: ``"CHW"`` (default) or ``"HWC"``.
        transform: applied to the image tensor (torchvision tensor transforms work).
        target_transform: applied to the int label.
        backend: ``"mmap"``, ``"pread"`` or ``"direct"`` (see ``packer.open_dataset``).
        verify_checksums: check every sample's xxh3 on read.
        classes: the class list this dataset must have (e.g. ``train.classes`` when opening the
            validation set): a mismatch raises ``ClassListMismatchError`` at once.
        fields: what a sample holds: built-ins from ``FIELDS`` (``"image"``, ``"label"``,
            ``"index"``, ``"key"``, ``"metadata"``) and the dataset's declared fields
            (``dataset.fields``, formats/SPEC.md §14). The default ``("image", "label")`` gives
            ``(image, label)`` tuples; any other choice a dict per sample, in the order given
            (``collate`` makes a dict per batch). Values: ``array`` fields a tensor of their
            dtype and shape (variable ones ``(n, *rest)``); ``classes`` fields the sample's
            sorted int64 class ids, or a float32 multi-hot vector (``multi_hot``); ``text``
            fields a str; ``image`` fields a tensor of their values as stored
            (``Dataset.field_image``: a palette mask its indices, a 16-bit depth map uint16), ``(H,
            W)`` for one channel, ``(C, H, W)`` or ``(H, W, C)`` by ``layout`` for more (the stored
            bytes with ``decode=False``). With a fused transform as ``decode`` (``RandomResizedCrop``,
            ``CenterCrop``), image fields get the main image's crop, resize and flip, nearest
            neighbour (``CropGeometry.resample_nearest``: no new label or depth values); with
            ``decode=True`` or a callable of your own they come back as stored. ``transform``
            touches the main image only. Leaving ``"image"`` out skips decoding it.
        multi_hot: ``classes`` fields (among ``fields``) to return as ``(num_classes,)`` float32
            multi-hot vectors (the BCE target) instead of their ids.
        geometry: array fields (among ``fields``) that the fused transform's crop moves, as
            ``{name: kind}``: ``"xyxy"`` for boxes ``DTYPE[N,4]`` in the stored image's pixels
            (mapped to output pixels, clipped, and dropped when nothing of them is left, or less
            than the transform's ``min_box_visibility``: ``CropGeometry.map_boxes``),
            ``"points"`` for keypoints ``(..., 2|3)`` (x, y[, visibility]; points outside the
            output get visibility 0: ``CropGeometry.map_points``), ``"per-box"`` for rows that go
            with the boxes (labels, iscrowd: dropped in step with them), ``("points",
            "per-box")`` for keypoints that go with them. E.g. ``geometry={"boxes": "xyxy",
            "labels": "per-box"}``. Moved coordinates are float32 (float64 stays float64).
            Array fields not named here come back as stored. With ``decode=True``/``False``
            nothing moves (the image is as stored).

    Raises:
        ClassListMismatchError: ``classes`` given and different from the dataset's.
        OptionError: a decode transform passed as ``transform=``, an unknown field (the message
            lists the dataset's), or ``multi_hot``/``geometry`` entries that do not fit their
            field's declaration.
    """

    def __init__(self, source: PathOrDataset, *, decode: bool | DecodeFn = True, layout: str = "CHW",
                 transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[Any], Any] | None = None, backend: str = "mmap",
                 verify_checksums: bool = False, classes: Sequence[str] | None = None,
                 fields: Sequence[str] = DEFAULT_FIELDS, multi_hot: Sequence[str] = (),
                 geometry: Mapping[str, str | Sequence[str]] | None = None) -> None:
        _refuse_decode_transform(transform)
        self._pipeline = _Pipeline(decode, layout, transform, target_transform)
        self.dataset = _open(source, backend, verify_checksums)
        self._fields = _check_fields(fields, self.dataset)
        self._plan: _FieldPlan | None = None
        if self._fields != DEFAULT_FIELDS or multi_hot or geometry:  # (these name fields: checked there)
            self._plan = _FieldPlan(self.dataset, self._fields, multi_hot, geometry, decode, layout)
        if decode is not False:
            # SPEC §6: a decoding reader refuses a codec it does not know, and decodes with the
            # pixel limit the build recorded (so every image the build accepted decodes).
            check_decodable(self.dataset.manifest.codec, path=self.dataset.path)
            self._pipeline.max_pixels = dataset_max_pixels(self.dataset.manifest)
        if classes is not None:
            check_classes(tuple(classes), self.dataset)

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def classes(self) -> tuple[str, ...]:
        return self.dataset.classes

    @property
    def class_to_idx(self) -> dict[str, int]:
        """``{class name: label}``, as torchvision's ``ImageFolder.class_to_idx``."""
        return {name: i for i, name in enumerate(self.dataset.classes)}

    @property
    def targets(self) -> np.ndarray:
        """Every sample's label: a read-only, zero-copy int64 view of the index (torchvision's
        ``ImageFolder.targets`` is a list; this indexes, slices and ``len``s the same way)."""
        labels = self.dataset.labels.view()
        labels.flags.writeable = False
        return labels

    @property
    def root(self) -> str:
        """The dataset folder."""
        return str(self.dataset.path)

    @property
    def fields(self) -> tuple[str, ...]:
        """What each sample holds (see the class docstring)."""
        return self._fields

    @property
    def labels(self) -> np.ndarray:
        """int64 labels of every sample (a zero-copy view of the index)."""
        return self.dataset.labels

    def _index(self, i: Any) -> int:
        try:
            i = int(i)
        except TypeError:
            raise TypeError(f"sample indices must be integers, got {type(i).__name__}") from None
        count = len(self.dataset)
        if not -count <= i < count:
            raise IndexError(f"sample {i} out of range for a dataset of {count} samples")
        return i % count

    def __getitem__(self, i: int) -> Any:
        i = self._index(i)
        if self._plan is not None:
            return self.__getitems__([i])[0]
        data = np.frombuffer(self.dataset.get(i), dtype=np.uint8)  # zero-copy over the shard mapping
        pipeline = self._pipeline
        pixels = pipeline.pixels(self.dataset, i, data)
        image = pipeline.finish(pipeline.tensor(pixels, owned=pixels is not data))
        sample = (image, pipeline.label(self.dataset, i))
        return sample

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Samples ``indices``: decoded from zero-copy views with the mmap backend, else read with
        one coalesced ``read_batch`` (a run per contiguous group). With ``fields=``, dict samples
        whose fixed-shape fields are gathered for the whole batch from the index's zero-copy
        columns (one ``take`` per field, straight into the batch tensor ``collate`` returns)."""
        plan = self._plan
        if plan is None or self._fields == DEFAULT_FIELDS:
            return self._pairs(indices)
        idx = as_sample_indices(indices).reshape(-1)
        n = len(self.dataset)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"batch holds an index outside -{n}..{n - 1}")
        idx = idx % n if n else idx
        return plan.samples(*self._read_fields(idx))

    def _read_fields(self, idx: np.ndarray, *, columnar: bool = False
                     ) -> tuple[dict[str, list[Any]], dict[str, torch.Tensor], torch.Tensor | None]:
        """``_FieldPlan.read`` of a batch of in-range indices, and the images' batch tensor (or None).

        ``columnar`` (a collated batch, no per-sample dicts): a raw dataset's images stay one
        batch tensor and the labels one gather, as in ``load_batch``'s ``(images, labels)`` path.
        """
        plan: _FieldPlan = self._plan  # type: ignore[assignment]  # called with fields= only
        dataset, pipeline = self.dataset, self._pipeline
        geometries: list[Any] | None = [] if plan.wants_geometry else None
        batch = self._raw_batch(idx, geometries) if columnar and plan.decodes_image else None
        images: list[Any] | None = None
        labels: list[Any] | torch.Tensor
        if batch is None and plan.decodes_image:
            pairs = self._pairs(idx, geometries)
            batch = getattr(pairs, "batch", None)
            images, labels = [pair[0] for pair in pairs], [pair[1] for pair in pairs]
        elif columnar and pipeline.target_transform is None:  # no image asked for, or the raw batch
            labels = torch.from_numpy(dataset.labels[idx].astype(np.int64))
        else:
            labels = [pipeline.label(dataset, i) for i in idx.tolist()]
        min_visibility = getattr(pipeline.decode, "min_box_visibility", 0.0)
        values, columns = plan.read(dataset, idx, images, labels, geometries, min_visibility)
        return values, columns, batch

    def _pairs(self, indices: Sequence[int], geometries: list[Any] | None = None) -> list[tuple[Any, Any]]:
        """``(image, label)`` of each index; with ``geometries`` (a list), each sample's crop is
        appended to it, in order (fused transforms only)."""
        idx = as_sample_indices(indices).reshape(-1)
        pipeline = self._pipeline
        dataset = self.dataset
        n = len(dataset)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"batch holds an index outside -{n}..{n - 1}")
        idx = idx % n if n else idx
        images = self._raw_batch(idx, geometries)
        if images is not None:
            return _BatchSamples(images, [pipeline.label(dataset, i) for i in idx.tolist()])
        if pipeline.decode is not False and dataset.backend_name == "mmap" and not dataset.verify_checksums:
            shape = pipeline.batch_shape(len(idx))
            if shape is not None:
                return self._decode_into_batch(idx, shape, geometries)
            # Decoding from zero-copy views of the mapping: no batch buffer, no memcpy of the
            # payloads (the decoder reads the page cache directly); the pixels are fresh arrays.
            samples = []
            for i in idx.tolist():
                data = np.frombuffer(dataset.get(i), dtype=np.uint8)
                pixels = pipeline.pixels(dataset, i, data, geometries)
                samples.append((pipeline.finish(pipeline.tensor(pixels, owned=pixels is not data)),
                                pipeline.label(dataset, i)))
            return samples
        batch = self.dataset.read_batch(idx)
        samples = []
        seen: set[int] = set()
        for j, i in enumerate(idx.tolist()):
            start = int(batch.starts[j])
            data = batch.data[start:start + int(batch.sizes[j])]  # a view of the fresh batch buffer
            pixels = pipeline.pixels(self.dataset, i, data, geometries)
            # A repeated index shares its bytes with its first occurrence: copy it, so an in-place
            # transform of one sample never changes another.
            samples.append((pipeline.finish(pipeline.tensor(pixels, owned=i not in seen)),
                            pipeline.label(self.dataset, i)))
            seen.add(i)
        return samples

    def _decode_into_batch(self, idx: np.ndarray, shape: tuple[int, ...],
                           geometries: list[Any] | None = None) -> "_BatchSamples":
        """Decode each sample straight into its slot of one batch tensor (in shared memory
        inside a worker): no per-sample array and no copy when ``collate`` stacks them."""
        dataset, pipeline = self.dataset, self._pipeline
        batch = _empty(shape, torch.uint8)
        out = batch.numpy()
        labels = []
        for k, i in enumerate(idx.tolist()):
            data = np.frombuffer(dataset.get(i), dtype=np.uint8)
            try:
                if geometries is None:
                    pipeline.decode(data, int(dataset.index.image_format[i]), out=out[k], index=i)
                else:
                    geometries.append(pipeline.decode.decode_with_geometry(
                        data, int(dataset.index.image_format[i]), out=out[k], index=i)[1])
            except DecodeError as exc:
                raise DecodeError(f"{exc.message} (key {dataset.key(i)!r})", path=dataset.path,
                                  sample=i) from None
            labels.append(pipeline.label(dataset, i))
        return _BatchSamples(batch, labels)

    def load_batch(self, indices: Sequence[int], collate_fn: Callable[[Any], Any] | None = None, *,
                   out: torch.Tensor | None = None) -> Any:
        """``collate(self.__getitems__(indices))``, without per-sample objects where it can.

        For a ``raw`` dataset (``decode=True`` or a fused transform, no ``transform``) the batch
        tensor and the labels come straight from the batched path; otherwise it is exactly
        ``collate(self.__getitems__(indices))``. ``packer.threaded.ThreadedLoader`` calls it.

        Args:
            indices: the batch's sample indices.
            collate_fn: collates dict samples (``fields=``); default ``collate``
                (``PaddedCollate()`` pads variable fields).
            out: on the batched raw path, a tensor of ``fast_batch_shape(len(indices))`` to
                write the images into (ignored elsewhere, or when its shape or dtype differ).

        Returns:
            ``(images, labels)`` as ``collate`` returns them, or a dict batch with ``fields=``.
        """
        idx = as_sample_indices(indices).reshape(-1)
        n = len(self.dataset)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"batch holds an index outside -{n}..{n - 1}")
        idx = idx % n if n else idx
        if self._plan is not None and self._fields != DEFAULT_FIELDS:
            if collate_fn is not None and collate_fn is not collate and type(collate_fn) is not PaddedCollate:
                return collate_fn(self.__getitems__(idx))
            # packer's own collates: straight from the columns, no per-sample dicts
            values, columns, batch = self._read_fields(idx, columnar=True)
            return _collate_columns(self._fields, values, columns, self._plan.variable, batch, len(idx),
                                    collate_fn if type(collate_fn) is PaddedCollate else None)
        images = self._raw_batch(idx, out=out)
        if images is None:
            return collate(self.__getitems__(idx))
        if self._pipeline.target_transform is None:
            return images, torch.from_numpy(self.dataset.labels[idx].astype(np.int64))
        return collate(_BatchSamples(images, [self._pipeline.label(self.dataset, i) for i in idx.tolist()]))

    def fast_batch_shape(self, count: int) -> tuple[int, ...] | None:
        """The shape of the uint8 images tensor ``load_batch`` makes for ``count`` samples on the
        batched raw path (a ``raw`` dataset, ``decode=True`` or a fused transform in ``HWC``, no
        ``transform``, the default fields), or None when it takes another path."""
        if self._plan is not None and self._fields != DEFAULT_FIELDS:
            return None
        fast = _raw_fast_shape(self.dataset, self._pipeline, count)
        return None if fast is None else fast[0]

    def _raw_batch(self, idx: np.ndarray, geometries: list[Any] | None = None, *,
                   out: torch.Tensor | None = None) -> torch.Tensor | None:
        """The batch tensor of a raw dataset's fast paths (``_raw_fast_batch``), or None."""
        return _raw_fast_batch(self.dataset, self._pipeline, idx, geometries, out=out)

    def close(self) -> None:
        self.dataset.close()


def _raw_fast_shape(dataset: Dataset, pipeline: _Pipeline,
                    count: int) -> tuple[tuple[int, ...], bool, tuple[int, int, int]] | None:
    """``(batch shape, crop, stored sample shape)`` of a raw dataset's fast paths for ``count``
    samples, or None when they do not apply (another codec, a ``transform``, ``decode=False``, a
    callable that is not a fused transform)."""
    if count < 1 or pipeline.decode is False or pipeline.transform is not None:
        return None
    crop_shape = pipeline.batch_shape(count)  # a fused transform, HWC
    if crop_shape is None and pipeline.decode is not True:
        return None
    raw_shape = raw_shape_of(dataset)
    if raw_shape is None:
        return None
    if crop_shape is not None:
        return crop_shape, True, raw_shape
    if pipeline.layout == "HWC":
        return (count, *raw_shape), False, raw_shape
    return (count, raw_shape[2], raw_shape[0], raw_shape[1]), False, raw_shape


def _raw_fast_batch(dataset: Dataset, pipeline: _Pipeline, idx: np.ndarray,
                    geometries: list[Any] | None = None, *,
                    out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The batch tensor of a raw dataset's fast paths (gather, or gather + batched crop), or None
    when they do not apply (``_raw_fast_shape``). Shared by ``PackedDataset`` and
    ``PackedIterableDataset``.

    Raw pixels are gathered from the shard views (``rawcrop.read_raw_batch``); with a fused
    transform (``HWC``) they are cropped, resized and flipped in one vectorised pass
    (``DecodeTransform.batch``) straight into the batch tensor (``out`` when it is a contiguous
    uint8 tensor of the batch's shape, else a new one, in shared memory inside a worker), each
    sample's crop appended to ``geometries`` when it is a list. Without one the pixels are
    gathered straight into it (``HWC``), or gathered and transposed once (``CHW``).
    """
    fast = _raw_fast_shape(dataset, pipeline, len(idx))
    if fast is None:
        return None
    shape, crop, raw_shape = fast
    if out is not None and tuple(out.shape) == shape and out.dtype == torch.uint8 and out.is_contiguous():
        batch = out
    else:
        batch = _empty(shape, torch.uint8)
    if crop:  # raw pixels: one batched crop-resize (packer.rawcrop)
        pixels = read_raw_batch(dataset, idx, raw_shape)
        if geometries is None:
            pipeline.decode.batch(pixels, idx, out=batch)
        else:
            geometries.extend(pipeline.decode.batch_with_geometry(pixels, idx, out=batch)[1])
    elif pipeline.layout == "HWC":
        read_raw_batch(dataset, idx, raw_shape, out=batch.numpy())
    else:
        batch.copy_(torch.from_numpy(read_raw_batch(dataset, idx, raw_shape)).permute(0, 3, 1, 2))
    return batch


class _BatchSamples(list):
    """``(image, label)`` samples whose images are views of one batch tensor, ``batch``.

    Any ``collate_fn`` sees an ordinary list of samples; ``packer.torch.collate`` returns
    ``batch`` itself instead of copying the images into a new tensor.
    """

    def __init__(self, batch: torch.Tensor, labels: list[Any]) -> None:
        super().__init__(zip(batch.unbind(0), labels))
        self.batch = batch


def _blocks_of(source: Any, order: str, block_bytes: int,
               block_samples: int | None) -> tuple[int, np.ndarray | None]:
    """(sample count, block boundaries for the block order) of a dataset, an index, or a length."""
    if isinstance(source, (PackedDataset, PackedIterableDataset)):
        source = source.dataset
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
    from .transforms import DecodeTransform

    decode = getattr(getattr(source, "_pipeline", None), "decode", None)
    return decode if isinstance(decode, DecodeTransform) and getattr(decode, "seed", None) is not None else None


class _FollowsEpoch:
    """``set_epoch`` also moves the dataset's seeded crops: a loop that moves only the sampler
    (the DistributedSampler habit) would otherwise train every epoch on epoch 0's crops."""

    _crops: Any = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration, and of the dataset's seeded crops if any."""
        super().set_epoch(epoch)  # type: ignore[misc]
        if self._crops is not None:
            self._crops.set_epoch(epoch)


class PackedSampler(_FollowsEpoch, CursorReader, torch_data.Sampler):
    """Yields this rank's sample indices for one epoch (a drop-in for ``DistributedSampler``).

    The epoch order, the rank split and the pad/drop rule are those of ``packer.order``; without
    ``batch_size`` ranks take every ``world_size``-th sample like ``DistributedSampler``. Give
    the DataLoader's batch size as ``batch_size`` for batch-aligned shares (needed for the block
    order's locality, and to save the position as ``state_dict(batches_consumed=...)``).

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
        self.cursor = _sampler_cursor(data_source, order=order, seed=seed, rank=rank, world_size=world_size,
                                      batch_size=1 if batch_size is None else batch_size, drop_last=drop_last,
                                      block_bytes=block_bytes, window=window, block_samples=block_samples,
                                      count_samples=True)

    def __len__(self) -> int:
        return self.share().per_rank

    def __iter__(self) -> Iterator[int]:
        indices = self.cursor.begin().indices
        for begin in range(0, len(indices), _YIELD_CHUNK):
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
        self.cursor = _sampler_cursor(data_source, batch_size=batch_size, count_samples=False, **settings)
        self.sampler = PackedSampler(data_source, batch_size=batch_size, **settings)
        self.sampler.cursor.position = self.cursor.position  # one position for both
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __len__(self) -> int:
        return self.share().num_batches

    def __iter__(self) -> Iterator[list[int]]:
        plan = self.cursor.begin()
        for k in range(plan.num_batches):
            self.cursor.handed_out += 1
            yield plan.batch(k).tolist()


class PackedDataLoader(torch_data.DataLoader):
    """A ``DataLoader`` that knows how far its packer reader got: ``state_dict()`` with no arguments.

    It counts the batches it has handed to *your loop* (not what its workers prefetched), and
    asks its packer reader (a ``PackedBatchSampler`` as ``batch_sampler``, a ``PackedSampler``
    as ``sampler``, or a ``PackedIterableDataset`` as dataset) for the matching position. So the
    natural wiring cannot resume at the wrong place::

        loader = PackedDataLoader(train, sampler=PackedSampler(train, seed=0), batch_size=64,
                                  num_workers=8, pin_memory=True)
        loader.load_state_dict(checkpoint["loader"])      # if resuming
        for epoch in range(loader.epoch, epochs):
            loader.set_epoch(epoch)
            for images, labels in loader:
                ...
                save({"loader": loader.state_dict()})

    Takes every ``DataLoader`` argument. A ``PackedSampler`` given ``batch_size`` must agree
    with the loader's.

    Raises:
        OptionError: no packer reader to track, or a sampler batch size that is not the loader's.
    """

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(dataset, *args, **kwargs)
        reader = self._packer_reader()
        if isinstance(reader, PackedSampler) and reader.batch_size not in (None, self.batch_size):
            raise OptionError(f"the PackedSampler was given batch_size={reader.batch_size} but the DataLoader's "
                              f"batch_size is {self.batch_size}: give both the same, or leave the sampler's out")
        self._yielded = 0

    def _packer_reader(self) -> Any:
        batch_sampler = self.batch_sampler
        if isinstance(batch_sampler, PackedBatchSampler):
            return batch_sampler
        if isinstance(self.sampler, PackedSampler):
            return self.sampler
        if isinstance(self.dataset, PackedIterableDataset):
            return self.dataset
        raise OptionError("PackedDataLoader tracks a packer reader: pass batch_sampler=PackedBatchSampler(...), "
                          "sampler=PackedSampler(...) or a PackedIterableDataset")

    def __iter__(self) -> Iterator[Any]:
        self._yielded = 0
        for batch in super().__iter__():
            self._yielded += 1  # counted as your loop receives it: prefetched batches are not consumed
            yield batch

    @property
    def epoch(self) -> int:
        return self._packer_reader().epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (forwarded to the reader)."""
        self._packer_reader().set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The position after the batches this loader handed out in its current iteration."""
        reader = self._packer_reader()
        if isinstance(reader, PackedSampler):  # the loader batches samples: count samples
            return reader.state_dict(samples_consumed=self._yielded * int(self.batch_size or 1))
        if isinstance(reader, PackedIterableDataset) and not reader.batched:
            return reader.state_dict(samples_consumed=self._yielded * int(self.batch_size or 1))
        return reader.state_dict(batches_consumed=self._yielded)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the reader at a saved position (before iterating)."""
        self._packer_reader().load_state_dict(state)
        self._yielded = 0


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
    """``(epoch, start)`` in a two-element shared-memory tensor: one position for the main process
    and every (persistent) DataLoader worker."""

    def __init__(self) -> None:
        self._cell = torch.zeros(2, dtype=torch.int64).share_memory_()

    def get(self) -> tuple[int, int]:
        epoch, start = self._cell.tolist()
        return int(epoch), int(start)

    def set(self, epoch: int, start: int) -> None:
        self._cell[0] = int(epoch)
        self._cell[1] = int(start)


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
        order: ``"sequential"``, ``"random"`` or ``"block"`` (default).
        seed: the run's seed; orders are functions of (seed, epoch).
        rank, world_size: default from ``torch.distributed`` when initialised, else 0 and 1.
        drop_last: drop the end of the epoch order (full batches only) instead of padding.
        decode, layout, transform, target_transform: as for ``PackedDataset``.
        backend, verify_checksums: as for ``packer.open_dataset``.
        block_bytes, window: the block shuffle's block span and window (in blocks).
        batched: yield collated batches (default) or single samples.
        read_ahead: issue the block read-ahead hints (block order).
        fields, multi_hot, geometry: what a sample holds, as for ``PackedDataset``; with any
            other ``fields`` than ``("image", "label")`` batches are dicts (and samples, with
            ``batched=False``).
        collate_fn: collates a batch of dict samples (default ``collate``; ``PaddedCollate()``
            pads the variable fields). Unused for ``(image, label)`` samples.
    """

    def __init__(self, source: PathOrDataset, *, batch_size: int, order: str = "block", seed: int = 0,
                 rank: int | None = None, world_size: int | None = None, drop_last: bool = False,
                 decode: bool | DecodeFn = True, layout: str = "CHW", transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[Any], Any] | None = None, backend: str = "mmap",
                 verify_checksums: bool = False, block_bytes: int = DEFAULT_BLOCK_BYTES,
                 window: int = DEFAULT_WINDOW, batched: bool = True, read_ahead: bool = True,
                 fields: Sequence[str] = DEFAULT_FIELDS, multi_hot: Sequence[str] = (),
                 geometry: Mapping[str, str | Sequence[str]] | None = None,
                 collate_fn: Callable[[Any], Any] | None = None) -> None:
        self._pipeline = _Pipeline(decode, layout, transform, target_transform)
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
        read_order = ReadOrder(kind=order, seed=seed, block_bytes=block_bytes, window=window,
                               batch_size=batch_size, drop_last=drop_last)
        rank, world_size = resolve_rank(rank, world_size)
        # The position lives in shared memory: set_epoch/load_state_dict in the main process must
        # reach persistent workers, which keep the dataset object they were started with. Block
        # boundaries are computed per process on first use, never pickled.
        self.cursor = EpochCursor(read_order, len(self.dataset), rank=rank, world_size=world_size,
                                  blocks=self._dataset_blocks, position=_SharedPosition(),
                                  count_samples=not self.batched)
        self._advised: OrderedDict[int, None] = OrderedDict()
        self._advised_shards: set[int] = set()
        self._skip_batches = 0  # set by a worker's own state (StatefulDataLoader), used by its next iteration

    def _dataset_blocks(self) -> np.ndarray | None:
        if self.cursor.read_order.kind != "block":
            return None
        ix = self.dataset.index
        return index_blocks(ix.offset, ix.size, ix.shard, self.cursor.read_order.block_bytes)

    # Per-process caches are rebuilt, not pickled: a worker gets options and the manifest only.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["cursor"] = self.cursor.with_blocks(self._dataset_blocks)  # recomputed in the worker
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
        state = self.read_order.state_dict(self.num_samples, epoch=self.epoch, consumed=self.start,
                                           blocks=self.cursor.blocks)
        state.update(worker=int(info.id), num_workers=int(info.num_workers), worker_items=self.cursor.handed_out)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved position (see ``CursorReader.load_state_dict``), or a worker's state.

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
        self.cursor.load_state_dict(base)
        items = int(state.get("worker_items", 0))
        if not self.batched:  # a sample state: whole batches of this worker
            items //= self.batch_size
        self._skip_batches = max(0, items)

    def __iter__(self) -> Iterator[Any]:
        info = torch_data.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        indices, bounds = _worker_share(self.cursor.begin(), worker, num_workers)  # the epoch order is freed here
        _release_free_heap()
        count = len(bounds) - 1
        skip, self._skip_batches = min(self._skip_batches, count), 0  # a worker state loaded for this worker
        self.cursor.handed_out = skip if self.batched else int(bounds[skip])
        for k in range(skip, count):
            batch = indices[bounds[k]:bounds[k + 1]]
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
                yield images, labels
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
        images = _raw_fast_batch(dataset, pipeline, as_sample_indices(indices))
        if images is not None:  # raw pixels: one gather (+ one batched crop), as PackedDataset
            labels = [pipeline.label(dataset, i) for i in indices.tolist()]
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
