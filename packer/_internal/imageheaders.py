"""Image headers read straight from the bytes: what Pillow's own plugin would say, without Pillow.

``probe_image`` (``imageinfo``) runs once per source file; Pillow's plugins cost ~100 µs a file
to say a JPEG's size and mode (a file object, an image object, every segment handler, the EXIF
parse), more than reading its 100 KB. ``parse_header`` walks the same bytes the plugin reads, in
the same order, with the same rules, for the common cases of JPEG, PNG, GIF, BMP and WEBP, and
returns what the plugin's image would have (format, size, mode, and for a BMP its pixel-array
tile), or **None whenever it is not sure** Pillow would agree: then ``probe_image`` asks Pillow,
as before. So it may only ever say less than Pillow, never something else; a differential test
(``tests/images/test_image_headers.py``) compares it with Pillow on every format the tests
generate and on truncated and mutated headers.

What each parser leaves to Pillow (returns None for): a plugin setting changed from its default
(``LOAD_TRUNCATED_IMAGES``, GIF's ``LOADING_STRATEGY``, BMP's ``USE_RAW_ALPHA``); anything the
plugin would raise on (a short segment, a bad checksum, an unknown marker: Pillow then says why);

* JPEG: EXIF without a JFIF density (the plugin then parses the EXIF for its DPI), an MPF
  segment (an MPO), a Photoshop segment, ICC segments shorter than their header, no SOF or SOS;
* PNG: text, ICC, EXIF and APNG chunks (decompression, memory limits), IEND before IDAT;
* GIF: a first frame larger than the screen or disposing to the background or previous frame;
* BMP: anything but an uncompressed 1/4/8/24-bit image with a 40, 108 or 124-byte info header;
* WEBP: anything but one ``VP8 `` or ``VP8L`` chunk filling the RIFF exactly (libwebp's demuxer
  checks more of an extended file than is worth copying here).
"""

from __future__ import annotations

import sys
import zlib
from dataclasses import dataclass
from typing import Any, Union

from ..format import ImageFormat

__all__ = ["Header", "parse_header", "MODE_CHANNELS"]

BytesLike = Union[bytes, bytearray, memoryview]

#: Bands of the modes these parsers return (``imageinfo`` asks Pillow about any other mode).
MODE_CHANNELS = {"1": 1, "L": 1, "P": 1, "I;16": 1, "LA": 2, "RGB": 3, "RGBA": 4, "CMYK": 4}


@dataclass(frozen=True, slots=True)
class Header:
    """What the plugin's image object would hold after ``open``: the attributes ``imageinfo`` reads.

    Attributes:
        format: Pillow's format name (``"JPEG"``, ``"PNG"``, ...).
        size: ``(width, height)``.
        mode: the Pillow mode.
        tile: the BMP plugin's tile list (``_bmp_problem`` checks the pixel array fits); empty otherwise.
    """

    format: str
    size: tuple[int, int]
    mode: str
    tile: tuple[Any, ...] = ()


def _plugin_setting(module: str, name: str, default: object) -> object:
    # A plugin module not imported yet still has its default: nobody can have changed it.
    loaded = sys.modules.get(module)
    return getattr(loaded, name, default) if loaded is not None else default


def parse_header(view: BytesLike, image_format: int) -> Header | None:
    """The header of ``view`` as Pillow's plugin for ``image_format`` would read it, or None.

    Args:
        view: the whole file (bytes, or a flat unsigned-byte memoryview).
        image_format: what ``imageinfo.detect_format`` said.

    Returns:
        A ``Header``, or None when Pillow must be asked (see the module docstring).
    """
    if _plugin_setting("PIL.ImageFile", "LOAD_TRUNCATED_IMAGES", False):
        return None
    parse = _PARSERS.get(image_format)
    if parse is None:
        return None
    try:
        return parse(view)
    except (IndexError, ValueError):  # a read past the end the checks missed: let Pillow say
        return None


# --- JPEG ---------------------------------------------------------------------------------------
# JpegImagePlugin reads marker by marker up to the start of scan; every marker from C0 to FE has
# an entry in its table (with a handler or none), FF FF is padding, FF 00 skipped, any other
# FF xx is "no marker found".

_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF, 0xDE})
_JPEG_SKIP = frozenset({0xC4, 0xCC, 0xDA, 0xDC, 0xDD, 0xDF})  # read the length, skip the body
_JPEG_MODES = {1: "L", 3: "RGB", 4: "CMYK"}


def _jpeg(v: BytesLike) -> Header | None:
    n = len(v)
    pos = 3
    byte = 0xFF
    size: tuple[int, int] | None = None
    mode = ""
    exif = dpi = False
    short_icc = False
    while True:
        if byte != 0xFF:  # junk between markers: skipped a byte at a time
            if pos >= n:
                return None
            byte = v[pos]
            pos += 1
            continue
        if pos >= n:
            return None  # ended before the start of scan
        marker = v[pos]
        pos += 1
        if marker < 0xC0:
            if marker != 0x00:
                return None  # "no marker found"
            if pos >= n:
                return None
            byte = v[pos]
            pos += 1
            continue
        if marker == 0xFF:
            continue  # padding: FF FF reads as another FF
        if (0xD0 <= marker <= 0xD9) or marker == 0xC8 or 0xF0 <= marker <= 0xFD:
            pass  # no handler, no length
        else:
            if pos + 2 > n:
                return None
            body = ((v[pos] << 8) | v[pos + 1]) - 2
            start = pos + 2
            end = start + (body if body > 0 else 0)
            if end > n:
                return None  # "Truncated File Read"
            pos = end
            if marker == 0xDA:
                break
            if marker in _JPEG_SOF:
                if body < 6 or v[start] != 8 or (body - 6) % 3:
                    return None
                layers = v[start + 5]
                mode = _JPEG_MODES.get(layers, "")
                if not mode or short_icc:
                    return None
                size = ((v[start + 3] << 8) | v[start + 4], (v[start + 1] << 8) | v[start + 2])
            elif marker == 0xDB:
                if not _dqt_ok(v, start, end):
                    return None
            elif 0xE0 <= marker <= 0xEF:
                head = bytes(v[start:start + min(body, 29)]) if body > 0 else b""
                if marker == 0xE0 and head.startswith(b"JFIF"):
                    if body < 7:
                        return None
                    if body >= 12 and v[start + 7] in (1, 2):
                        dpi = True
                elif marker == 0xE1 and head.startswith(b"Exif\0\0"):
                    exif = True
                elif marker == 0xE2 and head.startswith(b"MPF\0"):
                    return None
                elif marker == 0xE2 and head.startswith(b"ICC_PROFILE\0"):
                    short_icc = short_icc or body < 14
                elif marker == 0xED and head.startswith(b"Photoshop 3.0\0"):
                    return None
                elif marker == 0xEE and head.startswith(b"Adobe") and body < 7:
                    return None
            elif marker not in _JPEG_SKIP and marker != 0xFE:
                return None  # a marker this parser does not know (none are left: a safety net)
        if pos >= n:
            return None
        byte = v[pos]
        pos += 1
    if exif and not dpi:
        return None  # the plugin reads the DPI from the EXIF: its parse is Pillow's to run
    if size is None or size[0] <= 0 or size[1] <= 0:
        return None
    return Header("JPEG", size, mode)


def _dqt_ok(v: BytesLike, start: int, end: int) -> bool:
    """The DQT handler's walk: each table needs 65 bytes (8-bit) or 129 (16-bit) after its byte."""
    while start < end:
        length = 65 if v[start] < 16 else 129
        if end - start < length:
            return False
        start += length
    return True


# --- PNG ----------------------------------------------------------------------------------------

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG_MODES = {(1, 0): "1", (2, 0): "L", (4, 0): "L", (8, 0): "L", (16, 0): "I;16", (8, 2): "RGB", (16, 2): "RGB",
              (1, 3): "P", (2, 3): "P", (4, 3): "P", (8, 3): "P", (8, 4): "LA", (16, 4): "RGBA", (8, 6): "RGBA",
              (16, 6): "RGBA"}
# Chunks whose handler can only fail on a short body (the minimum length), and those this parser
# leaves to Pillow (decompression, text memory limits, APNG state). Any other chunk is skipped
# by the plugin after its checksum.
_PNG_MIN = {b"gAMA": 4, b"cHRM": 32, b"sRGB": 1, b"pHYs": 9, b"PLTE": 0}
_PNG_PILLOW = frozenset({b"iCCP", b"tEXt", b"zTXt", b"iTXt", b"eXIf", b"acTL", b"fcTL", b"fdAT", b"IEND"})
_PNG_CID = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_"  # what the plugin's \\w matches


def _png(v: BytesLike) -> Header | None:
    n = len(v)
    if n < 8 or v[:8] != _PNG_MAGIC:
        return None
    pos = 8
    size = (0, 0)
    mode = ""
    while True:
        if pos + 8 > n:
            return None
        length = int.from_bytes(v[pos:pos + 4], "big")
        cid = bytes(v[pos + 4:pos + 8])
        if cid.translate(None, _PNG_CID):
            return None  # "broken PNG file": a byte that is not a word character
        start = pos + 8
        if cid == b"IDAT":
            break
        if cid in _PNG_PILLOW:
            return None
        end = start + length
        if end + 4 > n:
            return None  # the body or its checksum runs past the end
        if cid == b"IHDR":
            if length < 13 or v[start + 11]:
                return None
            size = (int.from_bytes(v[start:start + 4], "big"), int.from_bytes(v[start + 4:start + 8], "big"))
            mode = _PNG_MODES.get((v[start + 8], v[start + 9]), mode)
        elif cid == b"tRNS":
            if mode in ("1", "L", "I;16", "RGB") and length < (6 if mode == "RGB" else 2):
                return None
        elif length < _PNG_MIN.get(cid, 0):
            return None
        if zlib.crc32(v[start:end], zlib.crc32(cid)) != int.from_bytes(v[end:end + 4], "big"):
            return None
        pos = end + 4
    if not mode or size[0] <= 0 or size[1] <= 0:
        return None
    return Header("PNG", size, mode)


# --- GIF ----------------------------------------------------------------------------------------

def _palette_needed(p: BytesLike) -> bool:
    return any(not (i // 3 == p[i] == p[i + 1] == p[i + 2]) for i in range(0, len(p), 3))


def _gif(v: BytesLike) -> Header | None:
    if _plugin_setting("PIL.GifImagePlugin", "LOADING_STRATEGY", 0) == 2:
        return None  # RGB_ALWAYS: the first frame is RGB(A), not P
    n = len(v)
    if n < 13 or bytes(v[:6]) not in (b"GIF87a", b"GIF89a"):
        return None
    width, height = v[6] | (v[7] << 8), v[8] | (v[9] << 8)
    flags = v[10]
    pos = 13
    global_palette = False
    if flags & 128:
        count = 3 << ((flags & 7) + 1)
        if pos + count > n:
            return None
        global_palette = _palette_needed(v[pos:pos + count])
        pos += count
    if pos >= n or v[pos] == 0x3B:
        return None  # no frame
    disposal = 0
    while True:
        if pos >= n:
            return None
        block = v[pos]
        pos += 1
        if block == 0x3B:
            return None  # trailer before an image: "image not found"
        if block == 0x21:
            if pos >= n:
                return None
            label = v[pos]
            pos += 1
            if pos >= n:
                return None
            length = v[pos]
            if length == 0 or pos + 1 + length > n:
                return None  # an empty first sub-block: the plugin then reads on past the terminator
            if label == 0xF9:
                if length < 3:
                    return None
                gce = v[pos + 1]
                if gce & 1 and length < 4:
                    return None
                disposal = (gce & 0x1C) >> 2 or disposal
            elif label == 0xFF and length >= 11 and v[pos + 1:pos + 12] == b"NETSCAPE2.0":
                after = pos + 1 + length
                if after >= n or v[after] == 0:
                    return None  # the same over-read after an empty loop block
            pos = gif_skip_sub_blocks(v, pos)
            if pos < 0:
                return None
        elif block == 0x2C:
            if pos + 9 > n:
                return None
            x0, y0 = v[pos] | (v[pos + 1] << 8), v[pos + 2] | (v[pos + 3] << 8)
            x1, y1 = x0 + (v[pos + 4] | (v[pos + 5] << 8)), y0 + (v[pos + 6] | (v[pos + 7] << 8))
            if x1 > width or y1 > height or disposal >= 2:
                return None
            local = v[pos + 8]
            pos += 9
            palette = global_palette
            if local & 128:
                count = 3 << ((local & 7) + 1)
                if pos + count >= n:  # the palette, then the LZW code size byte
                    return None
                palette = _palette_needed(v[pos:pos + count])
            elif pos >= n:
                return None
            break
        # any other byte between blocks is skipped, as the plugin does
    if width <= 0 or height <= 0:
        return None
    return Header("GIF", (width, height), "P" if palette else "L")


def gif_skip_sub_blocks(v: BytesLike, pos: int) -> int:
    """Offset after the GIF data sub-blocks starting at ``pos`` (their terminator included); -1 if
    cut. ``imageinfo``'s GIF walk uses it too."""
    n = len(v)
    while pos < n:
        length = v[pos]
        pos += 1
        if length == 0:
            return pos
        pos += length
        if pos > n:
            return -1
    return -1


# --- BMP ----------------------------------------------------------------------------------------

def _bmp(v: BytesLike) -> Header | None:
    n = len(v)
    if n < 18 or v[0] != 0x42 or v[1] != 0x4D:
        return None
    offset = int.from_bytes(v[10:14], "little")
    header_size = int.from_bytes(v[14:18], "little")
    if header_size not in (40, 108, 124) or 14 + header_size > n:
        return None
    h = 18  # the info header after its size field
    y_flip = v[h + 7] == 0xFF
    width = int.from_bytes(v[h:h + 4], "little")
    height = int.from_bytes(v[h + 4:h + 8], "little")
    if y_flip:
        height = 2 ** 32 - height
    bits = v[h + 10] | (v[h + 11] << 8)
    compression = int.from_bytes(v[h + 12:h + 16], "little")
    colors = int.from_bytes(v[h + 28:h + 32], "little") or (1 << bits if bits < 64 else 0)
    if compression != 0 or bits not in (1, 4, 8, 24):
        return None
    after_header = 14 + header_size
    tell = after_header
    if bits == 24:
        mode, raw_mode = "RGB", "BGR"
    else:
        if offset == after_header:
            offset += 4 * colors
        if not 0 < colors <= 65536:
            return None
        palette = v[after_header:after_header + 4 * colors]
        tell += len(palette)
        indices = (0, 255) if colors == 2 else range(colors)
        grayscale = all(palette[k * 4:k * 4 + 3] == bytes((value,)) * 3 for k, value in enumerate(indices))
        if grayscale:
            mode = raw_mode = "1" if colors <= 2 else "L"
        else:
            mode, raw_mode = "P", ("P;1" if bits == 1 else "P;4" if bits == 4 else "P")
    if width <= 0 or height <= 0:
        return None
    stride = ((width * bits + 31) >> 3) & ~3
    tile = (("raw", (0, 0, width, height), offset or tell, (raw_mode, stride, 1 if y_flip else -1)),)
    return Header("BMP", (width, height), mode, tile)


# --- WEBP ---------------------------------------------------------------------------------------

def _webp(v: BytesLike) -> Header | None:
    n = len(v)
    if n < 30 or int.from_bytes(v[4:8], "little") + 8 != n:
        return None
    chunk = bytes(v[12:16])
    length = int.from_bytes(v[16:20], "little")
    if 20 + length + (length & 1) != n:
        return None  # more than one chunk (or a cut one): libwebp's demuxer decides
    if chunk == b"VP8 ":
        # libwebp's VP8GetInfo: a shown key frame of a known profile, its start code, a size
        bits = v[20] | (v[21] << 8) | (v[22] << 16)
        if bits & 1 or (bits >> 1) & 7 > 3 or not (bits >> 4) & 1 or bits >> 5 >= length:
            return None
        if v[23] != 0x9D or v[24] != 0x01 or v[25] != 0x2A:
            return None
        width, height = (v[26] | (v[27] << 8)) & 0x3FFF, (v[28] | (v[29] << 8)) & 0x3FFF
        mode = "RGB"
    elif chunk == b"VP8L":
        # libwebp's VP8LGetInfo: the signature byte, then 14+14 bits of size, alpha, version 0
        if length < 5 or v[20] != 0x2F:
            return None
        bits = int.from_bytes(v[21:25], "little")
        if bits >> 29:
            return None
        width, height = (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        mode = "RGBA" if (bits >> 28) & 1 else "RGB"
    else:
        return None
    if width <= 0 or height <= 0:
        return None
    return Header("WEBP", (width, height), mode)


_PARSERS = {ImageFormat.JPEG: _jpeg, ImageFormat.PNG: _png, ImageFormat.GIF: _gif, ImageFormat.BMP: _bmp,
            ImageFormat.WEBP: _webp}
