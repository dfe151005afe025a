"""Decodes stored image bytes to pixels: always a (height, width, 3) uint8 RGB numpy array.

The decoding rule
-----------------
The result is always a new, writable, C-contiguous ``numpy.uint8`` array of shape
``(height, width, 3)`` holding R, G, B in that order, whatever the stored format and mode.

JPEG (and MPO, whose first image is decoded):
    libjpeg-turbo through ``simplejpeg.decode_jpeg(data, colorspace="RGB")`` with its accurate
    defaults (integer DCT, smooth chroma upsampling). A grayscale JPEG comes out with its gray
    value in all three channels. CMYK and YCCK JPEGs are decoded by Pillow instead, as
    ``Image.convert("RGB")``: R = (255 - C) * (255 - K) / 255 (rounded), likewise G from M and
    B from Y, with no colour profile applied. A JPEG that simplejpeg refuses (its strict mode
    rejects some damaged files that Pillow still decodes) is also handed to Pillow; only when
    Pillow fails too is it an error. Both decoders run libjpeg-turbo with the same settings;
    on the files tested their RGB outputs are identical.

PNG, WEBP, GIF, BMP, TIFF, and every other format the build accepted through Pillow (PPM,
JPEG 2000, AVIF, TGA, ICO, PSD, QOI, ...: ``packer._internal.pillowformats``), first frame only for animated
GIF and WEBP, multi-page TIFF and multi-image files (an ICO decodes its largest image, as Pillow
opens it). Bytes whose format is not given (``None``/``UNKNOWN``) and has no core signature are
identified by Pillow. By Pillow mode:
    * ``RGB``: as stored. Pillow reads 16-bit-per-channel colour PNG and TIFF files as 8-bit
      ``RGB``/``RGBA`` already, keeping the high byte of each sample.
    * ``RGBA``, ``RGBX``, ``LA``, ``PA`` (and the rare premultiplied ``RGBa``, ``La``): the
      alpha (or padding) channel is dropped, not composited onto a background. The colour
      channels are kept as stored, so a fully transparent pixel shows whatever colour it
      stores. If you need alpha, read the raw payload bytes and decode them yourself.
    * ``P`` (palette): each pixel's palette colour, through ``convert("RGBA")`` when the image
      has ``transparency`` information and ``convert("RGB")`` otherwise, alpha then dropped.
    * ``L`` (8-bit gray): the gray value replicated to all three channels.
    * ``1`` (bilevel): 0 and 1 become 0 and 255, replicated.
    * ``I;16``, ``I;16B``, ``I;16L`` (16-bit gray): scaled to 8 bits by keeping the high byte,
      ``value >> 8``, then replicated. ``I`` (32-bit integer gray) is first clipped to
      0..65535, then treated the same way.
    * ``F`` (32-bit float gray): rounded to the nearest integer and clipped to 0..255 (NaN
      becomes 0), then replicated.
    * Any other mode (``CMYK`` or ``YCbCr`` TIFF, ...): Pillow's ``convert("RGB")``.

EXIF orientation is not applied: pixels come out as encoded in the file, as with
``torchvision.io.decode_jpeg`` by default and ``PIL.Image.open`` without
``ImageOps.exif_transpose``. Embedded ICC colour profiles are not applied either.

Failures raise ``packer.errors.DecodeError`` naming the sample, never a Pillow or simplejpeg
exception. ``max_pixels`` (default 150,000,000) is checked from the header before the pixels are
allocated; Pillow's global decompression-bomb limit never decides (see ``packer._internal.imageinfo``).
Datasets built with a higher ``--max-pixels`` record it in the manifest (``limits``); readers
pass ``packer.codecs.dataset_max_pixels(manifest)`` so every image the build accepted decodes.
"""

from __future__ import annotations

from typing import Any, Union

import numpy as np
import simplejpeg
from PIL import Image

from .errors import DecodeError
from .format import ImageFormat
from ._internal.imageheaders import parse_header
from ._internal.imageinfo import (DEFAULT_MAX_PIXELS, byte_view, detect_format, open_with_plugin,
                                  pillow_limit_raised, plugin_factory)
from ._internal.pillowformats import PILLOW_ONLY_FORMATS, check_reader_formats, load_pillow_format

__all__ = ["decode_image", "decode_jpeg_rgb", "decode_as_stored", "check_reader_formats"]

#: Anything with the buffer protocol: bytes, bytearray, memoryview, a 1-D numpy uint8 array.
ImageBytes = Union[bytes, bytearray, memoryview, np.ndarray]

# libjpeg-turbo colour spaces that go to Pillow, so the CMYK formula does not depend on which
# simplejpeg version is installed (older ones refuse CMYK, newer ones convert it themselves).
PILLOW_JPEG_COLORSPACES = frozenset({"CMYK", "YCCK"})
_PILLOW_FORMATS = frozenset({ImageFormat.PNG, ImageFormat.WEBP, ImageFormat.GIF, ImageFormat.BMP,
                             ImageFormat.TIFF})
_ALPHA_RGB_MODES = frozenset({"RGBA", "RGBX", "RGBa"})
_ALPHA_GRAY_MODES = frozenset({"LA", "La"})


def decode_image(data: ImageBytes, image_format: int | None = None, *,
                 name: str = "", max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode one image's bytes to RGB pixels, following the rule in the module docstring.

    Args:
        data: the encoded image; any C-contiguous buffer works, including zero-copy slices of
            a memory-mapped shard (memoryview, numpy uint8 array).
        image_format: an ``ImageFormat`` value saying which decoder to use (the ``image_format``
            index column); ``None``, ``ImageFormat.UNKNOWN`` or a reserved value (39-254, a newer
            writer's format) detects it from the magic bytes.
        name: the sample's name or key, used in error messages.
        max_pixels: refuse (before allocating) an image whose header declares more than this
            many pixels: the decompression-bomb guard, the same default as ``packer build``.

    Returns:
        A new, writable, C-contiguous ``uint8`` array of shape ``(height, width, 3)``, RGB.

    Raises:
        DecodeError: the bytes cannot be decoded as ``image_format``, the format is unknown, the
            header declares more than ``max_pixels`` pixels, or
            it is one of ``ImageFormat.PIXEL_FORMATS`` (stored pixels carry no shape: reshape them
            with the index's height, width and channels instead).
    """
    path = name or None
    view = byte_view(data)
    if len(view) == 0:
        raise DecodeError("no bytes to decode: expected an encoded image, found 0 bytes",
                          path=path)
    if image_format is None or image_format == ImageFormat.UNKNOWN or _reserved(image_format):
        image_format = detect_format(view)
    if image_format == ImageFormat.JPEG:
        return _decode_jpeg(view, path, max_pixels)
    if image_format == ImageFormat.BMP:
        plain = _plain_bmp(view, path, max_pixels)
        if plain is not None:
            return plain
    if image_format in _PILLOW_FORMATS:
        return _decode_with_pillow(view, int(image_format), path, max_pixels=max_pixels)
    if image_format in PILLOW_ONLY_FORMATS or image_format == ImageFormat.UNKNOWN and len(view) > 2:
        # every other format Pillow decodes (packer/_internal/pillowformats.py); UNKNOWN: Pillow identifies it
        fallback = ImageFormat.OTHER if image_format == ImageFormat.UNKNOWN else int(image_format)
        return _to_rgb(load_pillow_format(view, fallback, path=path, max_pixels=max_pixels))
    if image_format in ImageFormat.PIXEL_FORMATS:
        raise DecodeError(
            "image_format 7 (raw) holds undecoded pixels without a shape; reshape the payload "
            "with the index's height, width and channels instead of decoding it", path=path)
    if image_format == ImageFormat.UNKNOWN:
        raise DecodeError(
            f"expected a JPEG, PNG, WEBP, GIF, BMP or TIFF image, found bytes starting "
            f"{bytes(view[:16])!r}", path=path)
    raise DecodeError(
        f"unknown image_format {image_format}; decodable values are 1 to 6 and 8 to 38 (jpeg, png, "
        f"webp, gif, bmp, tiff, and the formats of packer._internal.pillowformats), 255 (other), or None to detect "
        f"the format", path=path)


def _plain_bmp(view: bytes | memoryview, path: str | None, max_pixels: int) -> np.ndarray | None:
    """A 24-bit uncompressed BMP (how ``packer.Writer`` spools decoded pixels for a codec that
    re-encodes them) read with numpy: the pixels Pillow's raw ``BGR`` decoder gives, without an
    image object per sample. None for any other BMP, or one whose pixel array does not fit the
    bytes (Pillow then decodes it, or says what is wrong)."""
    header = parse_header(view, ImageFormat.BMP)
    if header is None or header.mode != "RGB" or len(header.tile) != 1:
        return None
    _, (_, _, width, height), offset, (raw_mode, stride, orientation) = header.tile[0]
    if raw_mode != "BGR" or stride < width * 3 or offset + stride * height > len(view):
        return None
    _check_pixels(width, height, max_pixels, path)
    rows = np.frombuffer(view, dtype=np.uint8, count=stride * height, offset=offset).reshape(height, stride)
    pixels = rows[:, :width * 3].reshape(height, width, 3)[:, :, ::-1]
    return np.ascontiguousarray(pixels[::-1] if orientation == -1 else pixels)


def _reserved(image_format: int) -> bool:
    """A stored value this version has no name for (39-254, reserved for new formats): SPEC §5
    says a reader treats it like 0 and sniffs the bytes, so a newer writer's dataset still reads."""
    return 0 <= image_format <= 255 and image_format not in ImageFormat.NAMES


def decode_jpeg_rgb(data: ImageBytes, *, name: str = "", max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode JPEG bytes to RGB pixels: simplejpeg, or Pillow for CMYK/YCCK and refused files.

    Args:
        data: the JPEG bytes; any C-contiguous buffer (memoryview, numpy uint8 array).
        name: the sample's name or key, used in error messages.

    Returns:
        A new, writable, C-contiguous ``uint8`` array of shape ``(height, width, 3)``, RGB.

    Raises:
        DecodeError: neither simplejpeg nor Pillow can decode the bytes.
    """
    path = name or None
    view = byte_view(data)
    if len(view) == 0:
        raise DecodeError("no bytes to decode: expected a JPEG, found 0 bytes", path=path)
    return _decode_jpeg(view, path, max_pixels)


def _check_pixels(width: int, height: int, max_pixels: int, path: str | None) -> None:
    if width * height > max_pixels:
        raise DecodeError(f"the header declares {height}x{width} (HxW) = {width * height} pixels, over the limit of "
                          f"{max_pixels} (a decompression bomb, or raise max_pixels)", path=path)


def _decode_jpeg(view: bytes | memoryview, path: str | None, max_pixels: int) -> np.ndarray:
    try:
        # ~2 us, against ~1.5 ms for decoding a 500x375 image: cheap enough to ask every time.
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(view)
    except Exception as exc:  # noqa: BLE001 - let Pillow have a go, and report both
        return _decode_with_pillow(view, ImageFormat.JPEG, path, simplejpeg_error=exc, max_pixels=max_pixels)
    _check_pixels(width, height, max_pixels, path)
    if colorspace in PILLOW_JPEG_COLORSPACES:
        return _decode_with_pillow(view, ImageFormat.JPEG, path, max_pixels=max_pixels)
    try:
        return simplejpeg.decode_jpeg(view, colorspace="RGB")
    except Exception as exc:  # noqa: BLE001 - strict mode refuses some files Pillow accepts
        return _decode_with_pillow(view, ImageFormat.JPEG, path, simplejpeg_error=exc, max_pixels=max_pixels)


def decode_as_stored(data: ImageBytes, image_format: int | None = None, *, name: str = "",
                     max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode a secondary image (an ``image`` field: a mask, a depth map) keeping its values.

    Unlike ``decode_image`` nothing is turned into RGB, because the values *are* the data (a
    palette PNG mask stores class ids as palette indices; a depth map is 16-bit). By Pillow mode:
    ``P`` -> the palette indices, ``(H, W)`` uint8; ``L`` -> ``(H, W)`` uint8; ``1`` -> ``(H, W)``
    uint8 of 0 and 1; ``I;16*`` -> ``(H, W)`` uint16; ``I`` -> ``(H, W)`` int32; ``F`` -> ``(H, W)``
    float32; ``RGB``/``RGBA``/``LA`` -> ``(H, W, C)`` uint8 as stored; any other mode ->
    ``convert("RGB")``. First frame only; EXIF orientation is not applied (as ``decode_image``).

    Raises:
        DecodeError: the bytes cannot be decoded, or declare more than ``max_pixels`` pixels.
    """
    path = name or None
    view = byte_view(data)
    if len(view) == 0:
        raise DecodeError("no bytes to decode: expected an encoded image, found 0 bytes", path=path)
    if image_format is None or image_format == ImageFormat.UNKNOWN or _reserved(image_format):
        image_format = detect_format(view)
    if (image_format == ImageFormat.UNKNOWN or image_format in ImageFormat.PIXEL_FORMATS
            or image_format not in ImageFormat.NAMES):
        raise DecodeError(f"cannot decode image_format {image_format} as a stored image", path=path)
    if image_format == ImageFormat.OTHER or image_format in PILLOW_ONLY_FORMATS:
        return _as_stored(load_pillow_format(view, int(image_format), path=path, max_pixels=max_pixels))
    return _decode_with_pillow(view, int(image_format), path, max_pixels=max_pixels, to_array=_as_stored)


def _as_stored(img: Image.Image) -> np.ndarray:
    """The per-mode rule of ``decode_as_stored`` on a loaded Pillow image."""
    mode = img.mode
    if mode in ("P", "L"):
        return np.array(img, dtype=np.uint8, copy=True)
    if mode == "1":
        return np.array(img, dtype=np.uint8, copy=True)  # bools -> 0/1
    if mode.startswith("I;16"):
        return np.array(img, dtype=np.uint16, copy=True)
    if mode == "I":
        return np.array(img, dtype=np.int32, copy=True)
    if mode == "F":
        return np.array(img, dtype=np.float32, copy=True)
    if mode in ("RGB", "RGBA", "LA"):
        return np.array(img, dtype=np.uint8, copy=True)
    return np.array(img.convert("RGB"), dtype=np.uint8, copy=True)


def _decode_with_pillow(view: bytes | memoryview, image_format: int, path: str | None, *,
                        simplejpeg_error: BaseException | None = None,
                        max_pixels: int = DEFAULT_MAX_PIXELS, to_array: "Any" = None) -> np.ndarray:
    format_name = ImageFormat.NAMES[image_format].upper()
    factory = plugin_factory(image_format)
    if factory is None:
        raise DecodeError(f"this Pillow build has no {format_name} plugin; install a Pillow "
                          f"built with {format_name} support", path=path)
    def failure(exc: BaseException) -> DecodeError:
        detail = f"{type(exc).__name__}: {exc}"
        if simplejpeg_error is not None:
            detail = (f"simplejpeg: {type(simplejpeg_error).__name__}: {simplejpeg_error}; "
                      f"Pillow: {detail}")
        return DecodeError(f"cannot decode the bytes as {format_name}: {detail}", path=path)

    try:
        img = open_with_plugin(view, image_format, factory, max_pixels)
    except Exception as exc:  # noqa: BLE001 - hostile bytes can make Pillow raise anything
        raise failure(exc) from exc
    _check_pixels(img.width, img.height, max_pixels, path)  # before load() allocates the pixels
    try:
        try:
            img.load()  # first frame only: Pillow opens animated and multi-page files at frame 0
        except Image.DecompressionBombError:  # a plugin's own global check (TIFF tiles)
            with pillow_limit_raised(max_pixels):
                img.load()
        return (to_array or _to_rgb)(img)
    except Exception as exc:  # noqa: BLE001 - hostile bytes can make Pillow raise anything
        raise failure(exc) from exc


def _to_rgb(img: Image.Image) -> np.ndarray:
    """Apply the per-mode rule of the module docstring to a loaded Pillow image."""
    mode = img.mode
    if mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif mode == "PA":
        img = img.convert("RGBA")
    elif mode == "1":
        img = img.convert("L")
    mode = img.mode

    if mode == "RGB":
        # np.asarray over Pillow's bytes is read-only; np.array copies it into a writable array.
        return np.array(img, dtype=np.uint8, copy=True)
    if mode in _ALPHA_RGB_MODES:
        return np.ascontiguousarray(np.asarray(img)[:, :, :3])
    if mode == "L":
        return _gray_to_rgb(np.asarray(img))
    if mode in _ALPHA_GRAY_MODES:
        return _gray_to_rgb(np.asarray(img)[:, :, 0])
    if mode.startswith("I;16"):
        return _gray_to_rgb((np.asarray(img) >> 8).astype(np.uint8))
    if mode == "I":
        return _gray_to_rgb((np.clip(np.asarray(img), 0, 65535) >> 8).astype(np.uint8))
    if mode == "F":
        values = np.nan_to_num(np.asarray(img), nan=0.0, posinf=255.0, neginf=0.0)
        return _gray_to_rgb(np.clip(np.rint(values), 0, 255).astype(np.uint8))
    return np.array(img.convert("RGB"), dtype=np.uint8, copy=True)


def _gray_to_rgb(gray: np.ndarray) -> np.ndarray:
    rgb = np.empty(gray.shape + (3,), dtype=np.uint8)
    rgb[...] = gray[:, :, None]
    return rgb
