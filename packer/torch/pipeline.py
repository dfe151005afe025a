"""The per-sample pipeline: stored bytes -> pixels (decode or fused decode transform) -> tensor
in the chosen layout -> ``transform``; and the batched fast path of raw pixels.

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

Batches: with a fused transform from ``packer.transforms`` (or ``decode=True`` on a ``raw``
dataset) and no ``transform``, ``__getitems__`` writes the whole batch into one ``(N, H, W, C)``
tensor (channels-last memory, the images first and the int64 labels after them in the same
storage) and ``layout`` only chooses how it is seen: ``"CHW"`` an ``(N, C, H, W)`` view with
``torch.channels_last`` strides (what FFCV's ``ToTorchImage`` hands over, and what convolutions
run fastest on), ``"HWC"`` the tensor itself. Single samples (``ds[i]``) stay contiguous.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

import numpy as np
import torch

from .. import decode as _decode  # noqa: F401  (imported before the workers fork, so they share its pages)
from ..codecs import CodecReader, codec_for
from ..dataset import Dataset
from ..errors import OptionError
from .._internal.imageinfo import DEFAULT_MAX_PIXELS
from ..rawcrop import crop_resize_raw, read_raw_batch
from .runtime import BatchPool, DecodeFn, _empty_batch, _labels_in

LAYOUTS = ("CHW", "HWC")


def _refuse_decode_transform(transform: Any) -> None:
    """packer's crops decode the stored bytes: as ``transform=`` they would get a tensor and fail
    on every sample with an obscure error (the torchvision habit is to pass crops as transform)."""
    from ..errors import OptionError
    from ..transforms import DecodeTransform

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
        self._codec: CodecReader | None = None

    def codec(self, dataset: Dataset) -> CodecReader:
        """The dataset's codec reader (``packer.codecs.codec_for``), made once per dataset."""
        codec = self._codec
        if codec is None or codec.entry is not dataset.manifest.codec:
            codec = self._codec = codec_for(dataset)
        return codec

    def pixels(self, dataset: Dataset, i: int, data: np.ndarray, geometries: list[Any] | None = None) -> Any:
        """The sample's image before layout: HWC pixels, or the 1-D payload when not decoding.

        With ``geometries`` (a list, and a fused transform), the crop this decode used is
        appended to it (``DecodeTransform.decode_with_geometry``).
        """
        if self.decode is False:
            return data
        from ..transforms import DecodeTransform

        if self.decode is True:
            return self.codec(dataset).pixels(dataset, i, data, max_pixels=self.max_pixels)
        image_format = int(dataset.index.image_format[i])
        if isinstance(self.decode, DecodeTransform):
            stored = self.codec(dataset).stored_pixels(dataset, i, data)
            if stored is not None:  # crop and resize the stored pixels; the index keys seeded draws
                return self._fused(stored, image_format, geometries, index=i, name=dataset.key(i))
            return self._fused(data, image_format, geometries, index=i)
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
        """``(count, H, W, 3)``, the channels-last storage of a batch, when samples can be decoded
        straight into it: a decode transform with a fixed ``output_shape`` that takes ``out=``
        (``packer.transforms``) and no ``transform``; else None. Either layout: ``batch_view``
        makes the ``CHW`` batch a view of it."""
        from ..transforms import DecodeTransform

        if self.transform is not None or count < 1 or not isinstance(self.decode, DecodeTransform):
            return None
        return (count, *self.decode.output_shape)

    def batch_view(self, batch: torch.Tensor) -> torch.Tensor:
        """A batch in the chosen layout, from its channels-last ``(N, H, W, C)`` storage: itself for
        ``HWC``, an ``(N, C, H, W)`` view (strides of ``torch.channels_last``, no copy) for ``CHW``."""
        return batch.permute(0, 3, 1, 2) if self.layout == "CHW" else batch

    def storage_of(self, images: torch.Tensor) -> torch.Tensor:
        """The ``(N, H, W, C)`` storage view of a batch ``batch_view`` made (inverse permutation)."""
        return images.permute(0, 2, 3, 1) if self.layout == "CHW" else images

    def finish(self, tensor: torch.Tensor) -> Any:
        """Apply the transform (to a contiguous tensor); without one, make the tensor contiguous."""
        tensor = tensor.contiguous()
        return self.transform(tensor) if self.transform is not None else tensor

    def label(self, dataset: Dataset, i: int) -> Any:
        label = int(dataset.index.label[i])
        return self.target_transform(label) if self.target_transform is not None else label


def _raw_fast_shape(dataset: Dataset, pipeline: _Pipeline,
                    count: int) -> tuple[tuple[int, ...], bool, tuple[int, int, int]] | None:
    """``(channels-last batch shape, crop, stored sample shape)`` of a raw dataset's fast paths for
    ``count`` samples, or None when they do not apply (another codec, a ``transform``,
    ``decode=False``, a callable that is not a fused transform). The batch is stored ``(N, H, W,
    C)`` whatever the layout (``_Pipeline.batch_view``)."""
    if count < 1 or pipeline.decode is False or pipeline.transform is not None:
        return None
    crop_shape = pipeline.batch_shape(count)  # a fused transform
    if crop_shape is None and pipeline.decode is not True:
        return None
    raw_shape = pipeline.codec(dataset).sample_shape
    if raw_shape is None:
        return None
    if crop_shape is not None:
        return crop_shape, True, raw_shape
    return (count, *raw_shape), False, raw_shape


def _raw_fast_batch(dataset: Dataset, pipeline: _Pipeline, idx: np.ndarray,
                    geometries: list[Any] | None = None, *,
                    out: torch.Tensor | None = None, pool: BatchPool | None = None) -> torch.Tensor | None:
    """The batch tensor of a raw dataset's fast paths (gather, or gather + batched crop), in the
    pipeline's layout, or None when they do not apply (``_raw_fast_shape``). Shared by
    ``PackedDataset`` and ``PackedIterableDataset``.

    Raw pixels are gathered from the shard views (``rawcrop.read_raw_batch``); with a fused
    transform they are cropped, resized and flipped in one vectorised pass
    (``DecodeTransform.batch``) straight into the batch's ``(N, H, W, C)`` storage (``out``'s,
    when ``out`` is a uint8 tensor in the layout whose storage view is contiguous, else a new
    one, in shared memory inside a worker, from ``pool`` when it has one free), each sample's crop
    appended to ``geometries`` when
    it is a list. Without one the pixels are gathered straight into it. ``CHW`` is a view of
    that storage (``torch.channels_last`` strides), as FFCV's ``ToTorchImage`` hands it.
    """
    fast = _raw_fast_shape(dataset, pipeline, len(idx))
    if fast is None:
        return None
    shape, crop, raw_shape = fast
    storage = pipeline.storage_of(out) if out is not None and out.dim() == 4 else None
    if (storage is None or tuple(storage.shape) != shape or storage.dtype != torch.uint8
            or not storage.is_contiguous()):
        storage = _empty_batch(shape, pool)
    if crop and raw_shape[2] == 3:  # raw RGB: one batched crop-resize, read in place (packer.rawcrop)
        decode = pipeline.decode
        height, width = raw_shape[0], raw_shape[1]
        boxes, flips = decode.batch_boxes(width, height, idx)
        crop_resize_raw(dataset, idx, raw_shape, boxes, flips, decode.size, clip_to_box=decode.clip_to_box,
                        out=storage)
        if geometries is not None:
            geometries.extend(decode.geometries_of(boxes, flips, width, height))
    elif crop:  # DecodeTransform.batch refuses what is not RGB, with its message
        pipeline.decode.batch(read_raw_batch(dataset, idx, raw_shape), idx, out=storage)
    else:
        read_raw_batch(dataset, idx, raw_shape, out=storage.numpy())
    return pipeline.batch_view(storage)


class _Sample(tuple):
    """An ``(image, label)`` sample of a ``_BatchSamples`` (a tuple; its type routes torch's
    ``default_collate`` to ``collate.collate_batch_samples``)."""

    __slots__ = ()


class _BatchSamples(Sequence):
    """``(image, label)`` samples whose images are views of one batch tensor, ``batch``.

    Any ``collate_fn`` sees a sequence of samples; they are made when asked for, so the batched
    path creates no per-sample object. ``packer.torch.collate`` (and torch's ``default_collate``,
    through the sample type) returns ``batch`` itself and the labels as one tensor.

    Args:
        batch: the images, ``(N, ...)``.
        labels: an ``(N,)`` int64 tensor (no ``target_transform``), or a list of each sample's label.
    """

    def __init__(self, batch: torch.Tensor, labels: torch.Tensor | list[Any]) -> None:
        self.batch = batch
        self.labels = labels

    def __len__(self) -> int:
        return len(self.batch)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        count = len(self.batch)
        k = int(k)
        if not -count <= k < count:
            raise IndexError(f"sample {k} out of range for a batch of {count}")
        label = self.labels[k]
        return _Sample((self.batch[k], int(label) if isinstance(label, torch.Tensor) else label))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (list, Sequence)) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # a mutable-looking sequence, like a list

    def label_tensor(self) -> torch.Tensor | None:
        """The labels as one int64 tensor when they are one already (no ``target_transform``)."""
        return self.labels if isinstance(self.labels, torch.Tensor) else None


def _label_column(dataset: Dataset, pipeline: _Pipeline, idx: np.ndarray,
                  batch: torch.Tensor | None = None) -> torch.Tensor | list[Any]:
    """The labels of a batch: one gather from the index (no per-sample Python) without a
    ``target_transform``, written after the images in ``batch``'s storage when it has room
    (``runtime._empty_batch``), else each sample's transformed label."""
    if pipeline.target_transform is None:
        values = np.asarray(dataset.labels[idx], dtype=np.int64)
        return _labels_in(pipeline.storage_of(batch), values) if batch is not None else torch.from_numpy(values)
    return [pipeline.label(dataset, i) for i in idx.tolist()]
