"""Batched crop-resize of raw pixels: seeded per-sample draws, box rules and one vectorised resample.

The batched half of ``packer.transforms`` for ``--codec raw`` datasets (decoded ``uint8`` HWC
pixels at one fixed size). Three pure functions, no state:

1. ``sample_uniforms(seed, epoch, indices, count)``: ``count`` uniform floats in ``[0, 1)`` per
   sample, a counter-based hash of ``(seed, epoch, index, j)`` (splitmix64's finaliser over a
   key made of the seed and the epoch, then of the sample index, then of the draw number ``j``).
   Computed for a whole batch with numpy's uint64 arithmetic: no generator object per sample,
   and a sample's draws do not depend on which batch, worker, thread or rank it lands in, or on
   a resume. The draw rule is part of the contract: it changes only with a version note.
2. ``random_resized_crop_boxes(uniforms, width, height, ...)``: torchvision's
   ``RandomResizedCrop.get_params`` rule (ten tries of area fraction and log-uniform aspect
   ratio, then a central fallback) for every sample at once, from the draws of step 1 (the
   flip is draw ``RRC_DRAWS - 1``). ``packer.transforms.random_resized_crop_params`` is the same
   rule for one sample and one ``numpy.random.Generator``.
3. ``crop_resize_batch(images, boxes, size, ...)``: resample each sample's box to ``size`` with
   the antialiased bilinear (triangle) filter of Pillow and torch's ``antialias=True``: per
   sample and axis, the taps and weights of every output pixel are computed with numpy (a few
   KB), then the batch is filtered in float32 torch ops, rows then columns, rounded and written
   into ``out``: up to ``DENSE_MAX_SIDE`` pixels as two batched matrix products with the
   ``(out, side)`` weight matrices, above it as ``K`` gathers and multiply-adds per axis (``K`` =
   taps per output pixel, 3 for an upscale or mild downscale). Works on CPU and CUDA tensors
   alike (the inputs may be zero-copy, strided views of a shard). A horizontal flip reverses the
   output columns' taps, so it costs nothing. On the CPU, when packer's compiled extension
   ``packer._rawresample`` is installed (built at install with a C compiler), the same float32
   arithmetic runs as one pass per sample without the GIL (about 5x faster at 32x32, where the
   torch ops' whole-batch temporaries cost more than the multiply-adds); torch's ops are the
   fallback and the GPU path.

Agreement with the per-sample path (``RandomResizedCrop``/``CenterCrop`` called on one sample's
pixels, which uses torch's uint8 kernel or Pillow): the same boxes, and pixels that differ only by
rounding. torch's and Pillow's uint8 kernels round the intermediate row pass to integers and use
fixed-point weights; this kernel keeps the intermediate in float32. Tested bound
(``tests/readers/test_rawcrop.py``): every pixel within ``AGREEMENT_MAX_ABS`` grey levels, mean
absolute difference under ``AGREEMENT_MEAN_ABS``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .codecs import codec_for, raw_batch_view, raw_runs, raw_sample_stride, raw_samples_view
from .dataset import as_sample_indices
from .errors import OptionError

if TYPE_CHECKING:  # torch is imported lazily by crop_resize_batch
    import torch

__all__ = ["raw_shape_of", "read_raw_batch", "crop_resize_raw", "RRC_DRAWS", "AGREEMENT_MAX_ABS", "AGREEMENT_MEAN_ABS", "DENSE_MAX_SIDE", "KERNELS", "sample_uniforms",
           "random_resized_crop_boxes", "resample_taps", "compiled_kernel_available", "crop_resize_batch"]

#: Draws per sample for ``random_resized_crop_boxes``: 10 tries x (area, ratio), top, left, flip.
RRC_DRAWS = 23
#: Largest per-pixel difference from the per-sample (torch/Pillow uint8) resize, in grey levels.
AGREEMENT_MAX_ABS = 2
#: Largest mean absolute difference from the per-sample resize over a batch, in grey levels.
AGREEMENT_MEAN_ABS = 0.25

_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_INDEX_MULT = np.uint64(0xD1B54A32D192ED03)
_GOLDEN_INT, _MIX1_INT, _MIX2_INT, _INDEX_MULT_INT = (int(v) for v in (_GOLDEN, _MIX1, _MIX2, _INDEX_MULT))
#: Images up to this side are filtered with two dense batched matrix products; larger ones with
#: ``K`` gathers per axis (whose cost does not grow with the image's side).
DENSE_MAX_SIDE = 128
#: ``crop_resize_batch``'s kernels: see its docstring.
KERNELS = ("auto", "c", "torch")
# From this many bytes per sample (e.g. 224x224x3), raw batches are gathered one memcpy per sample
# into the output: a whole-batch temporary would cost more in page faults than the loop does.
_LARGE_SAMPLE = 64 << 10
# Keep each chunk's float32 intermediate near this size (bounded memory at 224 px and up).
_CHUNK_BYTES = 32 << 20


def raw_shape_of(dataset: Any) -> tuple[int, int, int] | None:
    """``(H, W, C)`` of every sample when ``dataset`` (a ``packer.dataset.Dataset``) is a ``raw``
    codec dataset, else None: ``codec_for(dataset).sample_shape``.

    Raises:
        ManifestError: the manifest says ``raw`` but its shape fields are unusable.
    """
    return codec_for(dataset).sample_shape


def read_raw_batch(dataset: Any, indices: Any, shape: tuple[int, int, int], *,
                   out: np.ndarray | None = None) -> np.ndarray:
    """The pixels of raw samples ``indices`` as one ``(N, H, W, C)`` uint8 array (one gather).

    With the mmap backend (and no checksum checks) the batch is copied straight from the shard
    mappings into ``out`` (or a new array): with packer's compiled extension one ``memcpy`` per
    sample without the GIL (``_rawresample.gather``: no temporary and no per-sample Python, so
    threads gather in parallel); without it, one fancy-indexing gather per shard from the
    zero-copy strided view of the mapping (``codecs.raw_batch_view``), then a copy into ``out``.
    Otherwise the batch is read with ``dataset.read_batch`` (coalesced runs) and gathered.

    Args:
        dataset: an open ``packer.dataset.Dataset`` of the ``raw`` codec.
        indices: sample indices (non-negative, in range).
        shape: ``raw_shape_of(dataset)``.
        out: optional ``(N, H, W, C)`` uint8 array to fill.

    Returns:
        ``out``, or a new array.

    Raises:
        IndexMismatchError: an index row disagrees with the raw layout (size or offset).
    """
    idx = as_sample_indices(indices).reshape(-1)
    sample = shape[0] * shape[1] * shape[2]
    if out is None:
        out = np.empty((len(idx), *shape), dtype=np.uint8)
    if len(idx) == 0:
        return out
    runs = raw_runs(dataset, idx, shape)  # the layout every raw shard has, checked before a byte is read
    if dataset.backend_name != "mmap" or dataset.verify_checksums:
        batch = dataset.read_batch(idx)
        out[...] = raw_samples_view(batch.data, batch.starts, shape)
        return out
    gather = _compiled_gather() if out.flags.c_contiguous and out.dtype == np.uint8 else None
    for shard, rows, offsets, local in runs:
        if gather is not None:  # one memcpy per sample into out, without the GIL (packer/_rawresample.c)
            gather(dataset.shard(shard).array, out, offsets, rows, sample)
            continue
        first, end, base = dataset.stored_layout(shard)
        stride = raw_sample_stride(shape, dataset.shard_alignment(shard))  # a mixture's streams may differ
        view = raw_batch_view(dataset.shard(shard).array[base:], end - first, stride, shape)
        # Fancy indexing gathers from the strided view directly; numpy.take would first copy the
        # whole (non-contiguous) shard view to a contiguous array: 60 ms per batch at 50 k samples.
        if sample >= _LARGE_SAMPLE:  # one memcpy per sample straight into out: no temporary
            for row, position in zip((range(len(idx)) if rows is None else rows.tolist()), local.tolist()):
                out[row] = view[position]
        elif rows is None:
            out[...] = view[local]
        else:
            out[rows] = view[local]
    return out


def crop_resize_raw(dataset: Any, indices: Any, shape: tuple[int, int, int], boxes: np.ndarray,
                    flips: np.ndarray | None, size: tuple[int, int], *, clip_to_box: bool = True,
                    out: "torch.Tensor | None" = None) -> "torch.Tensor":
    """``crop_resize_batch(read_raw_batch(dataset, indices, shape), boxes, size, ...)``, without the gather.

    With the mmap backend (no checksum checks), packer's compiled kernel and a CPU ``out`` whose
    memory is contiguous, each sample is resampled where it lies in the shard mapping (one call
    per shard, without the GIL): no gathered copy of the batch (1.5 MB per 512 32x32 samples,
    written and read back), no temporary to fault in. Otherwise it is exactly the gather then
    ``crop_resize_batch``. The index rows are checked as ``read_raw_batch`` checks them.

    Args:
        dataset: an open ``packer.dataset.Dataset`` of the ``raw`` codec.
        indices: sample indices (non-negative, in range).
        shape: ``raw_shape_of(dataset)``.
        boxes, flips, size, clip_to_box, out: as for ``crop_resize_batch``.

    Returns:
        ``out``, or a new ``(N, out_h, out_w, C)`` uint8 tensor.

    Raises:
        IndexMismatchError: an index row disagrees with the raw layout (size or offset).
        ValueError: boxes or ``out`` that do not fit.
    """
    import torch

    idx = as_sample_indices(indices).reshape(-1)
    count = len(idx)
    out_h, out_w = int(size[0]), int(size[1])
    target = out if out is not None else torch.empty((count, out_h, out_w, shape[2]), dtype=torch.uint8)
    kernel = _compiled_kernel()
    if (kernel is None or count == 0 or dataset.backend_name != "mmap" or dataset.verify_checksums
            or target.device.type != "cpu" or not target.is_contiguous()
            or tuple(target.shape) != (count, out_h, out_w, shape[2]) or target.dtype != torch.uint8):
        return crop_resize_batch(read_raw_batch(dataset, idx, shape), boxes, size, flips=flips,
                                 clip_to_box=clip_to_box, out=target)
    boxes = np.ascontiguousarray(np.asarray(boxes, dtype=np.float64).reshape(-1, 4))
    height, width, channels = shape
    if len(boxes) != count:
        raise OptionError(f"need one box per image: {count} images, got {len(boxes)} boxes")
    flags = (np.zeros(count, dtype=np.uint8) if flips is None
             else np.ascontiguousarray(np.asarray(flips, dtype=bool).reshape(-1), dtype=np.uint8))
    result = target.numpy()
    for shard, rows, offsets, _ in raw_runs(dataset, idx, shape):
        every = rows is None
        try:
            kernel.crop_resize(dataset.shard(shard).array, result, boxes if every else boxes[rows],
                               flags if every else flags[rows], bool(clip_to_box), len(offsets), height, width,
                               channels, out_h, out_w, offsets, None if every else rows)
        except ValueError as exc:  # a box outside the image: crop_resize_batch's message
            raise OptionError(f"every box must be a non-empty part of the {width}x{height} image ({exc})") from None
    return target


def _compiled_kernel() -> Any:
    """``packer._rawresample`` when it is built, else None."""
    try:
        from . import _rawresample
    except ImportError:
        return None
    return _rawresample


def _compiled_gather() -> Any:
    """The compiled kernel's ``gather`` (``packer._rawresample``), or None when it is not built."""
    try:
        from ._rawresample import gather
    except ImportError:
        return None
    return gather


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic, no overflow warnings)."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _mix64_int(z: int) -> int:
    """``_mix64`` of one value, in Python ints (the same wrapping arithmetic, masked to 64 bits)."""
    z = ((z ^ (z >> 30)) * _MIX1_INT) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2_INT) & _MASK64
    return z ^ (z >> 31)


def _uniforms_one(seed: int, epoch: int, index: int, count: int) -> list[float]:
    """``sample_uniforms`` of one index, in Python ints: the same 64-bit integers, then the same
    exact conversion (53 bits times a power of two), so the same floats."""
    key = _mix64_int(((seed & _MASK64) + _GOLDEN_INT) & _MASK64)
    key = _mix64_int(key ^ (((epoch & _MASK64) * _GOLDEN_INT) & _MASK64))
    per_sample = _mix64_int(key ^ ((index * _INDEX_MULT_INT) & _MASK64))
    scale = 1.0 / (1 << 53)
    return [(_mix64_int((per_sample + j * _GOLDEN_INT) & _MASK64) >> 11) * scale for j in range(1, count + 1)]


def sample_uniforms(seed: int, epoch: int, indices: Any, count: int) -> np.ndarray:
    """``count`` uniform draws in ``[0, 1)`` per sample, a pure function of (seed, epoch, index, j).

    Args:
        seed: the run's seed (a non-negative int; taken modulo 2**64).
        epoch: the epoch (a non-negative int).
        indices: sample indices, any int sequence or array (negative values are not allowed).
        count: draws per sample.

    Returns:
        A ``(len(indices), count)`` float64 array; row ``k`` depends only on ``indices[k]``.

    Raises:
        ValueError: a negative seed, epoch, index or count.
    """
    idx = as_sample_indices(indices).reshape(-1)
    if seed < 0 or epoch < 0 or count < 0 or (idx.size and idx.min() < 0):
        raise OptionError(f"seed, epoch, count and indices must be non-negative, got seed={seed}, "
                          f"epoch={epoch}, count={count}, min index={idx.min() if idx.size else None}")
    if idx.size == 1:  # one sample (the per-sample path): the same integers in Python, no array calls
        return np.array([_uniforms_one(int(seed), int(epoch), int(idx[0]), count)], dtype=np.float64).reshape(1, count)
    key = _mix64(np.array([int(seed) & _MASK64], dtype=np.uint64) + _GOLDEN)
    key = _mix64(key ^ (np.array([int(epoch) & _MASK64], dtype=np.uint64) * _GOLDEN))
    per_sample = _mix64(key ^ (idx.astype(np.uint64) * _INDEX_MULT))
    draw = (np.arange(1, count + 1, dtype=np.uint64) * _GOLDEN)[None, :]
    bits = _mix64(per_sample[:, None] + draw)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def random_resized_crop_boxes(uniforms: np.ndarray, width: Any, height: Any, *,
                              scale: tuple[float, float] = (0.08, 1.0),
                              ratio: tuple[float, float] = (3 / 4, 4 / 3),
                              flip: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """torchvision's ``RandomResizedCrop`` box rule for a batch of images.

    Args:
        uniforms: ``(N, RRC_DRAWS)`` draws in ``[0, 1)`` (``sample_uniforms``, or
            ``rng.random((N, RRC_DRAWS))``).
        width, height: every image's size in pixels (ints), or each image's (``(N,)`` int
            arrays: a batch of images of different sizes, e.g. JPEGs, drawn in one call; row
            ``k`` is exactly what the ints ``width[k]``, ``height[k]`` give).
        scale: range of the crop's area as a fraction of the image's.
        ratio: range of the crop's width / height.
        flip: draw a horizontal flip (probability 0.5) from the last draw.

    Returns:
        ``(boxes, flips)``: ``boxes`` an ``(N, 4)`` float64 array of whole-pixel
        ``(left, top, right, bottom)``, ``flips`` an ``(N,)`` bool array.

    Raises:
        ValueError: ``uniforms`` has fewer than ``RRC_DRAWS`` columns.
    """
    u = np.asarray(uniforms, dtype=np.float64)
    if u.ndim != 2 or u.shape[1] < RRC_DRAWS:
        raise OptionError(f"need an (N, {RRC_DRAWS}) array of draws, got shape {u.shape}")
    count = len(u)
    per_image = np.ndim(width) > 0 or np.ndim(height) > 0
    if count == 1 and not per_image:
        box, flipped = _one_box(u, int(width), int(height), scale, ratio, flip)
        return np.array([box], dtype=np.float64), np.array([flipped], dtype=bool)
    if per_image:
        widths = np.broadcast_to(np.asarray(width, dtype=np.int64), (count,))
        heights = np.broadcast_to(np.asarray(height, dtype=np.int64), (count,))
        # the same float64 values, element by element, as the scalar formulas below
        area: Any = (widths * heights).astype(np.float64)[:, None]
        width_col, height_col = widths[:, None], heights[:, None]
        width_row, height_row = widths, heights
    else:
        area = float(width * height)
        width_col = width_row = width
        height_col = height_row = height
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    # The ten tries of every sample at once, as (N, 10) arrays (each element is the per-try
    # formula's, in the same order); a sample takes its first try that fits.
    target_area = area * (scale[0] + (scale[1] - scale[0]) * u[:, 0:20:2])
    aspect = np.exp(log_low + (log_high - log_low) * u[:, 1:20:2])
    w = np.round(np.sqrt(target_area * aspect))  # half to even, like Python's round()
    h = np.round(np.sqrt(target_area / aspect))
    fits = (w > 0) & (w <= width_col) & (h > 0) & (h <= height_col)
    first = np.argmax(fits, axis=1)
    found = fits[np.arange(count), first]
    crop_w = np.where(found, w[np.arange(count), first], 0.0)
    crop_h = np.where(found, h[np.arange(count), first], 0.0)
    top = np.floor(u[:, 20] * (height_row - crop_h + 1))
    left = np.floor(u[:, 21] * (width_row - crop_w + 1))
    if not found.all():  # torchvision's fallback: the whole image at the nearest allowed ratio
        for k in np.flatnonzero(~found).tolist():
            full_w = int(widths[k]) if per_image else width
            full_h = int(heights[k]) if per_image else height
            fw, fh = _fallback_crop(full_w, full_h, ratio)
            crop_w[k], crop_h[k] = fw, fh
            top[k], left[k] = (full_h - fh) // 2, (full_w - fw) // 2
    boxes = np.stack([left, top, left + crop_w, top + crop_h], axis=1)
    flips = (u[:, RRC_DRAWS - 1] < 0.5) if flip else np.zeros(count, dtype=bool)
    return boxes, flips


def _one_box(u: np.ndarray, width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float],
             flip: bool) -> tuple[tuple[float, float, float, float], bool]:
    """``random_resized_crop_boxes`` of one ``(1, RRC_DRAWS)`` row, in Python floats: the same IEEE
    operations in the same order (``sqrt`` is exact in both; ``round`` halves to even in both; the
    aspect ratios come from the same ``numpy.exp`` call on the same view), so the same box, at a
    fifth of the cost of the whole-array version's twenty numpy calls (the per-sample path draws
    one box per image; ``tests/readers/test_rawcrop.py`` compares the two on many draws)."""
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    aspects = np.exp(log_low + (log_high - log_low) * u[:, 1:20:2])[0].tolist()
    draws = u[0].tolist()
    area = float(width * height)
    span = scale[1] - scale[0]
    crop_w = crop_h = 0.0
    found = False
    for t in range(10):
        target_area = area * (scale[0] + span * draws[2 * t])
        w = float(round(math.sqrt(target_area * aspects[t])))
        h = float(round(math.sqrt(target_area / aspects[t])))
        if 0 < w <= width and 0 < h <= height:
            crop_w, crop_h, found = w, h, True
            break
    if found:
        top = float(math.floor(draws[20] * (height - crop_h + 1)))
        left = float(math.floor(draws[21] * (width - crop_w + 1)))
    else:
        fw, fh = _fallback_crop(width, height, ratio)
        crop_w, crop_h = float(fw), float(fh)
        top, left = float((height - fh) // 2), float((width - fw) // 2)
    return (left, top, left + crop_w, top + crop_h), bool(flip and draws[RRC_DRAWS - 1] < 0.5)


def _seeded_box(seed: int, epoch: int, index: int, width: int, height: int, scale: tuple[float, float],
                ratio: tuple[float, float], flip: bool) -> tuple[tuple[float, float, float, float], bool]:
    """``random_resized_crop_boxes(sample_uniforms(seed, epoch, [index], RRC_DRAWS), width, height)``
    of one sample, as Python values ``((left, top, right, bottom), flip)``: the same box without
    the arrays and their checks (the per-sample path draws one box per image; the caller passes
    a non-negative seed, epoch and index)."""
    row = np.array([_uniforms_one(seed, epoch, index, RRC_DRAWS)], dtype=np.float64)
    return _one_box(row, width, height, scale, ratio, flip)


def _fallback_crop(width: int, height: int, ratio: tuple[float, float]) -> tuple[int, int]:
    """torchvision's crop when no try fits: the whole image at the nearest allowed ratio."""
    in_ratio = width / height
    if in_ratio < min(ratio):
        return width, int(round(width / min(ratio)))
    if in_ratio > max(ratio):
        return int(round(height * max(ratio))), height
    return width, height


def resample_taps(start: np.ndarray, end: np.ndarray, low: np.ndarray, high: np.ndarray,
                  out_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Taps and weights of antialiased bilinear resampling ``[start, end)`` to ``out_len`` pixels.

    Pillow's rule (``ImagingResample``'s triangle filter, support widened by the downscale
    factor), with the taps limited to source pixels ``[low, high)``: the crop itself for a crop
    that is cut out first (torch's path), the whole image for a resize-then-crop.

    Args:
        start, end: ``(N,)`` box edges in source pixels (may be fractional).
        low, high: ``(N,)`` ints, the source pixels the filter may read.
        out_len: output pixels along this axis.

    Returns:
        ``(taps, weights)``: ``(N, out_len, K)`` int64 source positions (clamped into range) and
        float32 weights summing to 1 over the last axis (0 for unused taps).
    """
    start = np.asarray(start, dtype=np.float64)[:, None]
    end = np.asarray(end, dtype=np.float64)[:, None]
    low = np.asarray(low, dtype=np.int64)[:, None]
    high = np.asarray(high, dtype=np.int64)[:, None]
    factor = (end - start) / out_len
    support = np.maximum(factor, 1.0)
    center = start + (np.arange(out_len)[None, :] + 0.5) * factor
    first = np.clip(np.floor(center - support + 0.5).astype(np.int64), low, high)
    last = np.clip(np.floor(center + support + 0.5).astype(np.int64), low, high)
    width = int((last - first).max()) if first.size else 1
    taps = first[..., None] + np.arange(max(width, 1))[None, None, :]
    distance = (taps + 0.5 - center[..., None]) / support[..., None]
    weights = np.maximum(0.0, 1.0 - np.abs(distance)) * (taps < last[..., None])
    total = weights.sum(axis=2, keepdims=True)
    weights = weights / np.where(total > 0, total, 1.0)
    taps = np.minimum(taps, high[..., None] - 1)
    return taps, weights.astype(np.float32)


def compiled_kernel_available() -> bool:
    """Whether the compiled CPU kernel (``packer._rawresample``, built at install) is present."""
    try:
        from . import _rawresample  # noqa: F401
    except ImportError:
        return False
    return True


def crop_resize_batch(images: "torch.Tensor | np.ndarray", boxes: np.ndarray, size: tuple[int, int], *,
                      flips: np.ndarray | None = None, clip_to_box: bool = True,
                      out: "torch.Tensor | None" = None, kernel: str = "auto") -> "torch.Tensor":
    """Resample every sample's box to ``size`` (antialiased bilinear) and flip, in one batched pass.

    Args:
        images: ``(N, H, W, C)`` uint8 pixels, a torch tensor on any device or a numpy array
            (strided views are fine: nothing is copied before filtering).
        boxes: ``(N, 4)`` ``(left, top, right, bottom)`` in source pixels.
        size: output ``(height, width)``.
        flips: ``(N,)`` bools: mirror those outputs horizontally.
        clip_to_box: the filter reads only pixels inside each box (a crop cut out then resized,
            torch's per-sample path for ``RandomResizedCrop``); False lets it read the whole
            image (a resize then a crop, ``CenterCrop``'s rule).
        out: ``(N, out_h, out_w, C)`` uint8 tensor on the same device to write into (a view is
            fine, e.g. a channels-last NCHW batch permuted to NHWC); default a new tensor.
        kernel: ``"auto"`` (the compiled CPU kernel for CPU data when it is installed, else
            torch's ops), ``"c"`` (require the compiled kernel) or ``"torch"``.

    Returns:
        ``out`` (or the new tensor).

    Raises:
        ValueError: shapes that do not fit, a box outside the image, or an unknown kernel.
        MissingDependencyError: ``kernel="c"`` without the compiled kernel, or on a GPU tensor.
    """
    import torch

    if isinstance(images, np.ndarray):
        # torch cannot wrap a read-only array (a view of a mapped shard) without copying it.
        source = torch.from_numpy(images if images.flags.writeable else images.copy())
    else:
        source = images
    if source.dim() != 4 or source.dtype != torch.uint8:
        raise OptionError(f"images must be an (N, H, W, C) uint8 batch, got {tuple(source.shape)} "
                          f"{source.dtype}")
    count, height, width, channels = source.shape
    out_h, out_w = int(size[0]), int(size[1])
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if len(boxes) != count:
        raise OptionError(f"need one box per image: {count} images, got {len(boxes)} boxes")
    if count and (boxes[:, 0].min() < 0 or boxes[:, 1].min() < 0 or boxes[:, 2].max() > width
                  or boxes[:, 3].max() > height or np.any(boxes[:, 2] <= boxes[:, 0])
                  or np.any(boxes[:, 3] <= boxes[:, 1])):
        raise OptionError(f"every box must be a non-empty part of the {width}x{height} image")
    if out is None:
        out = torch.empty((count, out_h, out_w, channels), dtype=torch.uint8, device=source.device)
    elif tuple(out.shape) != (count, out_h, out_w, channels) or out.dtype != torch.uint8:
        raise OptionError(f"out must be a ({count}, {out_h}, {out_w}, {channels}) uint8 tensor, got "
                          f"{tuple(out.shape)} {out.dtype}")
    if count == 0:
        return out
    if kernel not in KERNELS:
        raise OptionError(f"kernel must be one of {list(KERNELS)}, got {kernel!r}")
    use_c = kernel == "c" or (kernel == "auto" and source.device.type == "cpu" and compiled_kernel_available())
    if use_c:
        if source.device.type != "cpu" or out.device.type != "cpu" or not compiled_kernel_available():
            from .errors import MissingDependencyError
            raise MissingDependencyError("kernel='c' needs CPU tensors and packer's compiled extension "
                                         "packer._rawresample (reinstall packer with a C compiler)")
        _resample_compiled(source, out, boxes, flips, clip_to_box)
        return out
    if clip_to_box:
        x_low, x_high = np.floor(boxes[:, 0]), np.ceil(boxes[:, 2])
        y_low, y_high = np.floor(boxes[:, 1]), np.ceil(boxes[:, 3])
    else:
        x_low, x_high = np.zeros(count), np.full(count, width)
        y_low, y_high = np.zeros(count), np.full(count, height)
    y_taps, y_weights = resample_taps(boxes[:, 1], boxes[:, 3], y_low, y_high, out_h)
    x_taps, x_weights = resample_taps(boxes[:, 0], boxes[:, 2], x_low, x_high, out_w)
    if flips is not None and np.any(flips):
        flip = np.asarray(flips, dtype=bool)
        x_taps[flip] = x_taps[flip, ::-1]
        x_weights[flip] = x_weights[flip, ::-1]
    device = source.device
    dense = max(height, width) <= DENSE_MAX_SIDE
    # float32 intermediate per sample: the row pass's (out_h, W, C), plus the image itself when dense.
    per_sample = out_h * width * channels * 4 + (height * width * channels * 4 if dense else 0)
    chunk = max(1, _CHUNK_BYTES // per_sample)
    for first in range(0, count, chunk):
        part = slice(first, min(count, first + chunk))
        taps = [torch.from_numpy(a[part]).to(device) for a in (y_taps, y_weights, x_taps, x_weights)]
        if dense:
            _resample_dense(source[part], out[part], *taps)
        else:
            _resample_gather(source[part], out[part], *taps)
    return out


def _resample_compiled(source: "torch.Tensor", out: "torch.Tensor", boxes: np.ndarray,
                       flips: np.ndarray | None, clip_to_box: bool) -> None:
    """The compiled kernel: taps and one pass per sample, without the GIL (``packer/_rawresample.c``)."""
    from . import _rawresample

    count, height, width, channels = source.shape
    out_h, out_w = out.shape[1], out.shape[2]
    pixels = np.ascontiguousarray(source.numpy())
    target = out if out.is_contiguous() else None
    result = (target if target is not None else out.new_empty(out.shape)).numpy()
    flags = (np.zeros(count, dtype=np.uint8) if flips is None
             else np.ascontiguousarray(np.asarray(flips, dtype=bool).reshape(-1), dtype=np.uint8))
    _rawresample.crop_resize(pixels, result, np.ascontiguousarray(boxes, dtype=np.float64), flags,
                             bool(clip_to_box), count, height, width, channels, out_h, out_w)
    if target is None:
        import torch
        out.copy_(torch.from_numpy(result))


def _dense_weights(taps: "torch.Tensor", weights: "torch.Tensor", length: int) -> "torch.Tensor":
    """``(N, out, length)`` resampling matrices from taps and weights (unused taps add 0)."""
    import torch

    matrix = torch.zeros((*taps.shape[:2], length), dtype=torch.float32, device=taps.device)
    return matrix.scatter_add_(2, taps, weights)


def _resample_dense(source: "torch.Tensor", out: "torch.Tensor", y_taps: "torch.Tensor",
                    y_weights: "torch.Tensor", x_taps: "torch.Tensor", x_weights: "torch.Tensor") -> None:
    """Small images: two batched matrix products (rows, then columns), float32, rounded into ``out``.

    For a 32x32 image the matrices are 32x32: one ``bmm`` per axis beats ``K`` gathers.
    """
    count, height, width, channels = source.shape
    out_h, out_w = out.shape[1], out.shape[2]
    rows_matrix = _dense_weights(y_taps, y_weights, height)
    cols_matrix = _dense_weights(x_taps, x_weights, width)
    pixels = source.reshape(count, height, width * channels).float()
    rows = rows_matrix.bmm(pixels).view(count, out_h, width, channels)
    columns_first = rows.transpose(1, 2).reshape(count, width, out_h * channels)
    result = cols_matrix.bmm(columns_first).view(count, out_w, out_h, channels).transpose(1, 2)
    out.copy_(result.round_().clamp_(0, 255))


def _resample_gather(source: "torch.Tensor", out: "torch.Tensor", y_taps: "torch.Tensor",
                     y_weights: "torch.Tensor", x_taps: "torch.Tensor", x_weights: "torch.Tensor") -> None:
    """Large images: ``K`` gathers and multiply-adds per axis (rows, then columns), float32."""
    import torch

    count, _, width, channels = source.shape
    out_h, out_w = out.shape[1], out.shape[2]
    rows = torch.zeros((count, out_h, width, channels), dtype=torch.float32, device=source.device)
    for k in range(y_taps.shape[2]):
        index = y_taps[:, :, k].view(count, out_h, 1, 1).expand(count, out_h, width, channels)
        rows.addcmul_(torch.gather(source, 1, index).float(), y_weights[:, :, k].view(count, out_h, 1, 1))
    result = torch.zeros((count, out_h, out_w, channels), dtype=torch.float32, device=source.device)
    for k in range(x_taps.shape[2]):
        index = x_taps[:, :, k].view(count, 1, out_w, 1).expand(count, out_h, out_w, channels)
        result.addcmul_(torch.gather(rows, 2, index), x_weights[:, :, k].view(count, 1, out_w, 1))
    out.copy_(result.round_().clamp_(0, 255))
