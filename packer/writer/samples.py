"""Python values as samples: the image as bytes, the label as written, the fields, and the Dataset
objects ``packer.pack`` takes whole (a torch map-style ``Dataset``, a Hugging Face ``datasets.Dataset``).

A sample is an image alone, an ``(image, target)`` pair (the target an ``int``, a class name, None,
or a dict of field values: a detection target), or a dict ``{"image": ..., "label": ..., "key":
..., **fields}``. The image is

* encoded bytes (``bytes``, ``bytearray``, ``memoryview``, a uint8 numpy buffer from ``np.frombuffer``
  of them is *not* bytes: an array is pixels): kept as they are, checked at packing like a file;
* a PIL image, a uint8 ``HxW``/``HxWxC`` numpy array (C = 1, 3 or 4) or a uint8 ``CxHxW`` torch
  tensor: decoded pixels. With the pass-through codec they are stored as lossless PNG (made here,
  in the writing process); with a codec that re-encodes (``raw``, ``jpeg``, ``tiled``) RGB pixels
  are spooled as an uncompressed BMP (a 54-byte header before the rows: no compression to pay for)
  and the codec makes the stored payload from them at packing, in the packing workers.

Nothing here imports torch or ``datasets``: objects are recognised by their type's module.
"""

from __future__ import annotations

import io
import json
import logging
import reprlib
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from ..fields import DTYPES, FieldSpec, check_name
from ..sources.python import SampleValueError

__all__ = ["SampleParts", "sample_parts", "image_bytes", "json_values", "MapSource", "map_source", "describe_input",
           "describe_exception", "infer_fields"]

logger = logging.getLogger("packer.build")

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = 4


@dataclass
class SampleParts:
    """One sample, taken apart: its image (bytes or pixels, not yet encoded), label, key and fields."""

    image: Any
    label: Any = None
    key: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)


def sample_parts(value: Any) -> SampleParts:
    """Take a sample apart (see the module docstring).

    Raises:
        SampleValueError: ``bad-sample``: a dict without ``"image"``, a tuple that is not a pair,
            a key that is not text.
    """
    if isinstance(value, SampleParts):
        return value
    if isinstance(value, Mapping):
        if "image" not in value:
            raise SampleValueError("bad-sample", f"a sample dict needs an 'image'; it has {sorted(map(str, value))[:8]}")
        fields = {name: item for name, item in value.items() if name not in ("image", "label", "key")}
        key = value.get("key")
        if key is not None and not isinstance(key, str):
            raise SampleValueError("bad-sample", f"a sample's key is text, got {type(key).__name__} {_repr.repr(key)}")
        return SampleParts(value["image"], value.get("label"), key, fields)
    if isinstance(value, tuple):
        if len(value) != 2:
            raise SampleValueError("bad-sample", f"a sample tuple is (image, target), got {len(value)} items")
        image, target = value
        if isinstance(target, Mapping):  # a detection target: its members are fields
            fields = dict(target)
            label = fields.pop("label", None)
            return SampleParts(image, label, None, fields)
        return SampleParts(image, target)
    return SampleParts(value)


def _is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach") and hasattr(value, "dtype")


def _to_numpy(value: Any) -> Any:
    """A torch tensor's values as numpy (on the CPU); anything else as it is."""
    if _is_torch_tensor(value):
        tensor = value.detach()
        if hasattr(tensor, "as_subclass"):  # tv_tensors (BoundingBoxes, Image): a plain tensor
            import torch

            tensor = tensor.as_subclass(torch.Tensor)
        return tensor.cpu().numpy()
    return value


def image_bytes(image: Any, *, reencoded: bool) -> bytes:
    """The bytes to spool for an image (see the module docstring).

    Args:
        reencoded: the build's codec makes the stored payload from these bytes (BMP for RGB
            pixels), rather than storing them as they are (PNG for pixels).

    Raises:
        SampleValueError: ``bad-sample``: a type that is not an image, an array of another dtype
            or shape, an empty image.
    """
    if isinstance(image, bytes):
        return image
    if isinstance(image, (bytearray, memoryview)):
        return bytes(image)
    module = type(image).__module__
    if module.startswith("PIL.") and hasattr(image, "save") and hasattr(image, "mode"):
        return _pil_bytes(image, reencoded=reencoded)
    if _is_torch_tensor(image):
        pixels = _to_numpy(image)
        if pixels.dtype != np.uint8:
            raise SampleValueError("bad-sample", f"a tensor image must be uint8 pixels (CxHxW), got {pixels.dtype} "
                                                 f"(a float tensor from ToTensor: give the PIL image, or "
                                                 f"(x * 255).round().to(torch.uint8))")
        if pixels.ndim == 3 and pixels.shape[0] in (1, 3, 4):
            pixels = np.moveaxis(pixels, 0, -1)
        return _pixel_bytes(pixels, reencoded=reencoded, what="tensor")
    if isinstance(image, np.ndarray):
        return _pixel_bytes(image, reencoded=reencoded, what="array")
    raise SampleValueError("bad-sample", f"an image is encoded bytes, a PIL image, a uint8 HxWxC numpy array or a "
                                         f"uint8 CxHxW tensor; got {type(image).__name__} {_repr.repr(image)}")


def _pixel_bytes(pixels: np.ndarray, *, reencoded: bool, what: str) -> bytes:
    if pixels.dtype != np.uint8:
        raise SampleValueError("bad-sample", f"an image {what} must hold uint8 pixels, got {pixels.dtype}")
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    if not (pixels.ndim == 2 or (pixels.ndim == 3 and pixels.shape[2] in (3, 4))) or 0 in pixels.shape:
        raise SampleValueError("bad-sample", f"an image {what} is HxW or HxWxC with C = 1, 3 or 4 and no empty side, "
                                             f"got shape {tuple(pixels.shape)}")
    if reencoded and pixels.ndim == 3 and pixels.shape[2] == 3:
        return _bmp(pixels)
    from PIL import Image

    return _png(Image.fromarray(np.ascontiguousarray(pixels)))


def _bmp(pixels: np.ndarray) -> bytes:
    """RGB pixels as an uncompressed 24-bit BMP (bottom-up BGR rows padded to 4 bytes): a 54-byte
    header before the pixels, made in a few microseconds; ``decode`` reads it back with numpy."""
    height, width = pixels.shape[:2]
    row = width * 3
    padding = -row % 4
    body = pixels[::-1, :, ::-1].reshape(height, row)
    if padding:
        body = np.concatenate([body, np.zeros((height, padding), dtype=np.uint8)], axis=1)
    data = np.ascontiguousarray(body).tobytes()
    header = struct.pack("<2sIHHIIiiHHIIiiII", b"BM", 54 + len(data), 0, 0, 54, 40, width, height, 1, 24, 0,
                         len(data), 2835, 2835, 0, 0)
    return header + data


def _pil_bytes(image: Any, *, reencoded: bool) -> bytes:
    if reencoded and image.mode == "RGB":
        return _bmp(np.asarray(image))
    if image.mode not in ("1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"):
        image = image.convert("RGBA" if "A" in image.mode else "RGB")  # CMYK, YCbCr, F, ...: what PNG holds
    return _png(image)


def _png(image: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG", compress_level=6)
    return buffer.getvalue()


def json_values(fields: Mapping[str, Any], specs: Sequence[FieldSpec]) -> tuple[bytes, dict[str, bytes]]:
    """A sample's value fields as one canonical JSON object, and its image fields' bytes.

    Raises:
        SampleValueError: ``bad-field``: a field that is not declared, an image field missing or
            not an image, a value JSON cannot hold (NaN is refused by the field checks later).
    """
    declared = {spec.name: spec for spec in specs}
    unknown = sorted(set(fields) - set(declared))
    if unknown:
        raise SampleValueError("bad-field", f"field {unknown[0]!r} is not declared (declare it: fields=[...]; "
                                            f"declared: {sorted(declared) or 'none'})")
    values: dict[str, Any] = {}
    images: dict[str, bytes] = {}
    for spec in specs:
        if spec.kind == "image":
            if fields.get(spec.name) is None:
                raise SampleValueError("bad-field", f"field {spec.name!r} (an image) is missing")
            try:
                images[spec.name] = image_bytes(fields[spec.name], reencoded=False)
            except SampleValueError as exc:
                raise SampleValueError("bad-field", f"field {spec.name!r}: {exc.message}") from None
        elif spec.name in fields:
            values[spec.name] = _json_ready(fields[spec.name])
    try:
        text = json.dumps(values, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise SampleValueError("bad-field", f"a field value is not numbers, text or lists of them: {exc}") from None
    return text.encode("utf-8", "surrogatepass"), images


def _json_ready(value: Any) -> Any:
    value = _to_numpy(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_json_ready(item) for item in value]
    return value


def infer_fields(fields: Mapping[str, Any]) -> tuple[FieldSpec, ...]:
    """Declarations for a sample's field values, from the first sample of a Dataset object (a
    detection target's ``boxes``/``labels``): arrays keep their dtype with a variable first
    dimension, scalars become ``int64``/``float64``/``bool``, text ``text``. A name or value that
    cannot be a field is left out, with a warning."""
    specs = []
    for name, value in fields.items():
        try:
            check_name(name, error=ValueError)
        except ValueError as exc:
            logger.warning("the sample's %r is not stored (%s)", name, exc)
            continue
        value = _to_numpy(value)
        if isinstance(value, str):
            specs.append(FieldSpec(name, "text"))
        elif isinstance(value, (bool, np.bool_)):
            specs.append(FieldSpec(name, "array", "bool", ()))
        elif isinstance(value, (int, np.integer)):
            specs.append(FieldSpec(name, "array", "int64", ()))
        elif isinstance(value, (float, np.floating)):
            specs.append(FieldSpec(name, "array", "float64" if isinstance(value, float) else str(value.dtype), ()))
        elif isinstance(value, np.ndarray) and value.dtype.name in DTYPES and 1 <= value.ndim <= 4:
            specs.append(FieldSpec(name, "array", value.dtype.name, (-1, *value.shape[1:])))
        else:
            logger.warning("the sample's %r is not stored (%s: declare it with fields=[...])", name,
                           type(value).__name__)
    return tuple(specs)


# --- what packer.pack maps over --------------------------------------------------------------------------

@dataclass
class MapSource:
    """What ``packer.pack`` maps: ``count`` inputs read in ranges (``read``), each turned into
    samples by ``fn`` (None: the input is the sample), with the class names and fields the object
    declares."""

    inputs: Any
    fn: Callable[[Any], Any] | None
    count: int
    kind: str = "sequence"
    declared_classes: tuple[str, ...] = ()
    fields: tuple[FieldSpec, ...] = ()
    #: per input: the value given to ``fn`` (or the sample); default ``inputs[i]``
    reader: Callable[[Any, int, int], Iterator[tuple[int, Any]]] | None = None

    def read(self, start: int, end: int) -> Iterator[tuple[int, Any]]:
        if self.reader is not None:
            return self.reader(self.inputs, start, end)
        return ((i, self.inputs[i]) for i in range(start, end))


def map_source(inputs: Any, fn: Callable[[Any], Any] | None) -> MapSource:
    """Recognise what ``inputs`` is: a Hugging Face ``datasets.Dataset`` (its rows, the image column
    kept encoded, ``ClassLabel`` names as the class list, other columns as fields), a torchvision
    ``ImageFolder``/``DatasetFolder`` (each file's bytes as they are) or ``CIFAR10``/``CIFAR100``
    (the pixels, no PIL image per sample), any object with ``__len__`` and ``__getitem__``.

    Raises:
        OptionError: ``inputs`` has no length or cannot be indexed; ``fn`` is not callable.
    """
    from ..errors import OptionError

    if fn is not None and not callable(fn):
        raise OptionError(f"fn must be a function of one input, got {type(fn).__name__}")
    if isinstance(inputs, (str, bytes)) or not hasattr(inputs, "__len__") or not hasattr(inputs, "__getitem__"):
        raise OptionError(f"inputs must be a sized sequence (a list, a range, a map-style Dataset), got "
                          f"{type(inputs).__name__}; an iterable of unknown length: list(it) first")
    count = len(inputs)
    module = type(inputs).__module__
    if module.startswith("datasets.") and hasattr(inputs, "features") and fn is None:
        return _hf_source(inputs, count)
    classes = _class_names(getattr(inputs, "classes", None))
    if module.startswith("torchvision.") and fn is None:
        folder = _torchvision_folder(inputs)
        if folder is not None:
            return MapSource(inputs, None, count, "torchvision-folder", classes, reader=folder)
        arrays = _torchvision_arrays(inputs)
        if arrays is not None:
            return MapSource(inputs, None, count, "torchvision-arrays", classes, reader=arrays)
    kind = "dataset" if hasattr(inputs, "__getitem__") and not isinstance(inputs, (list, tuple, range)) else "sequence"
    fields: tuple[FieldSpec, ...] = ()
    if fn is None and count and kind == "dataset":  # a Dataset object's fields, from its first sample
        try:
            first = sample_parts(inputs[0])
        except SampleValueError:
            first = None
        if first is not None and first.fields:
            fields = infer_fields(first.fields)
    return MapSource(inputs, fn, count, kind, classes if fn is None else (), fields)


def _class_names(value: Any) -> tuple[str, ...]:
    if isinstance(value, (list, tuple)) and value and all(isinstance(name, str) and name for name in value):
        if len(set(value)) == len(value):
            return tuple(value)
    return ()


def _torchvision_folder(dataset: Any) -> Callable[[Any, int, int], Iterator[tuple[int, Any]]] | None:
    """An untransformed ``ImageFolder``/``DatasetFolder`` with torchvision's own loader: read each
    listed file's bytes (the JPEG stays a JPEG) instead of decoding it to a PIL image."""
    samples = getattr(dataset, "samples", None)
    loader = getattr(dataset, "loader", None)
    if (not isinstance(samples, list) or getattr(dataset, "transform", None) is not None
            or getattr(dataset, "target_transform", None) is not None
            or getattr(loader, "__module__", "") != "torchvision.datasets.folder"
            or getattr(loader, "__name__", "") not in ("default_loader", "pil_loader")):
        return None

    def read(data: Any, start: int, end: int) -> Iterator[tuple[int, Any]]:
        for i in range(start, end):
            path, target = data.samples[i]
            with open(path, "rb") as handle:
                yield i, (handle.read(), target)

    return read


def _torchvision_arrays(dataset: Any) -> Callable[[Any, int, int], Iterator[tuple[int, Any]]] | None:
    """An untransformed ``CIFAR10``/``CIFAR100`` (its ``data`` a uint8 NxHxWx3 array): the pixels
    as they are, no PIL image made per sample."""
    data, targets = getattr(dataset, "data", None), getattr(dataset, "targets", None)
    if (type(dataset).__name__ not in ("CIFAR10", "CIFAR100") or not isinstance(data, np.ndarray)
            or data.dtype != np.uint8 or data.ndim != 4 or targets is None
            or getattr(dataset, "transform", None) is not None
            or getattr(dataset, "target_transform", None) is not None):
        return None
    return lambda ds, start, end: ((i, (ds.data[i], int(ds.targets[i]))) for i in range(start, end))


def _hf_source(dataset: Any, count: int) -> MapSource:
    """A ``datasets.Dataset`` in memory: the image column read as its encoded bytes (``Image(decode=False)``),
    the label column's ``ClassLabel`` names as the class list, the other columns as fields where
    their types map (the rules of the ``save_to_disk`` door, ``sources/hf_disk.py``)."""
    from ..sources.hf_disk import column_plan

    features = dataset.features.to_dict()
    plan = column_plan(features, image_column=None, label_column="label", where="the Dataset")
    if features.get(plan.image, {}).get("_type") == "Image":
        import datasets

        dataset = dataset.cast_column(plan.image, datasets.Image(decode=False))
    columns = [plan.image] + ([plan.label] if plan.label else []) + [spec.name for spec in plan.fields]
    image_names = {spec.name for spec in plan.fields if spec.kind == "image"}

    def bytes_of(value: Any) -> Any:
        if isinstance(value, Mapping):
            return value.get("bytes")
        return value

    def read(data: Any, start: int, end: int) -> Iterator[tuple[int, Any]]:
        batch = data.select_columns(columns)[start:end]
        for j in range(end - start):
            label = batch[plan.label][j] if plan.label else None
            if plan.classes and label == -1:  # a ClassLabel's -1 is "no label"
                label = None
            sample = {"image": bytes_of(batch[plan.image][j]), "label": label}
            for spec in plan.fields:
                value = batch[spec.name][j]
                sample[spec.name] = bytes_of(value) if spec.name in image_names else value
            yield start + j, sample

    return MapSource(dataset, None, count, "hf", plan.classes, plan.fields, reader=read)


# --- what a rejection says about an input ----------------------------------------------------------------

def describe_input(value: Any) -> str:
    """A bounded repr of an input (at most about 80 characters)."""
    text = _repr.repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def describe_exception(exc: BaseException) -> str:
    """``Type: message (at file:line in function)``: the exception and the last frame it passed."""
    import traceback

    message = str(exc)
    if len(message) > 300:
        message = message[:297] + "..."
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        where = f" (at {last.filename.rsplit('/', 1)[-1]}:{last.lineno} in {last.name})"
    return f"{type(exc).__name__}: {message}{where}"

