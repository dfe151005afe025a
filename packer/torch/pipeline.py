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
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch

from .. import format as fmt
from ..dataset import Dataset
from ..decode import decode_image  # imported before the workers fork, so they share its pages
from ..errors import DecodeError, OptionError
from ..imageinfo import DEFAULT_MAX_PIXELS
from ..rawcrop import raw_shape_of, read_raw_batch
from .runtime import DecodeFn, _empty

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

    def pixels(self, dataset: Dataset, i: int, data: np.ndarray, geometries: list[Any] | None = None) -> Any:
        """The sample's image before layout: HWC pixels, or the 1-D payload when not decoding.

        With ``geometries`` (a list, and a fused transform), the crop this decode used is
        appended to it (``DecodeTransform.decode_with_geometry``).
        """
        if self.decode is False:
            return data
        from ..transforms import DecodeTransform

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
        from ..transforms import DecodeTransform

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
