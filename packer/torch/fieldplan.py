"""What a sample holds: the ``fields=`` choice checked against the dataset, and the per-field
reads, conversions and geometry behind dict samples.

``fields=`` chooses what a sample holds: the built-ins ``image``, ``label``, ``index``, ``key``,
``metadata`` and any field the dataset declares (formats/SPEC.md §14, ``packer.fields``). Any
choice but ``("image", "label")`` makes samples dicts, in the order given::

    PackedDataset(path, fields=("image", "boxes", "labels", "mask", "caption"),
                  decode=RandomResizedCrop(512, seed=0), layout="HWC",
                  geometry={"boxes": "xyxy", "labels": "per-box"})

Arrays are tensors of their declared dtype and shape (variable ones ``(n, *rest)``), class sets
int64 ids (or float32 multi-hot vectors: ``multi_hot=("tags",)``), text a str, image fields
tensors of their stored values (``(H, W)`` for a mask). With a fused transform as ``decode``,
image fields get the image's crop, resize and flip (nearest neighbour: the transform's
``mask_interpolation``, torchvision's ``NEAREST`` by default), and the array fields named in
``geometry=`` are moved with it (``packer.transforms.CropGeometry``: boxes clipped and dropped by
a documented rule, with ``SanitizeBoundingBoxes``' ``min_size``/``min_area`` as the transform's
``min_box_size``/``min_box_area``, per-box rows dropped in step, keypoints made invisible outside).
``collate`` stacks fixed shapes (fixed arrays are gathered for the whole batch from the index's
zero-copy columns, into shared memory inside a worker) and lists variable ones;
``PaddedCollate`` pads them and adds ``<name>_lengths``. The iterable dataset and
``packer.threaded.ThreadedLoader`` take the same options (and ``collate_fn=``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

from ..codecs import codec_for
from ..dataset import Dataset, DatasetIndex
from ..errors import IndexMismatchError, OptionError
from ..fields import READ_FIELDS
from ..transforms.geometry import DEFAULT_MASK_INTERPOLATION, DEFAULT_MIN_BOX_AREA, DEFAULT_MIN_BOX_SIZE
from .runtime import _empty

#: The built-in parts a ``PackedDataset`` sample can hold (``fields=``), besides the dataset's
#: declared fields (formats/SPEC.md §14): every reader's (``packer.fields.READ_FIELDS``); and the default.
FIELDS = READ_FIELDS
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
    from ..transforms import DecodeTransform

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
    codec = codec_for(dataset)
    if moved and not codec.keeps_source_geometry:
        # the coordinates are in the source's pixels; the stored images are not (silently wrong boxes)
        raise OptionError(f"geometry= moves {moved} with the image, but this dataset's codec "
                          f"{codec.name!r} resized the stored images (or may have: see "
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
        from ..transforms import DecodeTransform

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
        # The transform's rules for moved fields (SanitizeBoundingBoxes' minimums, the mask mode).
        self.min_box_size = getattr(decode, "min_box_size", DEFAULT_MIN_BOX_SIZE)
        self.min_box_area = getattr(decode, "min_box_area", DEFAULT_MIN_BOX_AREA)
        self.mask_interpolation = getattr(decode, "mask_interpolation", DEFAULT_MASK_INTERPOLATION)
        self.decodes_image = "image" in names or self.wants_geometry
        codec = codec_for(dataset)
        if self.wants_geometry and self.image_fields and codec.crops_source:
            # raw centre-crops each image to its fixed size: a second image kept as stored shows
            # another framing, and no scale maps one onto the other
            raise OptionError(f"image fields {list(self.image_fields)} cannot follow a crop of a {codec.name}-codec "
                              f"dataset ({codec.name} centre-cropped and resampled the images, not the fields); "
                              f"build with --codec passthrough or tiled, or read the fields without a crop transform")
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
            mapped, keep = crop.map_boxes(boxes, min_visibility, min_size=self.min_box_size,
                                          min_area=self.min_box_area)
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
            array = crop.resample_nearest(array, self.mask_interpolation)
        tensor = torch.from_numpy(array)
        if tensor.dim() == 3 and self.layout == "CHW":
            tensor = tensor.permute(2, 0, 1).contiguous()
        return tensor
