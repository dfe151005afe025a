"""Crop geometry: the crop boxes torchvision's rules draw, and how boxes, keypoints and second
images follow a crop (``CropGeometry``).

Geometry: boxes, keypoints and masks follow the crop. ``transform.geometry(width, height, index)``
is the crop and flip a sample gets (a ``CropGeometry``: the source box its output pixels are
resampled from, with half-pixel centres as in every resize here), ``decode_with_geometry`` and
``batch_with_geometry`` return the pixels together with the geometry of that very decode (a JPEG
decoded at a reduced DCT scale is resampled from its box rounded to whole decoded pixels, and
the geometry says so). ``CropGeometry.map_boxes`` / ``map_points`` / ``resample_nearest`` move
``xyxy`` boxes (clipped; dropped when nothing of them, or less than ``min_box_visibility`` of
their area, is left, or when they are smaller than ``SanitizeBoundingBoxes``' ``min_size`` /
``min_area``), keypoints (visibility 0 outside the output) and second images (nearest
neighbour: a label map keeps its labels, a 16-bit depth map its depths) exactly as the pixels
moved. ``packer.torch.PackedDataset(geometry=...)`` applies them per sample.

Conventions, and how they compare with ``torchvision.transforms.v2`` (docs/guides/geometry.md):

* The crop box is always inside the image (a JPEG decoded at a reduced DCT scale drops a last,
  partly outside decoded pixel rather than report a box past the edge).
* Masks are resized with ``mask_interpolation="nearest"`` (torchvision's ``NEAREST``, what
  ``v2.RandomResizedCrop`` and ``v2.Resize`` use for ``tv_tensors.Mask``: source index
  ``floor(i * in / out)``) by default, or ``"nearest-exact"`` (``NEAREST_EXACT``:
  ``floor((i + 0.5) * in / out)``, pixel centres). Whole-pixel boxes match torch's kernels bit
  for bit (float32 arithmetic included).
* Boxes smaller than ``min_size`` on a side or ``min_area`` in area (output pixels) are dropped,
  with ``SanitizeBoundingBoxes``' defaults (1 and 1), after packer's own visibility rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence, Union

import numpy as np

from ..errors import OptionError

#: An output size: one int for a square, or ``(height, width)``.
Size = Union[int, Sequence[int]]


# (top, left, height, width) in original pixel coordinates.
Box = tuple[int, int, int, int]


def _output_size(size: Size) -> tuple[int, int]:
    if isinstance(size, (int, np.integer)):
        height = width = int(size)
    else:
        dims = tuple(int(s) for s in size)
        if len(dims) != 2:
            raise OptionError(f"size must be an int or (height, width), got {size!r}")
        height, width = dims
    if height < 1 or width < 1:
        raise OptionError(f"size must be positive, got {size!r}")
    return height, width


def random_resized_crop_params(width: int, height: int, rng: np.random.Generator, *,
                               scale: tuple[float, float] = (0.08, 1.0),
                               ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> Box:
    """Pick a random crop box the way torchvision's ``RandomResizedCrop.get_params`` does.

    Up to ten tries draw an area fraction uniformly from ``scale`` and an aspect ratio
    log-uniformly from ``ratio``; the first box that fits is placed uniformly at random. If none
    fits, the whole image is cropped centrally to the nearest allowed aspect ratio.

    Args:
        width: image width in pixels.
        height: image height in pixels.
        rng: the random generator (the only source of randomness).
        scale: range of the crop's area as a fraction of the image's.
        ratio: range of the crop's width / height.

    Returns:
        ``(top, left, crop_height, crop_width)`` in pixels.
    """
    area = width * height
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_low, log_high))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def center_crop_box(width: int, height: int, size: tuple[int, int],
                    resize: int) -> tuple[float, float, float, float]:
    """The box that ``Resize(resize)`` then ``CenterCrop(size)`` keep, in original coordinates.

    Follows torchvision: the shorter side becomes ``resize`` and the longer one
    ``int(resize * long / short)``; the crop starts at ``int(round((resized - crop) / 2))``.

    Args:
        width: image width in pixels.
        height: image height in pixels.
        size: the crop's ``(height, width)`` in resized pixels.
        resize: the shorter side after resizing.

    Returns:
        ``(left, top, right, bottom)`` as floats, in original pixels.
    """
    if width <= height:
        new_width, new_height = resize, int(resize * height / width)
    else:
        new_width, new_height = int(resize * width / height), resize
    crop_height, crop_width = size
    top = int(round((new_height - crop_height) / 2.0))
    left = int(round((new_width - crop_width) / 2.0))
    scale_x, scale_y = width / new_width, height / new_height
    return (left * scale_x, top * scale_y, (left + crop_width) * scale_x,
            (top + crop_height) * scale_y)


#: ``CropGeometry.map_boxes``' default: a box is kept when any of its area is left in the output.
DEFAULT_MIN_VISIBILITY = 0.0
#: ``SanitizeBoundingBoxes``' defaults (torchvision): boxes narrower or lower than ``min_size`` output
#: pixels, or smaller than ``min_area`` square pixels, are dropped.
DEFAULT_MIN_BOX_SIZE = 1.0
DEFAULT_MIN_BOX_AREA = 1.0
#: How ``CropGeometry.resample_nearest`` picks a second image's pixels, named after torchvision's
#: ``InterpolationMode.NEAREST`` and ``InterpolationMode.NEAREST_EXACT`` (the ``value`` of each).
MASK_INTERPOLATIONS = ("nearest", "nearest-exact")
#: torchvision's choice for masks (``tv_tensors.Mask`` is resized with ``NEAREST``).
DEFAULT_MASK_INTERPOLATION = "nearest"


def check_mask_interpolation(mode: Any) -> str:
    """``"nearest"`` or ``"nearest-exact"``, from that string or torchvision's ``InterpolationMode``.

    Raises:
        OptionError: any other mode (bilinear would invent labels between two classes).
    """
    value = getattr(mode, "value", mode)  # torchvision's InterpolationMode.NEAREST has value "nearest"
    if value not in MASK_INTERPOLATIONS:
        raise OptionError(f"mask_interpolation must be one of {list(MASK_INTERPOLATIONS)} (torchvision's "
                          f"InterpolationMode.NEAREST / NEAREST_EXACT), got {mode!r}")
    return str(value)


def check_box_minimum(name: str, value: Any) -> float:
    """A non-negative ``min_size`` / ``min_area``.

    Raises:
        OptionError: negative, NaN or not a number.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not value >= 0:
        raise OptionError(f"{name} must be a non-negative number of output pixels, got {value!r}")
    return float(value)


def _integral(value: float) -> bool:
    return abs(value - round(value)) < 1e-6


def _nearest_indices(origin: float, extent: float, out: int, count: int, mode: str) -> np.ndarray:
    """Source indices of ``out`` output pixels resampled from ``[origin, origin + extent)`` of an
    axis of ``count`` pixels, the way torch's ``interpolate`` picks them (``mode``).

    Whole-pixel crops are torchvision's crop-then-resize (``RandomResizedCrop``); a box whose origin
    and full extent are whole pixels of a resized grid is its resize-then-crop (``Resize`` +
    ``CenterCrop``). Both are computed in float32 as torch's kernels do, so the indices are
    torch's exactly; any other box (a half-resolution mask, a DCT-rounded box) in float64.
    """
    steps = np.arange(out, dtype=np.float32)
    offset = 0.5 if mode == "nearest-exact" else 0.0
    if _integral(origin) and _integral(extent) and round(extent) >= 1:  # crop, then resize
        first, size = int(round(origin)), int(round(extent))
        scale = np.float32(size) / np.float32(out)
        picked = _floor32(steps, offset, scale)
        return np.clip(first + np.minimum(picked, size - 1), 0, count - 1)
    per_output = extent / out
    position = origin / per_output  # the crop's origin in the resized grid
    resized = count / per_output
    if _integral(position) and _integral(resized) and round(resized) >= 1:  # resize, then crop
        scale = np.float32(count) / np.float32(round(resized))
        picked = _floor32(steps + np.float32(round(position)), offset, scale)
        return np.minimum(picked, count - 1)
    exact = origin + (np.arange(out, dtype=np.float64) + offset) * per_output
    last = min(count, math.ceil(origin + extent - 1e-9)) - 1
    return np.clip(np.floor(exact).astype(np.int64), 0, max(last, 0))


def _floor32(steps: np.ndarray, offset: float, scale: np.float32) -> np.ndarray:
    """``floor(i * scale)`` (nearest) or ``floor((i + 0.5) * scale)`` (nearest-exact), rounded to
    float32 before the floor as in torch's ``nearest_neighbor[_exact]_compute_source_index``."""
    if offset:
        product = ((steps.astype(np.float64) + offset) * np.float64(scale)).astype(np.float32)
    else:
        product = steps * scale  # float32 x float32
    return np.floor(product).astype(np.int64)


@dataclass(frozen=True)
class CropGeometry:
    """Where one output of a fused transform comes from: the source box resampled to the output, and the flip.

    Coordinates are continuous pixel coordinates with half-pixel centres, the convention of every
    resize in this module (torch's ``align_corners=False``, Pillow's ``box=``, ``packer.rawcrop``):
    pixel ``(x, y)`` covers ``[x, x + 1) x [y, y + 1)`` and its centre is ``(x + 0.5, y + 0.5)``.
    A source point ``(x, y)`` lands at output point
    ``u = (x - left) * out_width / (right - left)``, ``v = (y - top) * out_height / (bottom - top)``,
    then ``u -> out_width - u`` when flipped; output pixel ``(c, r)``'s centre is the image of
    source point ``(left + (c + 0.5) * (right - left) / out_width, ...)`` (``c`` counted before the
    flip). Box corners, keypoints and mask pixels all go through this one mapping, so they land
    where the image's pixels land.

    Attributes:
        box: ``(left, top, right, bottom)`` in source pixels: the region the output's pixels
            were resampled from (fractional for ``CenterCrop``, and for a JPEG decoded at a
            reduced DCT scale).
        flip: whether the output was mirrored horizontally.
        size: the output's ``(height, width)``.
        source_size: the source image's ``(width, height)``: the main image that ``box`` is in.
    """

    box: tuple[float, float, float, float]
    flip: bool
    size: tuple[int, int]
    source_size: tuple[int, int]

    @property
    def scale(self) -> tuple[float, float]:
        """Output pixels per source pixel, ``(x, y)``."""
        left, top, right, bottom = self.box
        return self.size[1] / (right - left), self.size[0] / (bottom - top)

    def map_xy(self, x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
        """Source coordinates to output coordinates (arrays of any shape; float64)."""
        scale_x, scale_y = self.scale
        u = (np.asarray(x, dtype=np.float64) - self.box[0]) * scale_x
        v = (np.asarray(y, dtype=np.float64) - self.box[1]) * scale_y
        if self.flip:
            u = self.size[1] - u
        return u, v

    def map_boxes(self, boxes: Any, min_visibility: float = DEFAULT_MIN_VISIBILITY, *,
                  min_size: float = DEFAULT_MIN_BOX_SIZE,
                  min_area: float = DEFAULT_MIN_BOX_AREA) -> tuple[np.ndarray, np.ndarray]:
        """``xyxy`` boxes in source pixels to output pixels, clipped, with the rule for dropping them.

        Each box's corners are mapped (``map_xy``; a flip swaps ``x1`` and ``x2`` so that
        ``x1 <= x2`` still holds), then clipped to ``[0, out_width] x [0, out_height]``. A box is
        **kept** when its clipped width and height are both positive, its clipped area is at
        least ``min_visibility`` times its mapped (unclipped) area, and (torchvision's
        ``SanitizeBoundingBoxes``, on the clipped box) its width and height are at least
        ``min_size`` and its area at least ``min_area``. So with ``min_visibility=0`` and
        ``min_size=min_area=0`` a box is dropped exactly when nothing of it is left in the output;
        a box with no area to start with (``x2 <= x1`` or ``y2 <= y1``) or a NaN coordinate is
        always dropped.

        Args:
            boxes: ``(N, 4)`` ``(x1, y1, x2, y2)`` in source pixels (any numeric dtype).
            min_visibility: the fraction of a box's area that must stay in the output, 0..1.
            min_size: the smallest width and height kept, in output pixels (default 1, as
                ``SanitizeBoundingBoxes``).
            min_area: the smallest area kept, in square output pixels (default 1, as
                ``SanitizeBoundingBoxes``).

        Returns:
            ``(mapped, keep)``: all ``N`` mapped, clipped boxes (float64 on float64 input, else
            float32) and the ``(N,)`` bool mask of those kept.
        """
        array = np.asarray(boxes)
        values = array.astype(np.float64).reshape(-1, 4)
        u1, v1 = self.map_xy(values[:, 0], values[:, 1])
        u2, v2 = self.map_xy(values[:, 2], values[:, 3])
        if self.flip:
            u1, u2 = u2, u1
        height, width = self.size
        area = (u2 - u1) * (v2 - v1)
        x1, x2 = np.clip(u1, 0, width), np.clip(u2, 0, width)
        y1, y2 = np.clip(v1, 0, height), np.clip(v2, 0, height)
        with np.errstate(invalid="ignore"):  # NaN coordinates compare false: dropped
            widths, heights = x2 - x1, y2 - y1
            keep = (widths > 0) & (heights > 0) & (widths * heights >= min_visibility * area)
            keep &= (widths >= min_size) & (heights >= min_size) & (widths * heights >= min_area)
        mapped = np.stack([x1, y1, x2, y2], axis=1).astype(_coordinate_dtype(array.dtype))
        return mapped, keep

    def map_points(self, points: Any) -> np.ndarray:
        """Keypoints ``(..., 2)`` ``(x, y)`` or ``(..., 3)`` ``(x, y, visibility)`` to output pixels.

        Points that land outside ``[0, out_width) x [0, out_height)`` get visibility 0 (a
        visibility already 0 stays 0); their coordinates are mapped all the same. Without a
        visibility column nothing marks them: their coordinates are outside that range. A flip
        mirrors the coordinates; it does not swap left/right keypoint identities (a left eye
        becomes a point on the right of the image, still called the left eye).

        Returns:
            The mapped points, same shape (float64 on float64 input, else float32).
        """
        array = np.asarray(points)
        if array.ndim < 1 or array.shape[-1] not in (2, 3):
            raise OptionError(f"points must have 2 or 3 values in their last axis, got shape {array.shape}")
        values = array.astype(np.float64)
        u, v = self.map_xy(values[..., 0], values[..., 1])
        values[..., 0], values[..., 1] = u, v
        if array.shape[-1] == 3:
            height, width = self.size
            outside = ~((u >= 0) & (u < width) & (v >= 0) & (v < height))
            values[..., 2] = np.where(outside, 0, values[..., 2])
        return values.astype(_coordinate_dtype(array.dtype))

    def resample_nearest(self, image: np.ndarray, mode: str = DEFAULT_MASK_INTERPOLATION) -> np.ndarray:
        """A second image of the same scene (a mask, a depth map) cropped, resized and flipped like the main one.

        Nearest neighbour, so no new value appears (a label map keeps its label set, a 16-bit
        depth map its depths: no averaged "flying" depths across an object's edge), whatever the
        dtype. ``mode`` picks which source pixel an output pixel takes, as torchvision's modes do:
        ``"nearest"`` (``InterpolationMode.NEAREST``, torchvision's choice for masks: source index
        ``floor(i * in / out)``) or ``"nearest-exact"`` (``NEAREST_EXACT``: the pixel under the
        output pixel's centre, ``floor((i + 0.5) * in / out)``). For a whole-pixel crop
        (``RandomResizedCrop``) and for ``CenterCrop``'s resize-then-crop the indices are torch's
        exactly. An image whose size is not the main image's is taken to cover the same scene:
        the box is scaled by the ratio of the sizes (a half-resolution mask works).

        Args:
            image: ``(h, w)`` or ``(h, w, c)`` array of any dtype.
            mode: ``"nearest"`` (default) or ``"nearest-exact"`` (or torchvision's
                ``InterpolationMode`` of either name).

        Returns:
            ``(out_height, out_width[, c])``, C-contiguous, same dtype.
        """
        mode = check_mask_interpolation(mode)
        rows, columns = image.shape[0], image.shape[1]
        left, top, right, bottom = self.box
        source_width, source_height = self.source_size
        fx, fy = columns / source_width, rows / source_height
        out_height, out_width = self.size
        column_index = _nearest_indices(left * fx, (right - left) * fx, out_width, columns, mode)
        row_index = _nearest_indices(top * fy, (bottom - top) * fy, out_height, rows, mode)
        if self.flip:
            column_index = column_index[::-1]
        return np.ascontiguousarray(image.take(row_index, axis=0).take(column_index, axis=1))


def _coordinate_dtype(dtype: np.dtype) -> np.dtype:
    """Mapped coordinates are fractional: float64 stays float64, everything else becomes float32."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)
