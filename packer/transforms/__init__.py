"""Fused decode transforms: stored image bytes to a cropped, resized uint8 HWC array in one step.

The two transforms every image-classification recipe uses, done the fast way on the CPU:

* ``RandomResizedCrop(size=224)`` (training): torchvision's ``RandomResizedCrop`` followed by
  ``RandomHorizontalFlip``, same sampling rule for the crop box.
* ``CenterCrop(size=224, resize=256)`` (evaluation): torchvision's ``Resize(256)`` followed by
  ``CenterCrop(224)``.

Both are *decode transforms*: ``transform(data, image_format, rng) -> numpy.ndarray`` of shape
``(size, size, 3)``, dtype ``uint8``, RGB, taking the stored bytes (any buffer: a zero-copy
``memoryview`` of a memory-mapped shard is fine) and a ``numpy.random.Generator``. The result is
a deterministic function of the bytes and the generator's state. Pass ``out=`` to write straight
into a slot of a batch array (for instance ``batch[k]`` of an ``(N, size, size, 3)`` array whose
``torch.from_numpy(...).permute(0, 3, 1, 2)`` is an NCHW tensor in channels-last memory format,
the layout convolutions on a GPU prefer).

How a JPEG is handled (everything else goes through ``packer.decode.decode_image``, i.e.
Pillow, then the same crop and resize):

1. ``simplejpeg.decode_jpeg_header`` gives width and height (about 1 us).
2. The crop box is chosen in the original image's coordinates.
3. The image is decoded with DCT-domain downscaling: libjpeg-turbo can produce the image at
   M/8 of its size for M = 1..8 while decoding, nearly for free. The smallest scale from
   ``FAST_SCALES`` (1/8, 1/4, 1/2 or 1) is picked whose decoded crop is still at least as large
   as the output, so quality never drops below a full decode followed by a downscale.
4. The crop box, mapped to the decoded image, is resized to the output size, antialiased
   bilinear (what torchvision does): with torch's uint8 kernel when torch is loaded (every
   DataLoader worker), else Pillow's ``Image.resize(size, BILINEAR, box=...)`` whose fractional
   box makes crop and resize one pass. See ``RESIZE_BACKENDS``.
5. A horizontal flip, when drawn, mirrors the small result (``torch.flip`` or
   ``Image.transpose``), then the pixels are copied once into ``out`` if given.

CMYK/YCCK JPEGs and JPEGs that simplejpeg's strict mode refuses take the ``decode_image`` path.
EXIF orientation and colour profiles are not applied (see ``packer.decode``).

Why these choices: the measurements behind each (decoder flags, DCT scales, resize backend, flip)
are in ``docs/design-notes.md``, "Fused decode"; rerun them with
``benchmarks/bench_peers.py --choices``.

Region (partial) JPEG decoding. libjpeg-turbo's ``jpeg_crop_scanline``/``jpeg_skip_scanlines``
still entropy-decode every block above and beside a crop, which is most of the work, and neither
simplejpeg nor Pillow exposes them. Datasets built with ``--codec tiled`` (``packer.codecs.tiles``)
store JPEGs losslessly rewritten with a restart marker after every 16-pixel tile, so step 3
becomes: cut the tiles under the crop (widened by ``packer.codecs.tiles.window_margin``) out as a small
JPEG and decode only that. The crop's pixels are exactly a full decode's (with the torch resize
the result is identical; Pillow's resize weights shift by at most one level). Any restart
interval makes libjpeg-turbo use its slower Huffman decoder (~10-20 % per pixel), but a random
crop's window is about 46 % of a 500x375 image, so decoding costs ~0.55x of a full decode on
average (``benchmarks/bench_peers.py``: 0.67 ms against 1.2-1.5 ms; the whole transform 1.04 ms
against 1.6-2.0 ms). The window is cut by ``packer.codecs.tiles.cut_window`` (compiled when
``packer.codecs._jpegtiles`` is installed: 20 us instead of ~150 us in Python). ``CenterCrop`` decodes the whole image either way (its box is most of the image, and
its exact resize-then-crop rule needs the whole image's size).

Raw pixels (``--codec raw`` datasets). Both transforms also take already decoded ``(H, W, 3)``
uint8 pixels in place of ``data`` (``packer.torch`` passes a raw sample's pixels, reshaped from
the index), and crop, resize and flip them exactly as a decoded image. For a whole batch,
``transform.batch(images, indices, out=...)`` does the same in one vectorised pass
(``packer.rawcrop``): all boxes drawn with numpy, one antialiased bilinear resample over the
batch; ``PackedDataset.__getitems__`` and ``packer.threaded.ThreadedLoader`` use it for raw
datasets. Its pixels agree with the per-sample path within ``rawcrop.AGREEMENT_MAX_ABS`` grey
levels. With ``seed=`` the boxes are a function of ``(seed, epoch, index)`` on both paths (the
readers' ``set_epoch`` sets the transform's epoch too: packer's samplers, the iterable dataset,
the threaded and GPU loaders); without
it, each process draws from its own generator as below.

Geometry: boxes, keypoints and masks follow the crop. ``transform.geometry(width, height, index)``
is the crop and flip a sample gets (a ``CropGeometry``: the source box its output pixels are
resampled from, with half-pixel centres as in every resize here), ``decode_with_geometry`` and
``batch_with_geometry`` return the pixels together with the geometry of that very decode (a JPEG
decoded at a reduced DCT scale is resampled from its box rounded to whole decoded pixels, and
the geometry says so). ``CropGeometry.map_boxes`` / ``map_points`` / ``resample_nearest`` move
``xyxy`` boxes (clipped; dropped when nothing of them, or less than ``min_box_visibility`` of
their area, is left, or when smaller than ``min_box_size``/``min_box_area``, torchvision's
``SanitizeBoundingBoxes`` defaults), keypoints (visibility 0 outside the output) and second
images (nearest neighbour, ``mask_interpolation="nearest"`` as torchvision does for masks, or
``"nearest-exact"``: a label map keeps its labels, a 16-bit depth map its depths) exactly as the
pixels moved. ``packer.torch.PackedDataset(geometry=...)`` applies them per sample; see
docs/guides/geometry.md for the conventions next to torchvision's.

Without an ``rng`` argument (the DataLoader path above) each process uses its own generator,
seeded from ``torch.initial_seed()``: DataLoader workers get distinct, reproducible streams
under ``torch.manual_seed``, as with torchvision's transforms.

Modules: ``fused`` (the transforms), ``geometry`` (crop boxes and ``CropGeometry``),
``normalize`` (``normalize_on_gpu``).
"""

from __future__ import annotations

from .fused import FAST_SCALES, RESIZE_BACKENDS, CenterCrop, DecodeTransform, RandomResizedCrop
from .geometry import (
    DEFAULT_MASK_INTERPOLATION,
    DEFAULT_MIN_BOX_AREA,
    DEFAULT_MIN_BOX_SIZE,
    DEFAULT_MIN_VISIBILITY,
    MASK_INTERPOLATIONS,
    CropGeometry,
    center_crop_box,
    random_resized_crop_params,
)
from .normalize import IMAGENET_MEAN, IMAGENET_STD, normalize_on_gpu

__all__ = [
    "RandomResizedCrop",
    "CenterCrop",
    "DecodeTransform",
    "CropGeometry",
    "DEFAULT_MIN_VISIBILITY",
    "DEFAULT_MIN_BOX_SIZE",
    "DEFAULT_MIN_BOX_AREA",
    "DEFAULT_MASK_INTERPOLATION",
    "MASK_INTERPOLATIONS",
    "FAST_SCALES",
    "RESIZE_BACKENDS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "random_resized_crop_params",
    "center_crop_box",
    "normalize_on_gpu",
]
