"""The image formats beyond the six core ones: accepted when Pillow decodes them, and who can read them.

Packer checks JPEG, PNG, WEBP, GIF, BMP and TIFF by their headers and cheap structural tests
(``imageinfo``). Every other format that the installed Pillow can *open and decode* (PPM/PGM/
PBM/PFM, JPEG 2000, AVIF, TGA, ICO/CUR, PSD, QOI, DDS, SGI, PCX, Sun raster, XBM/XPM, ICNS,
FITS, ... and HEIF when a plugin such as ``pillow-heif`` registers it) is packed too:

* **Detected by bytes**: Pillow's own identification (each plugin's ``_accept`` test and header
  parser), never the file extension.
* **Validated by decoding**: these formats have no cheap truncation test that packer knows,
  so the first frame is always decoded at build, whatever ``validate`` says (after the pixel
  limit is checked from the header, before any pixel buffer is allocated). A file cut short is
  ``truncated``; one Pillow identifies but cannot decode (an EPS without Ghostscript, the
  HDF5/GRIB/BUFR/WMF stub plugins, a damaged file) is ``unsupported-format`` or
  ``decode-failed``. Only rare formats pay this decode.
* **Recorded** in the index's ``image_format`` column: one value per Pillow plugin
  (``ImageFormat.BY_PIL_NAME``, SPEC.md §5), or ``ImageFormat.OTHER`` (255) for a plugin with
  no value of its own; a reader then lets Pillow identify the bytes again.
* **Decoded** by ``packer.decode.decode_image`` (and so the fused transforms, the torch
  datasets and the GPU loaders' CPU path) through the same Pillow plugin, under the same
  decoding rule as PNG or TIFF.

Which reader decodes what (``decodable_by``):

=================  ===========================================================================
reader             formats
=================  ===========================================================================
``"cpu"``          everything packed except ``raw`` (``decode_image``, transforms, packer.torch)
``"dali"``         jpeg, png, bmp, tiff, webp, jpeg2000, ppm (DALI's ``fn.decoders.image``)
``"nvjpeg"``       jpeg (``GpuJpegBatches`` decodes these on the GPU and the rest on the CPU)
=================  ===========================================================================

``check_reader_formats(formats, reader)`` turns that table into one clear error naming the formats
and how many samples of each a reader cannot decode, for a pipeline to raise at construction
rather than deep inside a batch.
"""

from __future__ import annotations

import io
import warnings
from typing import Any, Iterable, Union

import numpy as np
from PIL import Image, ImageFile

from ..errors import DecodeError, OptionError, RejectedImageError
from ..format import ImageFormat

__all__ = ["CORE_FORMATS", "PILLOW_ONLY_FORMATS", "READERS", "KEPT_BY_NORMALIZE", "accept_pillow_format",
           "load_pillow_format", "decodable_by", "check_reader_formats", "normalize_to_png"]

BytesLike = Union[bytes, bytearray, memoryview]

#: The formats ``imageinfo`` checks itself (stored pixels, ``ImageFormat.PIXEL_FORMATS``, are never a
#: source format).
CORE_FORMATS = frozenset({ImageFormat.JPEG, ImageFormat.PNG, ImageFormat.WEBP, ImageFormat.GIF,
                          ImageFormat.BMP, ImageFormat.TIFF})
_PIL_NAME = {value: name for name, value in ImageFormat.BY_PIL_NAME.items() if value not in CORE_FORMATS}
#: Values decoded through a Pillow plugin chosen by this module (8-38 and OTHER).
PILLOW_ONLY_FORMATS = frozenset(_PIL_NAME) | {ImageFormat.OTHER}

_DALI = frozenset({ImageFormat.JPEG, ImageFormat.PNG, ImageFormat.BMP, ImageFormat.TIFF, ImageFormat.WEBP,
                   ImageFormat.BY_PIL_NAME["JPEG2000"], ImageFormat.BY_PIL_NAME["PPM"]})
#: Reader name -> what it says about the formats it cannot decode.
READERS = {
    "cpu": "packer.decode.decode_image (Pillow and libjpeg-turbo)",
    "dali": "DALI's fn.decoders.image",
    "nvjpeg": "nvJPEG (torchvision.io.decode_jpeg on the GPU)",
}


def decodable_by(reader: str) -> frozenset[int]:
    """The ``ImageFormat`` values ``reader`` decodes (see the table in the module docstring).

    Raises:
        OptionError: ``reader`` is not one of ``READERS``.
    """
    if reader == "cpu":
        return frozenset(CORE_FORMATS | PILLOW_ONLY_FORMATS)
    if reader == "dali":
        return _DALI
    if reader == "nvjpeg":
        return frozenset({ImageFormat.JPEG})
    raise OptionError(f"reader must be one of {sorted(READERS)}, got {reader!r}")


def check_reader_formats(formats: np.ndarray | Iterable[int], reader: str, *, path: Any = None) -> None:
    """Raise one clear error if ``reader`` cannot decode every sample's ``image_format``.

    Args:
        formats: the index's ``image_format`` column (or any subset of it).
        reader: a key of ``READERS``.
        path: the dataset, for the error.

    Raises:
        DecodeError: naming each undecodable format with its sample count, and what to do.
    """
    values, counts = np.unique(np.asarray(list(formats) if not isinstance(formats, np.ndarray) else formats,
                                          dtype=np.int64), return_counts=True)
    allowed = decodable_by(reader)
    bad = [(int(v), int(n)) for v, n in zip(values.tolist(), counts.tolist()) if int(v) not in allowed]
    if not bad:
        return
    listed = ", ".join(f"{n} {ImageFormat.NAMES.get(v, f'format-{v}')}" for v, n in bad)
    # --normalize-formats stores every format but KEPT_BY_NORMALIZE as lossless PNG: the fix when
    # this reader decodes PNG and none of the bad formats is one normalizing keeps.
    if ImageFormat.PNG in allowed and not any(v in KEPT_BY_NORMALIZE for v, _ in bad):
        rebuild = "or rebuild with --normalize-formats (converts them to lossless PNG, the same pixels)"
    else:
        rebuild = "or rebuild converting them (--codec jpeg re-encodes every image, lossy)"
    raise DecodeError(f"{READERS[reader]} cannot decode {listed} sample(s) of this dataset; it decodes "
                      f"{', '.join(sorted(ImageFormat.NAMES[v] for v in allowed))}. Read these samples with a "
                      f"CPU decoder (packer.torch, packer.decode.decode_image), {rebuild}", path=path)


def accept_pillow_format(img: Image.Image, view: BytesLike, *, path: str | None, max_pixels: int) -> int:
    """Check a source image Pillow opened in a non-core format; returns its ``ImageFormat`` value.

    Called by ``imageinfo.probe_image`` for any format other than the six it checks itself.
    Decodes the first frame (these formats have no cheap truncation test).

    Raises:
        RejectedImageError: ``too-many-pixels``, ``truncated``, ``unsupported-format`` (Pillow
            identifies the format but cannot decode it here), or ``decode-failed``.
    """
    pil_format = img.format or ""
    value = ImageFormat.BY_PIL_NAME.get(pil_format, ImageFormat.OTHER)
    width, height = img.size
    if width > 0 and height > 0 and width * height > max_pixels:
        raise RejectedImageError("too-many-pixels", f"image is {width}x{height} = {width * height} pixels; the "
                                 f"limit (max_pixels) is {max_pixels}", path=path)
    if isinstance(img, ImageFile.StubImageFile):
        raise RejectedImageError("unsupported-format", f"Pillow identifies {pil_format} but has no decoder for it "
                                 f"here (a stub plugin without a handler), so packer cannot check or decode it",
                                 path=path)
    try:
        img.load()
    except Image.DecompressionBombError as exc:
        raise RejectedImageError("too-many-pixels", f"Pillow refused the image: {exc}", path=path) from exc
    except Exception as exc:  # noqa: BLE001 - hostile bytes can make a plugin raise anything
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if isinstance(exc, EOFError) or "truncated" in str(exc).lower():
            raise RejectedImageError("truncated", f"{pil_format} pixel data ends early while decoding: {text} "
                                     f"(the file, {len(view)} bytes, is truncated)", path=path) from exc
        if isinstance(exc, (OSError, ImportError)) and ("gs" in str(exc).lower() or "ghostscript" in str(exc).lower()
                                                        or "not supported" in str(exc).lower()):
            raise RejectedImageError("unsupported-format", f"Pillow identifies {pil_format} but cannot decode it "
                                     f"here: {text}", path=path) from exc
        raise RejectedImageError("decode-failed", f"{pil_format} header parsed but decoding the pixels failed: "
                                 f"{text}", path=path) from exc
    return int(value)


#: Formats ``normalize_to_png`` leaves as they are (every common loader decodes them).
KEPT_BY_NORMALIZE = frozenset({ImageFormat.JPEG, ImageFormat.PNG, ImageFormat.WEBP})
# Pillow modes a PNG stores as they are (16-bit gray and alpha kept); PA has no PNG form.
_PNG_MODES = frozenset({"1", "L", "LA", "P", "RGB", "RGBA", "I;16", "I"})


def normalize_to_png(data: BytesLike, image_format: int, *, path: str | None,
                     max_pixels: int) -> bytes | None:
    """The first frame of a non-JPEG/PNG/WEBP image as a lossless PNG, or None to keep ``data``.

    Modes PNG stores are kept (``1``, ``L``, ``LA``, ``P`` with its transparency, ``RGB``,
    ``RGBA``, 16-bit gray ``I;16``/``I``); ``PA`` becomes ``RGBA``, ``F`` (float gray) becomes
    ``L`` by packer's decoding rule (rounded, clipped), anything else (CMYK, YCbCr, LAB, ...) is
    Pillow's ``convert("RGB")`` (``RGBA`` when the image has alpha). ``decode_image`` of the PNG
    gives the same pixels as of the original. Only the first frame of an animated or multi-page
    file is kept.

    Raises:
        RejectedImageError: ``decode-failed`` when the image cannot be decoded.
    """
    if image_format in KEPT_BY_NORMALIZE or image_format in ImageFormat.PIXEL_FORMATS:
        return None
    try:
        if image_format in PILLOW_ONLY_FORMATS:
            img = load_pillow_format(data, image_format, path=path, max_pixels=max_pixels)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                img = Image.open(io.BytesIO(data))
                img.load()
    except Exception as exc:  # noqa: BLE001 - DecodeError, or a plugin's own error
        raise RejectedImageError("decode-failed", f"cannot decode the image to convert it to PNG: {exc}",
                                 path=path) from exc
    mode = img.mode
    if mode in ("I;16B", "I;16L", "I;16N"):
        img = img.convert("I;16")
    elif mode == "PA":
        img = img.convert("RGBA")
    elif mode == "F":
        values = np.nan_to_num(np.asarray(img), nan=0.0, posinf=255.0, neginf=0.0)
        img = Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8), "L")
    elif mode not in _PNG_MODES:
        img = img.convert("RGBA" if "A" in mode or "transparency" in img.info else "RGB")
    out = io.BytesIO()
    options: dict[str, Any] = {"optimize": False}
    if img.mode == "P" and "transparency" in img.info:
        options["transparency"] = img.info["transparency"]
    img.save(out, "PNG", **options)
    return out.getvalue()


def load_pillow_format(view: BytesLike, image_format: int, *, path: str | None, max_pixels: int) -> Image.Image:
    """Open and decode (first frame) stored bytes of a non-core format with Pillow.

    The plugin named by ``image_format`` is called directly (``OTHER`` lets every plugin try),
    so Pillow's process-wide decompression-bomb limit does not apply; ``max_pixels`` does,
    checked from the header before the pixels are allocated.

    Raises:
        DecodeError: the bytes are not that format, or cannot be decoded.
    """
    name = _PIL_NAME.get(int(image_format))
    label = name or "an image Pillow identifies"
    try:
        if name is not None:
            if name not in Image.OPEN:
                Image.init()
            entry = Image.OPEN.get(name)
            if entry is None:
                raise DecodeError(f"this Pillow build has no {name} plugin; install a Pillow (or plugin) with "
                                  f"{name} support", path=path)
            img = entry[0](io.BytesIO(view), "")
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                img = Image.open(io.BytesIO(view))
    except DecodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - UnidentifiedImageError, or a plugin's own error
        raise DecodeError(f"expected a JPEG, PNG, WEBP, GIF, BMP or TIFF image, or {label}; cannot open the bytes "
                          f"(starting {bytes(view[:16])!r}): {type(exc).__name__}: {exc}", path=path) from exc
    width, height = img.size
    if width * height > max_pixels:
        raise DecodeError(f"the header declares {width}x{height} = {width * height} pixels, over the limit of "
                          f"{max_pixels} (a decompression bomb, or raise max_pixels)", path=path)
    try:
        img.load()
    except Exception as exc:  # noqa: BLE001
        raise DecodeError(f"cannot decode the bytes as {img.format or label}: {type(exc).__name__}: {exc}",
                          path=path) from exc
    return img
