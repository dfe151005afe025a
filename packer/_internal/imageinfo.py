"""Checks one source file's bytes while packing: format, size, channels, truncation, pixel limit.

``probe_image`` is called once per source file, so its default ``validate="header"`` mode never
decodes pixels. It reads the header with Pillow (the format's own plugin, picked from the magic
bytes), then runs cheap structural checks that catch files cut short by an interrupted copy or
download:

* JPEG: an end-of-image marker (``FF D9``) in the last 64 bytes. Files with more bytes after a
  real end-of-image marker (phone "motion photos" append a video there) are accepted too: the
  marker is then looked for after the start of the first scan.
* PNG: an ``IEND`` chunk in the last 64 bytes, or else reachable by walking the chunk lengths.
* GIF: the block structure, walked to its ``0x3B`` trailer (bytes after the trailer are allowed).
* WEBP: the RIFF size field must not exceed the file.
* BMP (uncompressed): the pixel array must fit in the file.
* TIFF: every strip and tile of the first image must fit in the file.

A file that starts with a supported signature but whose header Pillow cannot parse is
``truncated`` when one of these checks (or Pillow) says it ends early, else ``decode-failed``.
A file with no core signature goes to Pillow's own identification: any other format Pillow
opens and decodes is accepted and checked by ``packer._internal.pillowformats`` (which decodes it), one
it identifies but cannot decode is ``unsupported-format``, and anything else ``not-an-image``.

``validate="full"`` also decodes the first frame with Pillow: a full decode per file, so it is
opt-in. A header giving a zero width or height is ``not-an-image``.

A problem is reported as ``RejectedImageError`` whose ``reason`` is one of ``empty-file``,
``not-an-image``, ``unsupported-format``, ``truncated``, ``decode-failed``, ``too-many-pixels``.

Every header field these checks read is checked for type, count, range and overflow before it is
used (a TIFF StripByteCounts stored as a DOUBLE NaN, a RATIONAL or ASCII text is
``decode-failed``, never a ``ValueError``). As a second line of defence, any exception Pillow or a
check raises for hostile bytes becomes a per-file ``RejectedImageError``: for any input,
``probe_image`` returns an ``ImageInfo`` or raises ``RejectedImageError``, nothing else
(tests/images/test_header_fuzzing.py mutates every header field of every format to hold this).

Pillow's global decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``) does not decide:
plugins are called directly, and ``max_pixels`` is the only pixel limit. The few plugins that
apply the global limit themselves (WEBP, MPO, TIFF tiles) are retried, when they refuse an image
that ``max_pixels`` allows, with the global limit raised under a lock for that one call. Full decoding
honours ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES`` as the process has set it (``False`` unless
something changed it); the structural checks above run either way.
"""

from __future__ import annotations

import io
import re
import struct
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Union

from PIL import Image, ImageMode

from ..errors import OptionError, RejectedImageError
from ..format import ImageFormat
from .imageheaders import MODE_CHANNELS, gif_skip_sub_blocks, parse_header
from .pillowformats import CORE_FORMATS, accept_pillow_format

__all__ = ["ImageInfo", "DEFAULT_MAX_PIXELS", "VALIDATE_MODES", "probe_image",
           "detect_format", "byte_view", "open_with_plugin", "plugin_factory", "pillow_limit_raised"]

#: Default pixel limit (width * height): a 150-megapixel photo passes, a decompression bomb not.
DEFAULT_MAX_PIXELS = 150_000_000
#: Accepted values of ``probe_image(validate=...)``.
VALIDATE_MODES = ("header", "full")

#: Anything with the buffer protocol: bytes, bytearray, memoryview, a 1-D numpy uint8 array.
BytesLike = Union[bytes, bytearray, memoryview]

# ImageFormat value -> name of the Pillow plugin that opens it.
_PIL_PLUGIN = {
    ImageFormat.JPEG: "JPEG",
    ImageFormat.PNG: "PNG",
    ImageFormat.WEBP: "WEBP",
    ImageFormat.GIF: "GIF",
    ImageFormat.BMP: "BMP",
    ImageFormat.TIFF: "TIFF",
}
_SUPPORTED_TEXT = "JPEG, PNG, WEBP, GIF, BMP and TIFF"
_EXPECTED_TEXT = "a JPEG, PNG, WEBP, GIF, BMP or TIFF image"
_TIFF_MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF
# Sizes of the BMP info headers Pillow reads (core, OS/2 v2 short and long, v1..v5); checking
# them keeps a text file that happens to start with "BM" from being called a BMP.
_BMP_HEADER_SIZES = frozenset({12, 16, 40, 52, 56, 64, 108, 124})
# What Pillow's ImageFile raises when a plugin parsed a header with a zero size or no mode.
_NO_SIZE_OR_MODE = "not identified by this driver"
_NOT_FF = re.compile(rb"[^\xff]")
_GIF_BLOCK = re.compile(rb"[\x21\x2c\x3b]")
# How far from the end of the file an end marker may sit (padding or junk after it is common).
_TAIL = 64


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What the header of an accepted image says.

    Attributes:
        image_format: an ``ImageFormat`` value (JPEG=1, PNG=2, WEBP=3, GIF=4, BMP=5, TIFF=6).
        width: width in pixels of the first frame (Pillow's ``size[0]``).
        height: height in pixels.
        channels: bands of the stored mode: L, P, 1, I, I;16, F = 1; LA, PA = 2; RGB,
            YCbCr = 3; RGBA, CMYK = 4.
        mode: the Pillow mode string, e.g. ``"RGB"``, ``"L"``, ``"P"``, ``"I;16"``.
    """

    image_format: int
    width: int
    height: int
    channels: int
    mode: str


def detect_format(data: BytesLike) -> int:
    """Identify an image format from its magic bytes alone (no parsing beyond the signature).

    Args:
        data: the file's bytes (only the first 18 are looked at).

    Returns:
        An ``ImageFormat`` value: JPEG (``FF D8 FF``), PNG (``89 'PNG'``), WEBP (``'RIFF'``,
        4 bytes, ``'WEBP'``), GIF (``'GIF8'``), BMP (``'BM'`` followed by a known info-header
        size at offset 14), TIFF (``'II*\\0'``, ``'MM\\0*'`` or their BigTIFF forms), else
        ``ImageFormat.UNKNOWN``.
    """
    head = bytes(byte_view(data[:18])[:18])
    if head[:3] == b"\xff\xd8\xff":
        return ImageFormat.JPEG
    if head[:4] == b"\x89PNG":
        return ImageFormat.PNG
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return ImageFormat.WEBP
    if head[:4] == b"GIF8":
        return ImageFormat.GIF
    if head[:4] in _TIFF_MAGICS:
        return ImageFormat.TIFF
    if (head[:2] == b"BM" and len(head) >= 18
            and struct.unpack_from("<I", head, 14)[0] in _BMP_HEADER_SIZES):
        return ImageFormat.BMP
    return ImageFormat.UNKNOWN


def probe_image(data: BytesLike, *, name: str = "", validate: str = "header",
                max_pixels: int = DEFAULT_MAX_PIXELS, show_bytes: bool = True) -> ImageInfo:
    """Check one source file's bytes and describe the image, without decoding pixels by default.

    Args:
        data: the whole file, as bytes or any C-contiguous buffer (memoryview, numpy uint8).
        name: the file's name or path, used in error messages only.
        validate: ``"header"`` parses the header and runs the cheap truncation checks described
            in the module docstring; ``"full"`` also decodes the first frame.
        max_pixels: largest accepted ``width * height``.
        show_bytes: whether a ``not-an-image`` message may quote the file's first bytes. The
            build passes False for a file that lies outside the source folder (a symlink to
            ``/etc/passwd``), whose content must not end up in a report.

    Returns:
        The image's format, size, channels and Pillow mode.

    Raises:
        RejectedImageError: the file is not a usable image; ``reason`` says why.
        OptionError: ``validate`` or ``max_pixels`` is not a valid setting.
    """
    if validate not in VALIDATE_MODES:
        raise OptionError(f"validate must be one of {VALIDATE_MODES}, got {validate!r}")
    if max_pixels < 1:
        raise OptionError(f"max_pixels must be at least 1, got {max_pixels}")
    path = name or None
    view = byte_view(data)
    size = len(view)
    if size == 0:
        raise RejectedImageError("empty-file", "the file is empty (0 bytes); expected image data",
                                 path=path)

    image_format = detect_format(view)
    # The common headers are read from the bytes (imageheaders: Pillow's answer, or None to ask
    # Pillow); a full validation decodes with Pillow anyway, so it opens with Pillow.
    img: Any = (parse_header(view, image_format)
                if validate == "header" and (image_format != ImageFormat.WEBP or _webp_plugin()) else None)
    if img is None:
        img = _open_header(view, image_format, path, show_bytes, max_pixels)
    pil_format = img.format or ""
    try:
        return _check_opened(view, img, pil_format, path, validate, max_pixels)
    except RejectedImageError:
        raise
    except _BadField as exc:
        raise RejectedImageError(
            "decode-failed", f"{pil_format or 'image'} header field {exc}", path=path) from None
    except Exception as exc:  # noqa: BLE001 - the last line of defence for hostile headers
        # A check or a Pillow accessor tripped over a field nobody validated: one bad file is a
        # per-file rejection, never an exception that aborts the build.
        raise RejectedImageError(
            "decode-failed", f"{pil_format or 'image'} header cannot be checked: "
            f"{_describe(exc)}", path=path) from None


class _BadField(Exception):
    """A header field with the wrong type, count or range; the text names it and what was found."""


def _check_opened(view: bytes | memoryview, img: Image.Image, pil_format: str, path: str | None,
                  validate: str, max_pixels: int) -> ImageInfo:
    """The checks after Pillow parsed the header (split out so every failure maps to a reason)."""
    # Trust what Pillow parsed over the magic-byte guess (an unusual BMP header, say).
    image_format = ImageFormat.BY_PIL_NAME.get(pil_format, ImageFormat.UNKNOWN)
    if image_format not in CORE_FORMATS:  # any other format Pillow decodes: packer/_internal/pillowformats.py
        image_format = accept_pillow_format(img, view, path=path, max_pixels=max_pixels)

    width, height = img.size
    if type(width) is not int or type(height) is not int:  # noqa: E721 - bool/float are wrong
        raise _BadField(f"size: expected integer width and height, got {width!r} x {height!r}")
    if width <= 0 or height <= 0:
        raise RejectedImageError(
            "not-an-image",
            f"{pil_format} header gives a size of {width}x{height}; expected at least 1x1 pixels",
            path=path)
    if width * height > max_pixels:
        raise RejectedImageError(
            "too-many-pixels",
            f"image is {width}x{height} = {width * height} pixels; the limit (max_pixels) is "
            f"{max_pixels}", path=path)

    problem = _truncation_problem(view, image_format, img)
    if problem is not None:
        raise RejectedImageError("truncated", problem, path=path)

    if validate == "full":
        _decode_fully(img, pil_format, path, max_pixels)

    mode = img.mode
    if not isinstance(mode, str):
        raise _BadField(f"mode: expected a Pillow mode name, got {mode!r}")
    return ImageInfo(image_format=image_format, width=width, height=height,
                     channels=_mode_channels(mode), mode=mode)


# --- opening ------------------------------------------------------------------------------

def byte_view(data: BytesLike) -> bytes | memoryview:
    """``data`` as bytes or a flat unsigned-byte memoryview, copying only if non-contiguous."""
    if isinstance(data, bytes):
        return data
    view = memoryview(data)
    if view.c_contiguous:
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    return view.tobytes()


def plugin_factory(image_format: int) -> Callable[..., Any] | None:
    """Pillow's opener for ``image_format``, or None if this Pillow build lacks the plugin."""
    plugin = _PIL_PLUGIN.get(image_format)
    if plugin is None:
        return None
    if plugin not in Image.OPEN:
        Image.init()  # loads the plugins Image.open would load on demand (WEBP, TIFF, ...)
    entry = Image.OPEN.get(plugin)
    return None if entry is None else entry[0]


def open_with_plugin(view: bytes | memoryview, image_format: int,
                      factory: Callable[..., Any], max_pixels: int | None = None) -> Image.Image:
    """Open ``view`` with the Pillow plugin ``factory``; Pillow's exceptions propagate.

    The plugin is called directly rather than through ``Image.open`` because ``Image.open``
    applies Pillow's process-wide decompression-bomb limit: it warns above 89 Mpx and refuses
    above 179 Mpx whatever limit the caller chose. The caller enforces its own limit instead.
    A few plugins (WEBP at open, MPO, TIFF tiles at load) apply that global limit themselves:
    when they refuse an image and ``max_pixels`` is given, the open is retried once with the
    global limit raised to ``max_pixels`` (``pillow_limit_raised``), so the caller's limit is
    the one that decides, for every format alike.
    """
    try:
        return _call_plugin(view, image_format, factory)
    except Image.DecompressionBombError:
        if max_pixels is None:
            raise
        with pillow_limit_raised(max_pixels):
            return _call_plugin(view, image_format, factory)


def _call_plugin(view: bytes | memoryview, image_format: int, factory: Callable[..., Any]) -> Image.Image:
    stream = io.BytesIO(view)
    if image_format != ImageFormat.GIF:
        return factory(stream, "")
    # The GIF plugin checks frame sizes against the global limit itself while it reads.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return factory(stream, "")


_PILLOW_LIMIT_LOCK = threading.Lock()


@contextmanager
def pillow_limit_raised(max_pixels: int) -> Iterator[None]:
    """Pillow's global ``MAX_IMAGE_PIXELS`` raised to ``max_pixels`` (never lowered) meanwhile.

    Only used to retry an image that Pillow's own plugin refused although the caller's limit
    allows it (rare: over 179 Mpx by default). Held under a lock and restored afterwards; the
    caller has already checked the image's size against ``max_pixels`` or checks it next.
    """
    with _PILLOW_LIMIT_LOCK:
        saved = Image.MAX_IMAGE_PIXELS
        if saved is not None and saved < max_pixels:
            Image.MAX_IMAGE_PIXELS = max_pixels
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                yield
        finally:
            Image.MAX_IMAGE_PIXELS = saved


def _open_header(view: bytes | memoryview, image_format: int, path: str | None,
                 show_bytes: bool = True, max_pixels: int | None = None) -> Image.Image:
    """Parse the header, mapping every failure to a ``RejectedImageError``."""
    factory = plugin_factory(image_format)
    if factory is not None:
        format_name = ImageFormat.NAMES[image_format].upper()
        try:
            return open_with_plugin(view, image_format, factory, max_pixels)
        except Image.DecompressionBombError as exc:
            raise RejectedImageError("too-many-pixels", f"Pillow refused the image: {exc}",
                                     path=path) from exc
        except Exception as exc:  # noqa: BLE001 - hostile bytes can make a plugin raise anything
            # The signature matched, so the file claims to be this format: say whether it was
            # cut short or is damaged, rather than "not an image".
            try:
                problem = _truncation_problem(view, image_format, None)
            except Exception:  # noqa: BLE001 - a damaged header may defeat the check too
                problem = None
            if problem is None and _says_truncated(exc):
                problem = (f"{format_name} header ends early: {_describe(exc)}; the file "
                           f"({len(view)} bytes) is truncated")
            if problem is not None:
                raise RejectedImageError("truncated", problem, path=path) from exc
            if str(exc) == _NO_SIZE_OR_MODE:
                raise RejectedImageError(
                    "not-an-image", f"{format_name} header gives a zero width or height (or no "
                    f"pixel mode); expected at least 1x1 pixels", path=path) from exc
            raise RejectedImageError(
                "decode-failed",
                f"starts with the {format_name} signature but its header cannot be parsed: "
                f"{_describe(exc)}", path=path) from exc

    # No supported signature: let Pillow try every plugin, to tell "some other image format"
    # from "not an image at all". Only rejected files get here, so the slower path is fine.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(view))
    except Image.DecompressionBombError as exc:
        raise RejectedImageError("too-many-pixels", f"Pillow refused the image: {exc}",
                                 path=path) from exc
    except Exception as exc:  # noqa: BLE001 - UnidentifiedImageError, or a plugin's own error
        raise RejectedImageError(
            "not-an-image",
            f"expected {_EXPECTED_TEXT}, found {_sniff(view, show_bytes)}", path=path) from exc


def _decode_fully(img: Image.Image, pil_format: str, path: str | None, max_pixels: int) -> None:
    """Decode the first frame, mapping failures to ``truncated`` or ``decode-failed``."""
    try:
        try:
            img.load()
        except Image.DecompressionBombError:  # a plugin's own global check (TIFF tiles)
            with pillow_limit_raised(max_pixels):
                img.load()
    except Image.DecompressionBombError as exc:
        raise RejectedImageError("too-many-pixels", f"Pillow refused the image: {exc}",
                                 path=path) from exc
    except Exception as exc:  # noqa: BLE001 - decoders raise OSError, ValueError, SyntaxError...
        text = _describe(exc)
        if _says_truncated(exc):
            raise RejectedImageError(
                "truncated", f"{pil_format} pixel data ends early while decoding: {text}",
                path=path) from exc
        raise RejectedImageError(
            "decode-failed", f"{pil_format} header is valid but decoding the pixels failed: "
            f"{text}", path=path) from exc


def _webp_plugin() -> bool:
    """Whether this Pillow opens WEBP (built with libwebp): only then may its header be read here."""
    global _WEBP_PLUGIN
    if _WEBP_PLUGIN is None:
        _WEBP_PLUGIN = plugin_factory(ImageFormat.WEBP) is not None
    return _WEBP_PLUGIN


_WEBP_PLUGIN: bool | None = None


def _mode_channels(mode: str) -> int:
    """Number of bands of a Pillow mode; 0 (``unknown`` in the index) for a mode Pillow lacks."""
    known = MODE_CHANNELS.get(mode)
    if known is not None:
        return known
    try:
        return len(ImageMode.getmode(mode).bands)
    except KeyError:
        return 0


def _says_truncated(exc: BaseException) -> bool:
    # Pillow has no exception class for "ran out of data": it raises EOFError, or OSError
    # with "image file is truncated" / "Truncated File Read" in the text.
    return isinstance(exc, EOFError) or "truncated" in str(exc).lower()


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _sniff(view: bytes | memoryview, show_bytes: bool = True) -> str:
    """Say what a non-image file looks like, for the rejection message (its bytes if allowed)."""
    head = bytes(view[:64])
    if head.startswith(b"version https://git-lfs"):
        return "a git-LFS pointer file (the image was never fetched: run `git lfs pull`)"
    stripped = head.lstrip().lower()
    if stripped.startswith((b"<!doctype html", b"<html")):
        return "an HTML page (a failed download?)"
    if not show_bytes:
        return "bytes that are not an image (not quoted: the file lies outside the source folder)"
    return f"bytes starting {head[:16]!r}"


# --- truncation checks ----------------------------------------------------------------------

def _truncation_problem(view: bytes | memoryview, image_format: int,
                        img: Image.Image | None) -> str | None:
    """Return why the file looks cut short, or None. ``img`` is None if the header failed."""
    if image_format == ImageFormat.JPEG:
        return _jpeg_problem(view)
    if image_format == ImageFormat.PNG:
        return _png_problem(view)
    if image_format == ImageFormat.GIF:
        return _gif_problem(view)
    if image_format == ImageFormat.WEBP:
        return _webp_problem(view)
    if img is not None and image_format == ImageFormat.BMP:
        return _bmp_problem(view, img)
    if image_format == ImageFormat.TIFF:
        return _tiff_problem(view, img) if img is not None else _tiff_ifd_problem(view)
    return None


def _jpeg_problem(view: bytes | memoryview) -> str | None:
    if b"\xff\xd9" in bytes(view[-_TAIL:]):
        return None
    # Slow path, for files with data appended after the image. Inside entropy-coded data every
    # FF byte is followed by 00 or a restart marker, so an FF D9 after the first scan starts can
    # only be the image's end-of-image marker. (Searching from the start would find the end of
    # an EXIF thumbnail instead.)
    scan_start = _jpeg_scan_start(view)
    if scan_start is not None and bytes(view[scan_start:]).find(b"\xff\xd9") >= 0:
        return None
    return (f"JPEG has no end-of-image marker (FF D9) in its last {_TAIL} bytes, nor after the "
            f"start of its scan data: the file ({len(view)} bytes) is truncated")


def _jpeg_scan_start(view: bytes | memoryview) -> int | None:
    """Offset just past the first start-of-scan header, walking segment lengths; None if absent."""
    pos, size = 2, len(view)
    while pos + 4 <= size:
        if view[pos] != 0xFF:
            return None
        marker = view[pos + 1]
        if marker == 0xFF:  # fill bytes: skip the whole run at C speed, not one by one
            run = _NOT_FF.search(view, pos + 1)
            pos = (run.start() if run is not None else size) - 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
        else:
            length = (view[pos + 2] << 8) | view[pos + 3]
            pos += 2 + length
            if marker == 0xDA:
                return pos if pos <= size else None
    return None


def _png_problem(view: bytes | memoryview) -> str | None:
    if b"IEND" in bytes(view[-_TAIL:]):
        return None
    # Slow path: walk the chunks, so bytes appended after IEND are told apart from a cut file.
    pos, size = 8, len(view)
    last = "the signature"
    while pos + 8 <= size:
        length = int.from_bytes(view[pos:pos + 4], "big")
        chunk_type = bytes(view[pos + 4:pos + 8])
        if chunk_type == b"IEND":
            return None
        last = f"{chunk_type.decode('latin-1')!r} at offset {pos}"
        pos += 12 + length
    return (f"PNG has no IEND chunk: expected chunks up to IEND, but the file ({size} bytes) "
            f"ends after {last}: the file is truncated")


def _gif_problem(view: bytes | memoryview) -> str | None:
    # GIF has no length field for the whole file, so walk its blocks to the 0x3B trailer. The
    # walk is a Python loop over 255-byte sub-blocks, acceptable for a format this rare.
    size = len(view)
    if size < 13:
        return f"GIF is {size} bytes, shorter than its 13-byte header: the file is truncated"
    pos = 13
    flags = view[10]
    if flags & 0x80:
        pos += 3 << ((flags & 7) + 1)
    frames = 0
    while pos < size:
        block = view[pos]
        if block == 0x3B:
            return None
        if block == 0x21:  # extension: label, then sub-blocks
            pos = gif_skip_sub_blocks(view, pos + 2)
        elif block == 0x2C:  # image descriptor, optional local colour table, LZW data
            if pos + 10 > size:
                break
            flags = view[pos + 9]
            pos += 10
            if flags & 0x80:
                pos += 3 << ((flags & 7) + 1)
            pos = gif_skip_sub_blocks(view, pos + 1)
            frames += 1
        else:  # Pillow skips stray bytes between blocks, so the check does too (at C speed)
            found = _GIF_BLOCK.search(view, pos + 1)
            pos = found.start() if found is not None else size
        if pos < 0:
            break
    return (f"GIF ends without its trailer byte (0x3B) after {frames} complete frame(s): "
            f"expected the block structure to end with 0x3B within the file ({size} bytes): "
            f"the file is truncated")


def _webp_problem(view: bytes | memoryview) -> str | None:
    if len(view) < 12:
        return f"WEBP is {len(view)} bytes, shorter than its 12-byte RIFF header: truncated"
    riff_end = 8 + int.from_bytes(view[4:8], "little")
    if riff_end > len(view):
        return (f"WEBP RIFF header says the file is {riff_end} bytes, found {len(view)}: "
                f"the file is truncated")
    return None


def _bmp_problem(view: bytes | memoryview, img: Image.Image) -> str | None:
    # Only uncompressed BMPs have a pixel array whose size follows from the header; Pillow
    # describes it as one "raw" tile with an explicit row stride.
    tiles = getattr(img, "tile", None) or []
    if len(tiles) != 1 or tiles[0][0] != "raw":
        return None
    _, extents, offset, args = tiles[0]
    stride = args[1] if isinstance(args, tuple) and len(args) > 1 and _is_int(args[1]) else 0
    if stride <= 0:
        return None
    if not _is_int(offset) or offset < 0:
        raise _BadField(f"pixel data offset: expected a non-negative integer, got {offset!r}")
    if (not isinstance(extents, tuple) or len(extents) != 4
            or not all(_is_int(v) for v in extents) or extents[3] < extents[1]):
        raise _BadField(f"pixel array extent: expected 4 ordered integers, got {extents!r}")
    end = offset + stride * (extents[3] - extents[1])
    if end > len(view):
        return (f"BMP pixel array needs {end} bytes ({extents[3] - extents[1]} rows of "
                f"{stride} bytes from offset {offset}), found {len(view)}: the file is truncated")
    return None


# TIFF field types an offset or byte count may have (TIFF 6.0 section 2, BigTIFF's LONG8).
_TIFF_INTEGER_TYPES = {3: "SHORT", 4: "LONG", 16: "LONG8"}
_TIFF_TYPE_NAMES = {1: "BYTE", 2: "ASCII", 3: "SHORT", 4: "LONG", 5: "RATIONAL", 6: "SBYTE",
                    7: "UNDEFINED", 8: "SSHORT", 9: "SLONG", 10: "SRATIONAL", 11: "FLOAT",
                    12: "DOUBLE", 13: "IFD", 16: "LONG8", 17: "SLONG8", 18: "IFD8"}
_TIFF_FIELD_NAMES = {273: "StripOffsets", 279: "StripByteCounts", 324: "TileOffsets",
                     325: "TileByteCounts"}


def _is_int(value: object) -> bool:
    return type(value) is int  # noqa: E721 - bool, float and numpy scalars are not accepted


def _tiff_integers(tags: Any, tag: int) -> tuple[int, ...] | None:
    """The values of an offsets/counts field, checked: integer type, non-negative; None if absent."""
    values = tags.get(tag)
    if values is None:
        return None
    name = _TIFF_FIELD_NAMES[tag]
    field_type = getattr(tags, "tagtype", {}).get(tag)
    if field_type not in _TIFF_INTEGER_TYPES:
        raise _BadField(f"{name}: expected type SHORT, LONG or LONG8, got "
                        f"{_TIFF_TYPE_NAMES.get(field_type, f'type {field_type}')}")
    if not isinstance(values, tuple):
        values = (values,)
    if not values:
        raise _BadField(f"{name}: expected at least one value, got none")
    for value in values:
        if not _is_int(value) or value < 0:
            raise _BadField(f"{name}: expected non-negative integers, got {value!r}")
    return values


def _tiff_problem(view: bytes | memoryview, img: Image.Image) -> str | None:
    tags = getattr(img, "tag_v2", None)
    if tags is None:
        return None
    end = 0
    for offsets_tag, counts_tag in ((273, 279), (324, 325)):  # strips, tiles
        offsets, counts = _tiff_integers(tags, offsets_tag), _tiff_integers(tags, counts_tag)
        if offsets is None or counts is None:
            continue
        if len(offsets) != len(counts):
            raise _BadField(f"{_TIFF_FIELD_NAMES[offsets_tag]}: {len(offsets)} values, but "
                            f"{_TIFF_FIELD_NAMES[counts_tag]} has {len(counts)}; expected one "
                            f"byte count per offset")
        for offset, count in zip(offsets, counts):
            end = max(end, offset + count)
    if end > len(view):
        return (f"TIFF image data extends to byte {end} (strip/tile offsets plus byte counts), "
                f"found {len(view)} bytes: the file is truncated")
    return None


def _tiff_ifd_problem(view: bytes | memoryview) -> str | None:
    """For a TIFF whose header Pillow could not parse: does the first IFD lie past the end?"""
    size = len(view)
    head = bytes(view[:16])
    order = "little" if head[:2] == b"II" else "big"
    big_tiff = int.from_bytes(head[2:4], order) == 43
    offset_end = 16 if big_tiff else 8
    if size < offset_end:
        return (f"TIFF is {size} bytes, shorter than its {offset_end}-byte header: the file is "
                f"truncated")
    ifd = int.from_bytes(head[8:16] if big_tiff else head[4:8], order)
    count_size, entry_size = (8, 20) if big_tiff else (2, 12)
    if ifd + count_size > size:
        return (f"TIFF header points to its first directory at offset {ifd}, but the file has "
                f"{size} bytes: the file is truncated")
    entries = int.from_bytes(view[ifd:ifd + count_size], order)
    ifd_end = ifd + count_size + entries * entry_size
    if ifd_end > size:
        return (f"TIFF directory at offset {ifd} has {entries} entries ending at byte {ifd_end}, "
                f"but the file has {size} bytes: the file is truncated")
    return None
