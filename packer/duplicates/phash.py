"""The perceptual hash: 128 bits from the DCT of a small grey thumbnail, and hashing a dataset.

The hash (algorithm 1, ``dct-sign-128``; formats/SPEC.md §16 names it)
------------------------------------------------------------------------
1. **Grey pixels, decoded small.** A JPEG is decoded by libjpeg-turbo (simplejpeg) straight to
   grey (its luma) at the smallest DCT scale (1/8, 1/4, 1/2 or 1) that keeps both sides at least
   ``DECODE_MIN`` pixels: a 1/8-scale decode takes each 8x8 block's DC term and skips the inverse
   DCT, the chroma and the colour conversion. Every other format is decoded by ``packer.decode`` (the
   rule training uses) and turned grey with ITU-R 601 weights (the weights of JPEG's luma). Raw payloads (codec ``raw``) are reshaped with the index's height, width and
   channels.
2. **Thumbnail and DCT in one product.** The grey image ``X`` (``h x w``) is area-averaged to a
   ``THUMB x THUMB`` thumbnail and transformed by the orthonormal 2-D DCT-II; both are linear,
   so the 16x16 low-frequency block is ``(D R_h) X (D R_w)^T`` with ``R`` the area-averaging
   matrices and ``D`` the first 16 rows of the DCT matrix, cached per image size.
3. **128 signs.** The 128 lowest-frequency AC coefficients, by anti-diagonal (``u + v = 1, 2,
   ...``; on each, ``v`` ascending; ``u`` is the horizontal frequency), each give one bit: 1
   when the coefficient is positive. Bit ``k`` is bit ``k % 64`` of word ``k // 64``: word 0
   holds the 64 lowest frequencies.

Why these choices (measured on the benchmark corpus of real photographs,
benchmarks/bench_duplicates.py, and in docs/guides/duplicates.md):

- **Signs rather than a median.** Brightness changes only the DC term and contrast scales every
  AC coefficient, so signs are invariant to both, as a median threshold is; but a horizontal flip
  negates exactly the coefficients of odd ``u`` and leaves the rest, so the flipped image's hash is
  ``hash ^ FLIP_MASK``: flip-invariant search costs a second probe, not a second hash, and no
  library's median-thresholded pHash (ImageHash, imagededup) has that property.
- **128 bits rather than 64.** At equal recall, the 64-bit pHash (ImageHash's and imagededup's)
  lets through pairs of different crops of one photo that share their coarse layout (a coin
  tray, the rim of a retina); the next 64 frequencies separate them. On the benchmark corpus,
  at recall 0.977 the first 64 bits alone have precision 0.977 (4 false pairs), the 128 bits
  0.994 (1).
- **Its own DCT rather than ImageHash's pHash on the same thumbnail.** On the benchmark corpus
  ImageHash's 64-bit pHash of packer's thumbnails scores nearly the same (recall 0.971 at
  precision 0.994, against 0.977), but it takes 91 us a thumbnail against 14 us here (a 64x64
  grey image; the product above against Pillow's resize and scipy's DCT), it has no mirror
  property, and it would make scipy and PyWavelets dependencies.
- **A DCT-scaled grey decode rather than a full one**: 1.7-2x faster than libjpeg-turbo's full
  RGB decode of 500-1000 px photographs at quality 75-95 (the rest is Huffman decoding, which
  every scale pays), about 3x faster than Pillow's (benchmarks/bench_duplicates.py).

The numbers: ``numpy`` only (no scipy), float64 products; a coefficient within rounding error of
zero may flip its bit between machines, which is one bit of distance, never a different verdict
for a clear duplicate.
"""

from __future__ import annotations

import functools
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import simplejpeg
from PIL import Image

from .. import format as fmt
from ..decode import PILLOW_JPEG_COLORSPACES, decode_image
from ..errors import DecodeError, PackerError
from .._internal.imageinfo import DEFAULT_MAX_PIXELS, byte_view, detect_format

__all__ = ["ALGORITHM", "ALGORITHM_NAME", "HASH_BITS", "HASH_WORDS", "THUMB", "FLIP_MASK", "COEFFICIENTS",
           "HASHED", "FLAT", "UNREADABLE", "STATUS_NAMES", "HashTable", "grey_pixels", "grey_from_pixels", "hash_pixels",
           "perceptual_hash", "hash_payload", "hash_dataset", "hamming"]

#: The stored algorithm number (SPEC §16): a hashes file of another algorithm is recomputed.
ALGORITHM = 1
ALGORITHM_NAME = "dct-sign-128"
HASH_BITS = 128
HASH_WORDS = HASH_BITS // 64
#: Side of the grey thumbnail the DCT is taken of (ImageHash's and imagededup's pHash use 32 too).
THUMB = 32
#: A JPEG is decoded at the smallest DCT scale that keeps both sides at least this long: 1/8 for
#: photographs of 512 px and more. 64 rather than THUMB: from a decode of 35-60 px (a 1/4-scale
#: decode of a 150-240 px image) the area average to 32 px aliases, and on the benchmark corpus
#: recall at the default threshold rose from 0.966 to 0.977 at the same precision.
DECODE_MIN = 64
#: Side of the low-frequency block that holds the 128 coefficients (anti-diagonals up to 15).
_BLOCK = 16
#: An image whose low frequencies vary by less than this (RMS grey levels over the thumbnail) is
#: flat: blank, or one colour. Flat images have no perceptual hash worth comparing (every blank
#: image would match every other); their exact copies are still found by their bytes.
FLAT_RMS = 1.0

#: Per-sample status values (the hashes file's status column).
HASHED, FLAT, UNREADABLE = 0, 1, 2
STATUS_NAMES = {HASHED: "hashed", FLAT: "flat", UNREADABLE: "unreadable"}


def _coefficients() -> tuple[tuple[int, int], ...]:
    """The 128 (v, u) positions, in bit order: anti-diagonals u + v = 1, 2, ..., v ascending."""
    order = [(v, s - v) for s in range(1, 2 * _BLOCK) for v in range(s + 1) if v < _BLOCK and s - v < _BLOCK]
    return tuple(order[:HASH_BITS])


#: (v, u) of the coefficient behind each bit: v the vertical frequency, u the horizontal one.
COEFFICIENTS = _coefficients()
_ROWS = np.array([v for v, _ in COEFFICIENTS], dtype=np.intp)
_COLS = np.array([u for _, u in COEFFICIENTS], dtype=np.intp)
_WEIGHTS = np.uint64(1) << np.arange(64, dtype=np.uint64)


def _pack(bits: np.ndarray) -> np.ndarray:
    """``(..., 128)`` booleans -> ``(..., 2)`` uint64 words, bit k at bit k % 64 of word k // 64."""
    bits = bits.reshape(bits.shape[:-1] + (HASH_WORDS, 64)).astype(np.uint64)
    return (bits * _WEIGHTS).sum(axis=-1, dtype=np.uint64)


#: XOR with this to get the hash of the horizontally mirrored image: the bits of odd ``u``.
FLIP_MASK = _pack(_COLS % 2 == 1)


@functools.lru_cache(maxsize=1)
def _dct_rows() -> np.ndarray:
    """The first ``_BLOCK`` rows of the orthonormal ``THUMB``-point DCT-II matrix."""
    k = np.arange(_BLOCK, dtype=np.float64)[:, None]
    n = np.arange(THUMB, dtype=np.float64)[None, :]
    matrix = np.cos(np.pi * (2 * n + 1) * k / (2 * THUMB)) * math.sqrt(2.0 / THUMB)
    matrix[0] /= math.sqrt(2.0)
    return matrix


@functools.lru_cache(maxsize=512)
def _projection(length: int) -> np.ndarray:
    """``D @ R`` for one side of ``length`` pixels: ``R`` (THUMB x length) averages the pixels
    under each thumbnail pixel, weighted by overlap (a box filter; it also enlarges a side
    shorter than THUMB)."""
    edges = np.arange(THUMB + 1, dtype=np.float64) * (length / THUMB)
    starts, ends = edges[:-1, None], edges[1:, None]
    pixel = np.arange(length, dtype=np.float64)[None, :]
    overlap = np.clip(np.minimum(ends, pixel + 1) - np.maximum(starts, pixel), 0.0, None)
    area = overlap / overlap.sum(axis=1, keepdims=True)
    projection = _dct_rows() @ area
    projection.setflags(write=False)
    return projection


def hash_pixels(grey: np.ndarray) -> tuple[np.ndarray, int]:
    """The hash of a 2-D grey image (any size, any real dtype).

    Returns:
        ``(words, status)``: two uint64 words and ``HASHED``, or zeros and ``FLAT``.
    """
    height, width = grey.shape
    block = _projection(height) @ np.asarray(grey, dtype=np.float64) @ _projection(width).T
    values = block[_ROWS, _COLS]
    if math.sqrt(float(np.dot(values, values)) / (THUMB * THUMB)) < FLAT_RMS:
        return np.zeros(HASH_WORDS, dtype=np.uint64), FLAT
    return _pack(values > 0), HASHED


def grey_pixels(data: Any, image_format: int | None = None, *, name: str = "",
                max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Grey pixels of one encoded image, decoded as small as the hash allows (step 1 above).

    Args:
        data: the payload bytes (any buffer).
        image_format: its ``ImageFormat`` (None: detected from the bytes).
        name: the sample's key, for error messages.
        max_pixels: refuse an image whose header declares more pixels (the decoders' guard).

    Returns:
        A 2-D uint8 array: grey, a JPEG's at a reduced DCT scale.

    Raises:
        DecodeError: the bytes do not decode (damaged, or a format this packer cannot decode).
    """
    view = byte_view(data)
    if image_format is None or image_format == fmt.ImageFormat.UNKNOWN:
        image_format = detect_format(view) if len(view) else fmt.ImageFormat.UNKNOWN
    if image_format == fmt.ImageFormat.JPEG:
        grey = _jpeg_grey(view, name, max_pixels)
        if grey is not None:
            return grey
    # the area-averaging projection takes any size; no reduce first (its edge handling would make
    # the hash of a mirrored image differ from the mirrored hash)
    return grey_from_pixels(decode_image(view, image_format, name=name, max_pixels=max_pixels))


def grey_from_pixels(pixels: np.ndarray) -> np.ndarray:
    """Grey of stored pixels (``(H, W)`` or ``(H, W, C)`` uint8, C of 1, 3 or 4: alpha dropped)."""
    if pixels.ndim == 2 or pixels.shape[2] == 1:
        return pixels.reshape(pixels.shape[:2])
    return _luma(pixels[:, :, :3])


def _luma(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601 luma (JPEG's Y; Pillow's ``convert("L")``) of an RGB array, as uint8."""
    return np.asarray(Image.fromarray(np.ascontiguousarray(rgb), "RGB").convert("L"))


def _jpeg_grey(view: Any, name: str, max_pixels: int) -> np.ndarray | None:
    """libjpeg-turbo's grey decode at the smallest DCT scale keeping THUMB pixels a side, or None
    for what only Pillow decodes (CMYK, a header simplejpeg refuses)."""
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(view)
    except Exception:  # noqa: BLE001 - exotic or damaged: decode_image has a go and names the problem
        return None
    if colorspace in PILLOW_JPEG_COLORSPACES or width < 1 or height < 1:
        return None
    if width * height > max_pixels:
        raise DecodeError(f"the header declares {height}x{width} (HxW) = {width * height} pixels, over the limit "
                          f"of {max_pixels} (a decompression bomb, or raise max_pixels)", path=name or None)
    try:
        grey = simplejpeg.decode_jpeg(view, colorspace="GRAY", min_width=min(width, DECODE_MIN),
                                      min_height=min(height, DECODE_MIN))
    except Exception:  # noqa: BLE001 - strict mode refuses some files Pillow still decodes
        return None
    return grey[:, :, 0]


def perceptual_hash(data: Any, image_format: int | None = None, *, name: str = "",
                    max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[int, int] | None:
    """The 128-bit perceptual hash of one encoded image as two ints (word 0, word 1), or None for
    a flat image.

    Raises:
        DecodeError: the bytes do not decode.
    """
    words, status = hash_pixels(grey_pixels(data, image_format, name=name, max_pixels=max_pixels))
    return None if status == FLAT else (int(words[0]), int(words[1]))


def hash_payload(data: Any, image_format: int, *, height: int, width: int, channels: int, name: str = "",
                 max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[np.ndarray, int]:
    """The hash of one stored payload as a build writes it (``packer build --hash perceptual``):
    the same pixels ``hash_dataset`` reads back, so a stored hash and a recomputed one agree.

    Args:
        data: the payload bytes.
        image_format: its ``ImageFormat``; a pixel format (``format.PIXEL_FORMATS``: the raw
            codec) is ``height x width x channels`` stored pixels, anything else an encoded image.

    Returns:
        ``(words, status)``: ``HASHED``, ``FLAT``, or zeros and ``UNREADABLE`` when the payload
        does not decode (a build that validated headers only can hold such a file).
    """
    unreadable = np.zeros(HASH_WORDS, dtype=np.uint64), UNREADABLE
    if image_format in fmt.ImageFormat.PIXEL_FORMATS:
        pixels = np.frombuffer(byte_view(data), dtype=np.uint8)
        if pixels.size != height * width * channels:  # (a codec's bug: the reader refuses it the same way)
            return unreadable
        return hash_pixels(grey_from_pixels(pixels.reshape(height, width, channels)))
    try:
        grey = grey_pixels(data, image_format, name=name, max_pixels=max_pixels)
    except PackerError:
        return unreadable
    return hash_pixels(grey)


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bits that differ between hashes ``a`` and ``b`` (``(..., 2)`` uint64 arrays, broadcast)."""
    return np.bitwise_count(np.asarray(a) ^ np.asarray(b)).sum(axis=-1, dtype=np.int64)


@dataclass(frozen=True)
class HashTable:
    """Every sample's hash and status.

    Attributes:
        hashes: ``(N, 2)`` uint64; zeros where ``status`` is not ``HASHED``.
        status: ``(N,)`` uint8: ``HASHED``, ``FLAT`` or ``UNREADABLE`` (the bytes failed their
            checksum or did not decode).
    """

    hashes: np.ndarray
    status: np.ndarray

    def __len__(self) -> int:
        return len(self.status)

    def counts(self) -> dict[str, int]:
        """Samples per status name."""
        found = np.bincount(self.status, minlength=len(STATUS_NAMES))
        return {STATUS_NAMES[code]: int(found[code]) for code in sorted(STATUS_NAMES)}


#: Samples read per batch when hashing (one coalesced read each; a URL dataset fetches the
#: batch's extents in parallel).
_BATCH = 256


def hash_dataset(dataset: Any, *, workers: int = 1, progress: bool = False) -> HashTable:
    """Hash every sample of an open ``Dataset`` through its read API (local or URL alike).

    Bytes are read in batches (``Dataset.read_batch``) and checked against the index's xxh3 before
    they are hashed: a damaged sample is ``UNREADABLE``, never a hash of garbage.

    Args:
        dataset: a ``packer.dataset.Dataset``.
        workers: threads decoding at once (libjpeg-turbo releases the GIL while it decodes).
        progress: show a bar on stderr.
    """
    from ..codecs import codec_for, dataset_max_pixels
    from .._internal.progress import BuildProgress

    count = len(dataset)
    hashes = np.zeros((count, HASH_WORDS), dtype=np.uint64)
    status = np.full(count, UNREADABLE, dtype=np.uint8)
    limit = dataset_max_pixels(dataset.manifest)
    codec = codec_for(dataset)
    index = dataset.index
    lock = threading.Lock()
    try:
        codec.check_decodable()
    except DecodeError:  # a codec this packer cannot decode (SPEC §6): nothing is hashed
        return HashTable(hashes=hashes, status=status)

    def one(first: int) -> int:
        numbers = np.arange(first, min(first + _BATCH, count), dtype=np.int64)
        batch = dataset.read_batch(numbers)
        formats = index.image_format[numbers].tolist()
        for j, i in enumerate(numbers.tolist()):
            data = batch[j]
            if fmt.checksum(data) != int(index.checksum[i]):
                continue
            try:
                # raw payloads are pixels already (the codec says so); the rest decode small
                stored = codec.stored_pixels(dataset, i, np.frombuffer(data, dtype=np.uint8))
                grey = (grey_from_pixels(stored) if stored is not None
                        else grey_pixels(data, formats[j], name=dataset.key(i), max_pixels=limit))
            except PackerError:
                continue
            hashes[i], status[i] = hash_pixels(grey)
        return int(batch.sizes.sum())

    with BuildProgress(count, int(index.size.sum()) if count else 0, enabled=progress, desc="hashing") as bar:
        starts = range(0, count, _BATCH)
        if workers <= 1:
            for first in starts:
                done = one(first)
                bar.update(min(_BATCH, count - first), done)
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="packer-hash") as pool:
                for first, done in zip(starts, pool.map(one, starts)):
                    with lock:
                        bar.update(min(_BATCH, count - first), done)
    return HashTable(hashes=hashes, status=status)
