"""The fused decode transforms: ``RandomResizedCrop`` and ``CenterCrop`` turn stored bytes into a
cropped, resized uint8 HWC array in one step (the package docstring says how)."""

from __future__ import annotations

import math
import mmap
import os
import sys
from typing import Any, Tuple, Union

import numpy as np
import simplejpeg
from PIL import Image

from ..codecs.tiles import cut_window, window_margin
from ..decode import PILLOW_JPEG_COLORSPACES, decode_image
from ..errors import DecodeError, OptionError
from ..format import ImageFormat
from .._internal.imageinfo import byte_view, detect_format
from ..rawcrop import RRC_DRAWS, crop_resize_batch, random_resized_crop_boxes, sample_uniforms, _seeded_box
from .geometry import (
    DEFAULT_MASK_INTERPOLATION,
    DEFAULT_MIN_BOX_AREA,
    DEFAULT_MIN_BOX_SIZE,
    DEFAULT_MIN_VISIBILITY,
    Box,
    CropGeometry,
    Size,
    _output_size,
    center_crop_box,
    check_box_minimum,
    check_mask_interpolation,
    random_resized_crop_params,
)

#: Anything with the buffer protocol: bytes, bytearray, memoryview, a 1-D numpy uint8 array.
ImageBytes = Union[bytes, bytearray, memoryview, np.ndarray]
#: A sample's seeded draw made with its batch: ``(width, height, box, flip)``, the size it was drawn for.
Drawn = Tuple[int, int, Tuple[float, float, float, float], bool]
#: DCT-domain scales (numerators over 8) that decode faster than a full decode: libjpeg-turbo
#: has SIMD inverse DCTs for 8x8, 4x4, 2x2 and 1x1 only, so 3/8 and 5/8..7/8 cost more.
FAST_SCALES = (1, 2, 4, 8)
#: How the crop is resized. ``pil``: ``Image.resize(BILINEAR, box=...)``, antialiased (what
#: torchvision does to PIL images). ``torch``: ``torch.nn.functional.interpolate(bilinear,
#: antialias=True)`` on the uint8 HWC array viewed as channels-last NCHW, torch's AVX2 uint8
#: kernel (what torchvision v2 does to tensors): about 4x faster than Pillow's, and within a
#: fraction of a grey level of it on average. ``auto``: torch when the process has already
#: imported it (every DataLoader worker has), else Pillow; torch is never imported just for this.
RESIZE_BACKENDS = ("auto", "pil", "torch")
_BILINEAR = Image.Resampling.BILINEAR
_FLIP = Image.Transpose.FLIP_LEFT_RIGHT


# For the Pillow path, where the whole stored image is resized: reduce by an integer factor with
# a box filter first while the remaining factor stays >= 3 (the value Pillow's documentation
# calls indistinguishable from a fair resize; large images resize ~2x faster). Deliberately not
# codecs.resize.REDUCING_GAP (2.0): that one bounds a DCT-domain pre-reduction before a Lanczos
# resize at build time, where the speed/quality trade-off was measured separately.
_BOX_REDUCING_GAP = 3.0


def _dct_scale(box_width: float, box_height: float, out_size: tuple[int, int]) -> int:
    """Smallest M in FAST_SCALES such that the box, decoded at M/8, covers the output size."""
    out_height, out_width = out_size
    for m in FAST_SCALES:
        if m * box_width >= 8 * out_width and m * box_height >= 8 * out_height:
            return m
    return 8


def _resize_antialiased(torch: Any, functional: Any, batch: Any, size: tuple[int, int]) -> Any:
    """``functional.interpolate(batch, size=size, mode="bilinear", antialias=True, align_corners=False)``.

    That call ends in ``torch._C._nn._upsample_bilinear2d_aa(batch, size, False, None)`` after
    argument checks in Python (4-15 µs a call here, about 1 % of an image's decode and resize);
    they hold by construction on this path (a 4-D uint8 tensor, an explicit size), so the op is
    called directly when this torch has it (``tests/transforms/test_fused.py`` compares the
    two), else ``interpolate``.
    """
    op = getattr(torch._C._nn, "_upsample_bilinear2d_aa", None)
    if op is None:  # pragma: no cover - every torch 2.x has it
        return functional.interpolate(batch, size=size, mode="bilinear", antialias=True, align_corners=False)
    return op(batch, size, False, None)


class DecodeTransform:
    """Shared machinery: decode (scaled for JPEG), resize a box to the output size, flip."""

    # CenterCrop resizes the whole image then crops (exact for a fractional box); a random crop
    # crops whole pixels first (cheaper: only the crop is resized).
    _resize_then_crop = False

    def __init__(self, size: Size, *, fast_dct: bool, fast_upsample: bool,
                 resize_backend: str, seed: int | None = None,
                 min_box_visibility: float = DEFAULT_MIN_VISIBILITY,
                 min_box_size: float = DEFAULT_MIN_BOX_SIZE, min_box_area: float = DEFAULT_MIN_BOX_AREA,
                 mask_interpolation: Any = DEFAULT_MASK_INTERPOLATION) -> None:
        self.out_height, self.out_width = _output_size(size)
        if isinstance(min_box_visibility, bool) or not isinstance(min_box_visibility, (int, float)) \
                or not 0 <= min_box_visibility <= 1:
            raise OptionError(f"min_box_visibility must be a fraction in 0..1, got {min_box_visibility!r}")
        #: Boxes moved by this crop (``PackedDataset(geometry=...)``) keep at least this fraction
        #: of their area, or are dropped (``CropGeometry.map_boxes``).
        self.min_box_visibility = float(min_box_visibility)
        #: ... and at least this width and height, and this area, in output pixels
        #: (``SanitizeBoundingBoxes``' ``min_size`` and ``min_area``; its defaults, 1 and 1).
        self.min_box_size = check_box_minimum("min_box_size", min_box_size)
        self.min_box_area = check_box_minimum("min_box_area", min_box_area)
        #: How image fields (masks, depth maps) are resampled: ``"nearest"`` (torchvision's ``NEAREST``,
        #: what it uses for masks) or ``"nearest-exact"`` (``CropGeometry.resample_nearest``).
        self.mask_interpolation = check_mask_interpolation(mask_interpolation)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))
                                 or seed < 0):
            raise OptionError(f"seed must be None or a non-negative integer, got {seed!r}")
        self.seed = None if seed is None else int(seed)
        # The epoch of the seeded draws: a one-element array, or a shared-memory torch tensor once
        # this transform is pickled with torch loaded (DataLoader workers, persistent ones too,
        # then see set_epoch from the main process).
        # An anonymous MAP_SHARED page is shared with forked children from the start.
        self._epoch_cell: Any = np.frombuffer(mmap.mmap(-1, 8), dtype=np.int64)
        self.fast_dct = bool(fast_dct)
        self.fast_upsample = bool(fast_upsample)
        if resize_backend not in RESIZE_BACKENDS:
            raise OptionError(f"resize_backend must be one of {list(RESIZE_BACKENDS)}, "
                              f"got {resize_backend!r}")
        self.resize_backend = resize_backend
        self._rng: np.random.Generator | None = None
        self._rng_pid = -1

    def _process_rng(self) -> np.random.Generator:
        """The generator used when the caller passes none: one per process, made on first use.

        Seeded from ``torch.initial_seed()`` when torch is loaded (in a DataLoader worker that is
        the worker's own seed, so ``torch.manual_seed`` makes augmentation reproducible, as with
        torchvision's transforms), else from OS entropy. Re-made after a fork, so workers never
        share a stream.
        """
        pid = os.getpid()
        if self._rng is None or self._rng_pid != pid:
            torch = sys.modules.get("torch")
            seed = int(torch.initial_seed()) if torch is not None else None
            self._rng = np.random.default_rng(seed)
            self._rng_pid = pid
        return self._rng

    def __getstate__(self) -> dict[str, Any]:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(self._epoch_cell, np.ndarray):
            # A spawned worker unpickles the state: a torch shared-memory tensor stays shared.
            self._epoch_cell = torch.from_numpy(self._epoch_cell.copy()).share_memory_()
        state = self.__dict__.copy()
        if isinstance(self._epoch_cell, np.ndarray):
            state["_epoch_cell"] = self._epoch_cell.copy()  # an mmap does not pickle: the value
        state["_rng"], state["_rng_pid"] = None, -1  # each process makes its own stream
        return state

    @property
    def epoch(self) -> int:
        """The epoch of the seeded draws (``set_epoch``)."""
        return int(self._epoch_cell[0])

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the seeded draws (with ``seed=``).

        Reaches DataLoader workers, persistent ones included (the value lives in shared memory
        once the transform has been sent to a worker). packer's readers call it themselves:
        ``set_epoch`` of a ``PackedSampler``/``PackedBatchSampler`` over the dataset, of a
        ``PackedIterableDataset``, ``PackedDataLoader``, ``ThreadedLoader`` or ``GpuRawBatches``.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise OptionError(f"epoch must be a non-negative integer, got {epoch!r}")
        self._epoch_cell[0] = int(epoch)

    @property
    def size(self) -> tuple[int, int]:
        """The output's ``(height, width)``."""
        return self.out_height, self.out_width

    @property
    def output_shape(self) -> tuple[int, int, int]:
        """Shape of every result: ``(height, width, 3)``."""
        return self.out_height, self.out_width, 3

    # Subclasses choose the box (left, top, right, bottom, in original pixels) and the flip.
    def _box(self, width: int, height: int,
             rng: np.random.Generator) -> tuple[tuple[float, float, float, float], bool]:
        raise NotImplementedError

    def _batch_boxes(self, width: int, height: int, indices: np.ndarray,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``(N, 4)`` boxes and ``(N,)`` flips for a batch of same-size images."""
        raise NotImplementedError

    def _draw(self, width: int, height: int, rng: np.random.Generator, index: int | None,
              drawn: "Drawn | None" = None) -> tuple[tuple[float, float, float, float], bool]:
        """The box and flip of one sample: seeded draws of ``(seed, epoch, index)`` when both
        are known (the same as the batched path's), else the generator's. ``drawn``: this
        sample's seeded draw made beforehand with its batch (``_seeded_draws``), used when it
        was drawn for this very size."""
        if self.seed is None or index is None:
            return self._box(width, height, rng)
        if drawn is not None and drawn[0] == width and drawn[1] == height:
            return drawn[2], drawn[3]
        boxes, flips = self._batch_boxes(width, height, np.array([index], dtype=np.int64), rng)
        return tuple(float(v) for v in boxes[0]), bool(flips[0])  # type: ignore[return-value]

    def _seeded_draws(self, widths: Any, heights: Any, indices: Any) -> "list[Drawn] | None":
        """Every sample's seeded box and flip for a batch, in one vectorised draw: each is
        ``_draw(widths[k], heights[k], rng, indices[k])``'s, made for that size (the index's
        recorded one; a sample whose stored image turns out to have another size is drawn again
        by ``_draw``). None for an unseeded transform (its draws come from a generator, in
        order, per sample). Drawn alone, a sample's box cost 0.1-0.2 ms of numpy calls (a tenth
        of a tiled JPEG's decode; ~25 µs now, ``rawcrop._seeded_box``); drawn with its batch of
        64, ~5 µs."""
        if self.seed is None:
            return None
        index_array = np.asarray(indices, dtype=np.int64).reshape(-1)
        if not len(index_array):
            return []
        width_array = np.asarray(widths, dtype=np.int64).reshape(-1)
        height_array = np.asarray(heights, dtype=np.int64).reshape(-1)
        if width_array.min() < 1 or height_array.min() < 1:
            return None  # sizes not recorded: each sample draws for the size it decodes to
        boxes, flips = self._batch_boxes(width_array, height_array, index_array, self._process_rng())
        return [(w, h, (b[0], b[1], b[2], b[3]), f) for w, h, b, f in
                zip(width_array.tolist(), height_array.tolist(), boxes.tolist(), flips.tolist())]

    def geometry(self, width: int, height: int, index: int | None = None, *,
                 rng: np.random.Generator | None = None) -> CropGeometry:
        """The crop and flip this transform applies to a ``width x height`` image (sample ``index``).

        Exactly the box and flip the pixel path resamples when it decodes the image at full
        resolution (PNG and every non-JPEG format, raw pixels, a JPEG whose crop needs its full
        size), for this transform's resize backend (``CenterCrop``'s torch path rounds its
        resize to whole pixels; that rounding is in the box). A JPEG decoded at a reduced DCT
        scale M/8 is resampled from the box rounded to whole decoded pixels (within 4/M source
        pixels, under half an output pixel): ``decode_with_geometry`` returns the box of the
        decode it did. With ``seed=`` this is a function of ``(seed, epoch, index)``; without,
        it draws from ``rng`` (default the per-process generator) and only a caller that passes
        the same generator state to the pixel path gets the same crop.

        Args:
            width, height: the source image's size in pixels.
            index: the sample's dataset index (required for seeded draws).
            rng: the generator for unseeded draws.

        Returns:
            The ``CropGeometry``.

        Raises:
            OptionError: a size below one pixel.
        """
        width, height = int(width), int(height)
        if width < 1 or height < 1:
            raise OptionError(f"an image of {width}x{height} pixels has nothing to crop")
        box, flip = self._draw(width, height, rng if rng is not None else self._process_rng(), index)
        used = self._torch_plan(box, width, height)[1] if self._use_torch() else box
        return CropGeometry(box=used, flip=flip, size=self.size, source_size=(width, height))

    def batch_geometry(self, width: int, height: int, indices: Any, *,
                       rng: np.random.Generator | None = None) -> list[CropGeometry]:
        """The crops and flips of ``batch`` for a batch of ``width x height`` images (seeded draws).

        ``batch`` resamples the drawn boxes exactly (fractional ones too), so these are its
        geometry; with ``seed=`` they are also ``geometry(width, height, index)`` for every
        ``RandomResizedCrop`` sample. ``batch_with_geometry`` returns the pixels and these
        together (the only way to get both from unseeded draws).
        """
        return self.geometries_of(*self.batch_boxes(width, height, indices, rng=rng), width, height)

    def batch_boxes(self, width: int, height: int, indices: Any, *,
                    rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ``(N, 4)`` boxes (left, top, right, bottom) and ``(N,)`` flips ``batch`` resamples for
        a batch of ``width x height`` images (seeded draws of each index, or ``rng``'s);
        ``packer.rawcrop.crop_resize_raw`` takes them with ``size`` and ``clip_to_box``."""
        index_array = np.asarray(indices, dtype=np.int64).reshape(-1)
        return self._batch_boxes(int(width), int(height), index_array, rng or self._process_rng())

    @property
    def clip_to_box(self) -> bool:
        """Whether the resample reads only each box (a crop then a resize) rather than the whole
        image (a resize then a crop, ``CenterCrop``): ``rawcrop.crop_resize_batch``'s option."""
        return not self._resize_then_crop

    def geometries_of(self, boxes: np.ndarray, flips: np.ndarray, width: int, height: int) -> list[CropGeometry]:
        """The ``CropGeometry`` of each of ``batch_boxes``' boxes and flips."""
        size = self.size
        return [CropGeometry(box=(float(b[0]), float(b[1]), float(b[2]), float(b[3])), flip=bool(f), size=size,
                             source_size=(int(width), int(height))) for b, f in zip(boxes.tolist(), flips.tolist())]

    def batch(self, images: Any, indices: Any = None, *, out: Any = None,
              rng: np.random.Generator | None = None, kernel: str = "auto", with_geometry: bool = False) -> Any:
        """Crop, resize and flip a whole batch of raw pixels at once (``packer.rawcrop``).

        The batched path for ``--codec raw`` datasets: every box drawn with numpy, one
        vectorised antialiased bilinear resample over the batch, written into ``out``. Pixels
        agree with calling this transform on each sample within ``rawcrop.AGREEMENT_MAX_ABS``
        grey levels (``tests/readers/test_rawcrop.py``); with ``seed=`` the boxes and flips are exactly
        the per-sample path's, a function of ``(seed, epoch, index)``.

        Args:
            images: ``(N, H, W, 3)`` uint8 pixels: a numpy array (a zero-copy strided view of
                a shard is fine) or a torch tensor on any device.
            indices: the samples' dataset indices (needed with ``seed=``).
            out: ``(N, height, width, 3)`` uint8 torch tensor to write into (e.g. in shared
                memory, or on the GPU); default a new tensor on ``images``' device.
            rng: the generator for unseeded draws (default this transform's per-process one).
            kernel: ``rawcrop.crop_resize_batch``'s kernel: ``"auto"`` (compiled on the CPU
                when built, else torch's ops), ``"c"`` or ``"torch"``.
            with_geometry: also return each sample's ``CropGeometry``.

        Returns:
            The ``(N, height, width, 3)`` uint8 torch tensor (and the geometries).

        Raises:
            OptionError: ``indices`` missing with ``seed=``, or shapes that do not fit.
        """
        shape = tuple(images.shape)
        if len(shape) != 4 or shape[3] != 3:
            raise OptionError(f"images must be an (N, H, W, 3) batch, got shape {shape}")
        count, height, width = shape[0], shape[1], shape[2]
        if indices is None:
            if self.seed is not None:
                raise OptionError("a seeded transform draws from each sample's index: pass indices=")
            index_array = np.zeros(count, dtype=np.int64)
        else:
            index_array = np.asarray(indices, dtype=np.int64).reshape(-1)
            if len(index_array) != count:
                raise OptionError(f"need one index per image: {count} images, got {len(index_array)} indices")
        boxes, flips = self._batch_boxes(width, height, index_array, rng or self._process_rng())
        result = crop_resize_batch(images, boxes, self.size, flips=flips,
                                   clip_to_box=not self._resize_then_crop, out=out, kernel=kernel)
        if with_geometry:
            return result, self.geometries_of(boxes, flips, width, height)
        return result

    def batch_with_geometry(self, images: Any, indices: Any = None, *, out: Any = None,
                            rng: np.random.Generator | None = None,
                            kernel: str = "auto") -> tuple[Any, list[CropGeometry]]:
        """``batch``, and each sample's ``CropGeometry`` (the boxes and flips it resampled)."""
        return self.batch(images, indices, out=out, rng=rng, kernel=kernel, with_geometry=True)

    def __call__(self, data: ImageBytes, image_format: int | None = None,
                 rng: np.random.Generator | None = None, *, out: np.ndarray | None = None,
                 name: str = "", index: int | None = None) -> np.ndarray:
        """Decode ``data`` and return the transformed ``(height, width, 3)`` uint8 RGB array.

        ``decode_with_geometry`` takes the same arguments and also returns the crop it used.

        Args:
            data: the stored image bytes (any C-contiguous buffer), or already decoded
                ``(H, W, 3)`` uint8 pixels (a ``--codec raw`` sample, which ``packer.torch``
                passes reshaped: raw bytes carry no shape).
            image_format: an ``ImageFormat`` value (the index's ``image_format`` column);
                ``None`` detects it from the magic bytes.
            rng: the random generator; ``None`` uses this transform's per-process generator
                (seeded from ``torch.initial_seed()`` when torch is loaded, else unseeded).
            out: optional ``(height, width, 3)`` uint8 array to write into; it is returned.
            name: the sample's name or key, for error messages.
            index: the sample's dataset index: with ``seed=``, the box and flip are then the
                seeded draws of ``(seed, epoch, index)`` (the batched path's), not ``rng``'s.

        Returns:
            ``out`` if given, else a new C-contiguous array.

        Raises:
            DecodeError: the bytes cannot be decoded, or raw bytes come without their shape.
        """
        return self._apply(data, image_format, rng, out, name, index, False)[0]

    def _decode_drawn(self, data: ImageBytes, image_format: int | None, out: np.ndarray | None, index: int,
                      drawn: "Drawn | None", with_geometry: bool) -> tuple[np.ndarray, CropGeometry | None]:
        """``__call__`` (``decode_with_geometry`` with ``with_geometry``) of sample ``index`` with its
        seeded draw made beforehand (``_seeded_draws``): the readers' batched path."""
        return self._apply(data, image_format, None, out, "", index, with_geometry, drawn)

    def decode_with_geometry(self, data: ImageBytes, image_format: int | None = None,
                             rng: np.random.Generator | None = None, *, out: np.ndarray | None = None,
                             name: str = "", index: int | None = None) -> tuple[np.ndarray, CropGeometry]:
        """``__call__``, and the ``CropGeometry`` of this very decode: the box (in the source
        image's pixels) that its pixels were resampled from, and the flip.

        This is what to move boxes, keypoints and masks with: it is exact for every decode path
        (a JPEG decoded at a reduced DCT scale included, see ``geometry``).
        """
        return self._apply(data, image_format, rng, out, name, index, True)  # type: ignore[return-value]

    def _apply(self, data: ImageBytes, image_format: int | None, rng: np.random.Generator | None,
               out: np.ndarray | None, name: str, index: int | None,
               with_geometry: bool, drawn: "Drawn | None" = None) -> tuple[np.ndarray, CropGeometry | None]:
        """The pixel path: decode, crop, resize, flip; the geometry when asked."""
        if rng is None:
            rng = self._process_rng()
        use_torch = self._use_torch()
        if isinstance(data, np.ndarray) and data.ndim == 3:
            if data.dtype != np.uint8 or data.shape[2] != 3 or data.shape[0] < 1 or data.shape[1] < 1:
                raise DecodeError(f"decoded pixels must be (H, W, 3) uint8, got {data.shape} "
                                  f"{data.dtype}", path=name or None)
            pixels, decoded, raw_input = data, None, True
        elif image_format in ImageFormat.PIXEL_FORMATS:
            raise DecodeError("a raw payload carries no shape: pass its pixels as an (H, W, 3) "
                              "uint8 array (packer.torch.PackedDataset does), or use .batch()",
                              path=name or None)
        else:
            pixels, raw_input = None, False
            view = byte_view(data)
            if image_format is None or image_format == ImageFormat.UNKNOWN:
                image_format = detect_format(view) if len(view) else ImageFormat.UNKNOWN
            decoded = (self._decode_jpeg(view, rng, index, drawn, use_torch) if image_format == ImageFormat.JPEG
                       else None)
        # The decoded grid's coordinates to the source image's: source = origin + grid / factor
        # (a JPEG decoded at DCT scale M/8, maybe only a window of its tiles).
        origin_x, origin_y, factor = 0.0, 0.0, 1.0
        if decoded is None:
            if pixels is None:
                pixels = decode_image(view, image_format, name=name)
            height, width = pixels.shape[:2]
            box, flip = self._draw(width, height, rng, index, drawn)
            full_size = True
        else:
            pixels, box, flip, (origin_x, origin_y, factor), (width, height) = decoded
            full_size = False
            if use_torch:
                # At a DCT scale M/8 the last decoded column/row can be only partly inside the image
                # (427 px at 1/4: 106.75 decoded px, 107 decoded); the torch path rounds the box to
                # whole decoded pixels, so it resamples from those wholly inside: the crop box (and
                # its geometry) never extends past the image. (Pillow's box= is fractional: inside.)
                inside_w = max(1, math.floor((width - origin_x) * factor + 1e-9))
                inside_h = max(1, math.floor((height - origin_y) * factor + 1e-9))
                if pixels.shape[1] > inside_w or pixels.shape[0] > inside_h:
                    pixels = pixels[:inside_h, :inside_w]
        if out is not None and (out.shape != self.output_shape or out.dtype != np.uint8):
            raise OptionError(f"out must be a {self.output_shape} uint8 array, got {out.shape} "
                              f"{out.dtype}")
        if use_torch:
            result, used = self._resize_torch(pixels, box, flip, out)
        else:
            used = box  # Pillow's box= is fractional; a raw crop's box is whole pixels already
            if raw_input and not self._resize_then_crop:
                # Cut the (whole-pixel) crop out first, as the torch path and the batched raw path do:
                # Pillow's box= resize would also filter pixels outside the crop.
                left, top, right, bottom = (int(v) for v in box)
                pixels = pixels[top:bottom, left:right]
                box = (0.0, 0.0, float(right - left), float(bottom - top))
            result = self._resize_pil(pixels, box, flip, full_size, out)
        if not with_geometry:
            return result, None
        geometry = CropGeometry(box=(origin_x + used[0] / factor, origin_y + used[1] / factor,
                                     origin_x + used[2] / factor, origin_y + used[3] / factor),
                                flip=flip, size=self.size, source_size=(int(width), int(height)))
        return result, geometry

    def _torch_plan(self, box: tuple[float, float, float, float], width: int,
                    height: int) -> tuple[tuple[Any, ...], tuple[float, float, float, float]]:
        """How the torch path resamples ``box`` of a ``width x height`` grid, and the box that is.

        Returns:
            ``((x0, y0, x1, y1), used)`` for a random crop (the whole-pixel crop cut out), or
            ``((x0, y0, (resized height, resized width)), used)`` for a resize then crop; ``used``
            is the region of the grid the output's pixels come from.
        """
        left, top, right, bottom = box
        if self._resize_then_crop:
            # Scale the whole image so the box becomes the output size, then cut it out: exactly
            # torchvision's Resize + CenterCrop, with no rounding of a fractional box.
            scale_x = self.out_width / (right - left)
            scale_y = self.out_height / (bottom - top)
            size = (max(self.out_height, round(height * scale_y)),
                    max(self.out_width, round(width * scale_x)))
            x0 = min(max(round(left * scale_x), 0), size[1] - self.out_width)
            y0 = min(max(round(top * scale_y), 0), size[0] - self.out_height)
            # interpolate(size=...) samples at the resized size's own scale, not at scale_x/y
            fx, fy = width / size[1], height / size[0]
            used = (x0 * fx, y0 * fy, (x0 + self.out_width) * fx, (y0 + self.out_height) * fy)
            return (x0, y0, size), used
        # A random crop only needs whole pixels: round the box (under one decoded pixel).
        x0 = min(max(int(left + 0.5), 0), width - 1)
        y0 = min(max(int(top + 0.5), 0), height - 1)
        x1 = min(max(int(right + 0.5), x0 + 1), width)
        y1 = min(max(int(bottom + 0.5), y0 + 1), height)
        return (x0, y0, x1, y1), (float(x0), float(y0), float(x1), float(y1))

    def _use_torch(self) -> bool:
        if self.resize_backend == "auto":
            return sys.modules.get("torch") is not None
        return self.resize_backend == "torch"

    def _resize_pil(self, pixels: np.ndarray, box: tuple[float, float, float, float], flip: bool,
                    full_size: bool, out: np.ndarray | None) -> np.ndarray:
        # Only a full-size (Pillow-decoded) image can be many times larger than the output.
        result = Image.fromarray(pixels).resize((self.out_width, self.out_height), _BILINEAR,
                                                box=box,
                                                reducing_gap=_BOX_REDUCING_GAP if full_size else None)
        if flip:
            result = result.transpose(_FLIP)
        array = np.asarray(result)
        if out is None:
            return array if array.flags.writeable else array.copy()
        np.copyto(out, array)
        return out

    def _resize_torch(self, pixels: np.ndarray, box: tuple[float, float, float, float], flip: bool,
                      out: np.ndarray | None) -> tuple[np.ndarray, tuple[float, float, float, float]]:
        """The torch resize: the pixels, and the box of the grid they were resampled from."""
        import torch
        import torch.nn.functional as functional

        height, width = pixels.shape[:2]
        plan, used = self._torch_plan(box, width, height)
        if self._resize_then_crop:
            x0, y0, size = plan
            source = torch.from_numpy(pixels if pixels.flags.writeable else pixels.copy())
        else:
            x0, y0, x1, y1 = plan
            size = (self.out_height, self.out_width)
            # The crop is copied out with numpy (a read-only shard view, a strided crop), and viewed
            # as a channels-last 1xCxHxW batch with numpy's strides: one torch call fewer per step
            # than torch's unsqueeze/permute/contiguous, each of which gives up and takes back the
            # GIL (issue 40: threads decoding side by side hand it over at every call).
            crop = pixels[y0:y1, x0:x1]
            if not (crop.flags.c_contiguous and crop.flags.writeable):
                crop = np.array(crop, order="C")
            # reshape, not crop[None]: numpy gives a new axis a stride of 0, which torch takes for planar
            batch = torch.from_numpy(crop.reshape(1, *crop.shape).transpose(0, 3, 1, 2))
            resized = _resize_antialiased(torch, functional, batch, size)
            hwc = resized.numpy()[0].transpose(1, 2, 0)  # channels-last: a contiguous HWC view
            if flip:
                result = torch.flip(torch.from_numpy(hwc), [1]).numpy()
            elif out is None:
                return hwc, used
            else:
                result = hwc
            if out is None:
                return result, used
            np.copyto(out, result)
            return out, used
        # torch's AVX2 uint8 antialiased bilinear kernel works on channels-last images, and its
        # output then keeps that layout, so the HWC result below is contiguous (a crop view, or
        # a 1xCxHxW view torch does not recognise as channels-last, would come back planar and
        # cost a transposing copy: 2x slower in all). The batch dimension goes first, then the
        # permute: a whole image (CenterCrop, a crop as wide as the decode) is then channels-last
        # as it is (batch stride H*W*C), where permute-then-unsqueeze gave it a batch stride of C,
        # which torch took for planar: its output came back planar, the resize ~1.5x slower
        # (issue 40; the same pixels, tests/transforms/test_fused.py).
        batch = source.unsqueeze(0).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
        resized = _resize_antialiased(torch, functional, batch, size)[0].permute(1, 2, 0)
        if self._resize_then_crop:
            resized = resized[y0:y0 + self.out_height, x0:x0 + self.out_width]
        if flip:
            resized = torch.flip(resized, [1])
        if out is None:
            return resized.contiguous().numpy(), used
        torch.from_numpy(out).copy_(resized)
        return out, used

    def _decode_jpeg(self, view: bytes | memoryview, rng: np.random.Generator, index: int | None = None,
                     drawn: "Drawn | None" = None, use_torch: bool | None = None) -> tuple[np.ndarray, tuple[float, float, float, float], bool, tuple[float, float, float],
                                tuple[int, int]] | None:
        """Scaled simplejpeg decode: ``(pixels, box in decoded pixels, flip, (origin_x, origin_y,
        factor), (width, height))``, or None; a decoded pixel ``g`` is source pixel
        ``origin + g / factor`` (``factor`` = M/8), ``(width, height)`` the JPEG's size.

        None sends the sample to the Pillow path (CMYK, unreadable header). The random draws
        happen once, whichever decoder ends up decoding, so a generator state gives one crop.
        """
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(view)
        except Exception:  # noqa: BLE001 - corrupt or exotic: decode_image reports or rescues it
            return None
        if colorspace in PILLOW_JPEG_COLORSPACES or width < 1 or height < 1:
            return None
        box, flip = self._draw(width, height, rng, index, drawn)
        left, top, right, bottom = box
        m = _dct_scale(right - left, bottom - top, self.size)
        if not self._resize_then_crop:
            windowed = self._decode_window(view, box, m, self._use_torch() if use_torch is None else use_torch)
            if windowed is not None:
                return windowed[0], windowed[1], flip, (*windowed[2], m / 8), (width, height)
        try:
            pixels = self._simplejpeg(view, m, width, height)
        except Exception:  # noqa: BLE001 - strict mode refuses some files Pillow still decodes
            pixels = decode_image(view, ImageFormat.JPEG)
            m = 8
        decoded_height, decoded_width = pixels.shape[:2]
        if m == 8 and (decoded_width, decoded_height) != (width, height):
            raise DecodeError(f"JPEG header says {height}x{width} (HxW) but the image decodes to "
                              f"{decoded_height}x{decoded_width}")
        # Decoded pixel i covers original pixels [i * 8/M, (i + 1) * 8/M): scale by M/8 exactly,
        # not by decoded/original size, which libjpeg's rounding-up would skew.
        factor = m / 8
        return (pixels, (left * factor, top * factor, right * factor, bottom * factor), flip, (0.0, 0.0, factor),
                (width, height))

    def _simplejpeg(self, data: Any, m: int, width: int, height: int) -> np.ndarray:
        """simplejpeg's RGB decode of a ``width x height`` JPEG at DCT scale ``m``/8."""
        scaled = {} if m == 8 else {"min_width": math.ceil(width * m / 8), "min_height": math.ceil(height * m / 8)}
        return simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=self.fast_dct,
                                      fastupsample=self.fast_upsample, **scaled)

    def _decode_window(self, view: bytes | memoryview, box: tuple[float, float, float, float], m: int,
                       use_torch: bool) -> tuple[np.ndarray, tuple[float, float, float, float], tuple[float, float]] | None:
        """For a tiled JPEG (``packer.codecs.tiles``), decode only the tiles under ``box``, at M/8.

        Returns ``(pixels, box in decoded pixels, the window's origin in source pixels)``, or
        None for an ordinary JPEG, a box that needs every tile, or a window that fails to decode
        (the caller decodes the whole image).
        The pixels inside the box are exactly a full decode's (tests/codecs/test_tiles.py): the window
        is widened by the chroma upsampling's reach and, for Pillow's resize (which filters
        across the box's edges), by the resampling filter's reach as well.
        """
        left, top, right, bottom = box
        margin = window_margin(m)
        if not use_torch:  # Pillow's box= resize reads up to one output pixel outside
            margin += math.ceil(max((right - left) / self.out_width,
                                    (bottom - top) / self.out_height)) + 1
        window = cut_window(view, box, margin)
        if window is None:
            return None
        jpeg, x, y, width, height = window
        try:
            pixels = self._simplejpeg(jpeg, m, width, height)
        except Exception:  # noqa: BLE001 - the whole-image path decodes it or reports why
            return None
        if m == 8 and pixels.shape[:2] != (height, width):
            return None
        # Tiles are multiples of 8 pixels, so the window's origin maps to whole decoded pixels.
        factor = m / 8
        return pixels, ((left - x) * factor, (top - y) * factor, (right - x) * factor,
                        (bottom - y) * factor), (float(x), float(y))

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self._repr_fields().items())
        return f"{type(self).__name__}({fields})"

    def _repr_fields(self) -> dict[str, Any]:
        return {"size": self.size, "fast_dct": self.fast_dct, "fast_upsample": self.fast_upsample,
                "resize_backend": self.resize_backend, "min_box_visibility": self.min_box_visibility,
                "min_box_size": self.min_box_size, "min_box_area": self.min_box_area,
                "mask_interpolation": self.mask_interpolation}


class RandomResizedCrop(DecodeTransform):
    """Training augmentation: a random area/aspect crop resized to ``size``, then a random flip.

    Equivalent to torchvision's ``RandomResizedCrop(size, scale, ratio)`` (bilinear, antialiased,
    on a PIL image) followed by ``RandomHorizontalFlip()``, fused with the decode; see the module
    docstring for how and why.

    Args:
        size: output size, an int for a square or ``(height, width)``.
        scale: range of the crop's area as a fraction of the image's.
        ratio: range of the crop's aspect ratio (width / height).
        flip: flip horizontally with probability 0.5.
        fast_dct: use libjpeg-turbo's fast integer DCT (about 3 % faster, about one grey level
            of error).
        fast_upsample: use nearest-neighbour chroma upsampling (about 5 % faster, blockier
            colour edges).
        resize_backend: ``"auto"`` (torch when this process has imported it, else Pillow),
            ``"torch"`` or ``"pil"``; see ``RESIZE_BACKENDS``.
        seed: draw each sample's box and flip from ``(seed, epoch, index)`` (``set_epoch``
            selects the epoch; ``packer.rawcrop.sample_uniforms``) instead of a per-process
            generator: the same crops whatever the workers, threads, ranks or resumes, and the
            same on the per-sample and the batched raw path. Default None: per-process
            generator, as torchvision.
        min_box_visibility: boxes moved by the crop (``PackedDataset(geometry={...: "xyxy"})``)
            are dropped when less than this fraction of their area is left in the output;
            default 0: dropped only when nothing is left (``CropGeometry.map_boxes``).
        min_box_size, min_box_area: moved boxes narrower or lower than ``min_box_size`` output
            pixels, or smaller than ``min_box_area`` square pixels, are dropped too
            (torchvision's ``SanitizeBoundingBoxes(min_size, min_area)``, whose defaults, 1 and 1,
            these are; 0 keeps every box with some area left).
        mask_interpolation: how image fields (masks) follow the crop: ``"nearest"`` (default,
            torchvision's ``InterpolationMode.NEAREST``, what it uses for masks) or
            ``"nearest-exact"`` (``NEAREST_EXACT``); see ``CropGeometry.resample_nearest``.

    Example:
        >>> transform = RandomResizedCrop(224)
        >>> pixels = transform(jpeg_bytes, ImageFormat.JPEG, np.random.default_rng(0))
        >>> pixels.shape, pixels.dtype
        ((224, 224, 3), dtype('uint8'))
    """

    def __init__(self, size: Size = 224, scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), flip: bool = True, *,
                 fast_dct: bool = True, fast_upsample: bool = False,
                 resize_backend: str = "auto", seed: int | None = None,
                 min_box_visibility: float = DEFAULT_MIN_VISIBILITY, min_box_size: float = DEFAULT_MIN_BOX_SIZE,
                 min_box_area: float = DEFAULT_MIN_BOX_AREA,
                 mask_interpolation: Any = DEFAULT_MASK_INTERPOLATION) -> None:
        super().__init__(size, fast_dct=fast_dct, fast_upsample=fast_upsample,
                         resize_backend=resize_backend, seed=seed, min_box_visibility=min_box_visibility,
                         min_box_size=min_box_size, min_box_area=min_box_area,
                         mask_interpolation=mask_interpolation)
        if not (0 < scale[0] <= scale[1]):
            raise OptionError(f"scale must satisfy 0 < low <= high, got {scale!r}")
        if not (0 < ratio[0] <= ratio[1]):
            raise OptionError(f"ratio must satisfy 0 < low <= high, got {ratio!r}")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.flip = bool(flip)

    def get_params(self, width: int, height: int, rng: np.random.Generator) -> Box:
        """The crop box ``(top, left, height, width)`` for an image of this size."""
        return random_resized_crop_params(width, height, rng, scale=self.scale, ratio=self.ratio)

    def _box(self, width: int, height: int,
             rng: np.random.Generator) -> tuple[tuple[float, float, float, float], bool]:
        top, left, h, w = self.get_params(width, height, rng)
        flip = self.flip and bool(rng.random() < 0.5)
        return (float(left), float(top), float(left + w), float(top + h)), flip

    def _draw(self, width: int, height: int, rng: np.random.Generator, index: int | None,
              drawn: "Drawn | None" = None) -> tuple[tuple[float, float, float, float], bool]:
        if self.seed is not None and index is not None and drawn is None and index >= 0:
            # one sample's seeded draw without arrays: _batch_boxes' box for [index] (rawcrop._seeded_box)
            return _seeded_box(self.seed, self.epoch, int(index), int(width), int(height), self.scale, self.ratio,
                               self.flip)
        return super()._draw(width, height, rng, index, drawn)

    def _batch_boxes(self, width: int, height: int, indices: np.ndarray,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        if self.seed is not None:
            draws = sample_uniforms(self.seed, self.epoch, indices, RRC_DRAWS)
        else:
            draws = rng.random((len(indices), RRC_DRAWS))
        return random_resized_crop_boxes(draws, width, height, scale=self.scale, ratio=self.ratio,
                                         flip=self.flip)

    def _repr_fields(self) -> dict[str, Any]:
        return {"size": self.size, "scale": self.scale, "ratio": self.ratio, "flip": self.flip,
                "seed": self.seed, **super()._repr_fields()}


class CenterCrop(DecodeTransform):
    """Evaluation transform: shorter side resized to ``resize``, then a central ``size`` crop.

    Equivalent to torchvision's ``Resize(resize)`` then ``CenterCrop(size)`` on a PIL image
    (bilinear, antialiased), fused with the decode. Deterministic: ``rng`` is accepted and not
    used.

    Args:
        size: output size, an int for a square or ``(height, width)``.
        resize: the shorter side after resizing, before cropping; at least the crop size.
        fast_dct: use libjpeg-turbo's fast integer DCT (off by default for evaluation).
        fast_upsample: use nearest-neighbour chroma upsampling (off by default).
        resize_backend: ``"auto"``, ``"torch"`` or ``"pil"``; see ``RESIZE_BACKENDS``.
        min_box_visibility, min_box_size, min_box_area, mask_interpolation: as for
            ``RandomResizedCrop``.
    """

    _resize_then_crop = True

    def __init__(self, size: Size = 224, resize: int = 256, *, fast_dct: bool = False,
                 fast_upsample: bool = False, resize_backend: str = "auto",
                 min_box_visibility: float = DEFAULT_MIN_VISIBILITY, min_box_size: float = DEFAULT_MIN_BOX_SIZE,
                 min_box_area: float = DEFAULT_MIN_BOX_AREA,
                 mask_interpolation: Any = DEFAULT_MASK_INTERPOLATION) -> None:
        super().__init__(size, fast_dct=fast_dct, fast_upsample=fast_upsample,
                         resize_backend=resize_backend, min_box_visibility=min_box_visibility,
                         min_box_size=min_box_size, min_box_area=min_box_area,
                         mask_interpolation=mask_interpolation)
        if resize < max(self.size):
            raise OptionError(f"resize ({resize}) must be at least the crop size {self.size}")
        self.resize = int(resize)

    def _box(self, width: int, height: int,
             rng: np.random.Generator) -> tuple[tuple[float, float, float, float], bool]:
        return center_crop_box(width, height, self.size, self.resize), False

    def _batch_boxes(self, width: int, height: int, indices: np.ndarray,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        box = np.array(center_crop_box(width, height, self.size, self.resize), dtype=np.float64)
        return np.tile(box, (len(indices), 1)), np.zeros(len(indices), dtype=bool)

    def _repr_fields(self) -> dict[str, Any]:
        return {"size": self.size, "resize": self.resize, **super()._repr_fields()}
