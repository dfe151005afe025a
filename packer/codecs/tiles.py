"""Tiled JPEGs: decode only the part of a JPEG that a crop needs.

The ``tiled`` codec (``packer build --codec tiled``) stores every baseline JPEG losslessly
rewritten by ``packer.codecs._jpegtiles.transcode``: same DCT coefficients, so every decoder shows
exactly the same pixels, but each *tile* (one MCU, e.g. 16x16 pixels for 4:2:0 chroma, or a few
8-pixel MCUs side by side) is its own restart interval, and APP9 ``PKTILES`` segments list the
entropy-coded length of every tile, right after SOI (formats/SPEC.md, "Tiled JPEG"). A tiled JPEG is an ordinary
JPEG to every other program.

What that buys: JPEG decoding time is mostly Huffman decoding, which is serial over the whole
image: libjpeg-turbo cannot skip the blocks outside a crop. With a byte-aligned restart point at
every tile, ``window_jpeg`` cuts out any rectangle of tiles and writes a small, valid JPEG of just
that window (the header with new dimensions, then the rows' tile bytes with their restart
markers renumbered), which simplejpeg decodes like any other. A random-resized crop covers about
half of the image on average, so about half of the decoding work disappears (numbers in
``packer.transforms``); the pixels inside the crop are identical to a full decode's, because the
window is widened by ``window_margin`` so chroma upsampling sees the same neighbours.

The tile table is a hint, checked before use: ``read_layout`` returns ``None`` (decode the whole
image, as for any JPEG) unless the tables, the frame header, the restart interval and every
restart marker agree with each other and the file ends right after the last tile.

This module is pure Python and numpy: reading tiled datasets needs no compiled code. Writing
them (``transcode``) needs the ``packer.codecs._jpegtiles`` extension, built when packer is installed
with a C compiler.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import MissingDependencyError

__all__ = ["TileLayout", "read_layout", "window_jpeg", "cut_window", "transcode",
           "transcoder_available", "untiled_reason", "TILED_FIX",
           "TILE_SIGNATURE", "WINDOW_MARGIN", "window_margin"]

#: APP9 payloads that start with these 8 bytes are packer tile tables.
TILE_SIGNATURE = b"PKTILES\x00"
TILE_VERSION = 1
_APP9 = 0xE9
_TILED_START = b"\xff\xd8\xff\xe9"  # SOI, then the first APP9 tile table
_HEADER_GUESS = 8192  # bytes copied to parse the header; more when the tables are longer
_TABLE_HEADER = struct.Struct(">8sBBHHI")  # signature, version, reserved, columns, rows, first tile
#: Decoded pixels to keep between a crop and the edge of its window of tiles. Fancy (smooth)
#: chroma upsampling makes each pixel from its own and the adjacent chroma sample; at a window's
#: edge libjpeg-turbo repeats the edge sample instead, so the outermost decoded pixel of a window
#: (that is not the image's edge) can differ from a full decode. One pixel for that, one for
#: rounding the crop box to whole pixels: ``window_margin(m)`` converts to source pixels at a
#: DCT scale of m/8. tests/codecs/test_tiles.py checks every chroma subsampling at every scale, and that
#: without the margin pixels do change.
WINDOW_MARGIN = 2


def window_margin(m: int = 8) -> int:
    """``WINDOW_MARGIN`` decoded pixels in source pixels, for a decode at scale ``m``/8."""
    return -(-WINDOW_MARGIN * 8 // m)
_SEQUENTIAL_SOF = (0xC0, 0xC1)
try:  # the compiled twin of read_layout + window_jpeg, when packer was built with a compiler
    from ._jpegtiles import window as _window
except ImportError:
    _window = None
_OTHER_SOF = frozenset((0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))


@dataclass(frozen=True)
class TileLayout:
    """Where every tile of a tiled JPEG is, from ``read_layout``.

    Attributes:
        width, height: the image size in pixels.
        tile_width, tile_height: a tile's size in pixels (the last column and row may be cut).
        columns, rows: the number of tiles across and down.
        starts: byte offset of each tile's entropy-coded data, row-major (``int64``).
        lengths: byte length of each tile's data, without the marker that follows it.
        prefix: SOI and the header bytes after the tile tables up to the frame's height field.
        suffix: the header bytes after the frame's width field, through SOS.
    """

    width: int
    height: int
    tile_width: int
    tile_height: int
    columns: int
    rows: int
    starts: np.ndarray
    lengths: np.ndarray
    prefix: bytes
    suffix: bytes

    def window(self, left: float, top: float, right: float, bottom: float,
               margin: int = WINDOW_MARGIN) -> tuple[int, int, int, int]:
        """The tiles ``(column0, column1, row0, row1)`` (half-open) covering a pixel box.

        The box is widened by ``margin`` pixels on each side and clipped to the image.
        """
        column0 = max(int(math.floor(left - margin)) // self.tile_width, 0)
        row0 = max(int(math.floor(top - margin)) // self.tile_height, 0)
        column1 = min(-(-int(math.ceil(right + margin)) // self.tile_width), self.columns)
        row1 = min(-(-int(math.ceil(bottom + margin)) // self.tile_height), self.rows)
        return column0, max(column1, column0 + 1), row0, max(row1, row0 + 1)


def read_layout(data: Any) -> TileLayout | None:
    """Parse a tiled JPEG's header and tile tables; ``None`` if ``data`` is not one.

    ``None`` also when anything disagrees (then the file is still a JPEG, decoded whole): the
    tables' size with the frame's, the restart interval with the tile width, the tiles' total
    length with the data, bytes after the last tile other than EOI. (``window_jpeg`` checks the
    restart marker after every tile it uses.) Costs about 25 us for a 500x375 image.
    """
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    size = len(view)
    # [T1] The tables come first, right after SOI: an ordinary JPEG is told apart in a microsecond.
    if size < 14 or view[0:4] != _TILED_START or view[6:14] != TILE_SIGNATURE:
        return None
    full = view
    view = bytes(view[:_HEADER_GUESS])  # single-byte reads below are fastest on bytes
    position, sof, restart_interval, tables = 2, -1, 0, []
    while True:
        if position + 12 > len(view) and len(view) < size:  # the header is longer: read it all
            view = bytes(full)
        if position + 4 > size or view[position] != 0xFF:
            return None
        marker = view[position + 1]
        length = (view[position + 2] << 8) | view[position + 3]
        end = position + 2 + length
        if length < 2 or end > size:
            return None
        if marker in _SEQUENTIAL_SOF:
            if sof >= 0 or length < 8:
                return None
            sof = position
        elif marker in _OTHER_SOF:
            return None
        elif marker == 0xDD and length == 4:
            restart_interval = (view[position + 4] << 8) | view[position + 5]
        elif marker == _APP9 and bytes(view[position + 4:position + 12]) == TILE_SIGNATURE:
            tables.append((position, end))
        elif marker == 0xDA:
            if length < 3:
                return None
            sos, entropy = position, end
            break
        position = end
    if not tables or tables[0][0] != 2 or sof < tables[-1][1] or restart_interval < 1:
        return None
    if len(view) < entropy:
        view = bytes(full[:entropy])
    return _layout(view, full, size, sof, sos, entropy, restart_interval, tables)


def _layout(view: bytes, full: Any, size: int, sof: int, sos: int, entropy: int,
            restart_interval: int, tables: list[tuple[int, int]]) -> TileLayout | None:
    """``view``: the file's bytes up to the entropy-coded data at least; ``full``: all of it."""
    # [T2] every check below: any disagreement and the payload is decoded whole
    height = (view[sof + 5] << 8) | view[sof + 6]
    width = (view[sof + 7] << 8) | view[sof + 8]
    components = view[sof + 9]
    if ((view[sof + 2] << 8) | view[sof + 3]) != 8 + 3 * components:
        return None
    if view[sof + 4] != 8 or width < 1 or height < 1 or not 1 <= components <= 4:
        return None
    if sof + 10 + 3 * components > size or view[sos + 4] != components:
        return None
    factors = [view[sof + 11 + 3 * i] for i in range(components)]
    h_max = max(f >> 4 for f in factors)
    v_max = max(f & 15 for f in factors)
    if components == 1 or min(h_max, v_max) < 1:  # a single-component scan: 8x8 MCUs
        h_max = v_max = 1
    mcu_width, mcu_height = 8 * h_max, 8 * v_max
    mcu_columns = -(-width // mcu_width)
    rows = -(-height // mcu_height)
    if mcu_columns % restart_interval:
        return None
    columns = mcu_columns // restart_interval

    pieces, expected_first = [], 0
    for index, (start, end) in enumerate(tables):
        if index and start != tables[index - 1][1]:
            return None
        if end - start < 4 + _TABLE_HEADER.size or (end - start - 4 - _TABLE_HEADER.size) % 2:
            return None
        _, version, _, table_columns, table_rows, first = _TABLE_HEADER.unpack_from(view, start + 4)
        if (version, table_columns, table_rows, first) != (TILE_VERSION, columns, rows,
                                                           expected_first):
            return None
        piece = np.frombuffer(view, dtype=">u2", count=(end - start - 4 - _TABLE_HEADER.size) // 2,
                              offset=start + 4 + _TABLE_HEADER.size)
        pieces.append(piece)
        expected_first += len(piece)
    if expected_first != columns * rows:
        return None
    lengths = (np.concatenate(pieces) if len(pieces) > 1 else pieces[0]).astype(np.int64)
    # Each tile is followed by a 2-byte marker: RSTn, or EOI after the last one, which must end
    # the file. The markers themselves are checked by window_jpeg, for the tiles it uses.
    ends = np.cumsum(lengths + 2)
    if entropy + int(ends[-1]) != size or full[size - 2] != 0xFF or full[size - 1] != 0xD9:
        return None
    starts = ends - lengths
    starts += entropy - 2
    prefix = b"\xff\xd8" + bytes(view[tables[-1][1]:sof + 5])
    suffix = bytes(view[sof + 9:entropy])
    return TileLayout(width, height, mcu_width * restart_interval, mcu_height, columns, rows,
                      starts, lengths, prefix, suffix)


def window_jpeg(data: Any, layout: TileLayout, column0: int, column1: int, row0: int,
                row1: int) -> tuple[bytearray, int, int]:
    """A valid JPEG of the tiles ``[column0, column1) x [row0, row1)`` of a tiled JPEG.

    Returns:
        ``(jpeg, x, y)``: the new JPEG's bytes and the pixel position of its top-left corner in
        the full image (``column0 * tile_width``, ``row0 * tile_height``).

    Raises:
        ValueError: an empty or out-of-range window, or a tile that is not followed by a restart
            marker (a table that does not match the data).
    """
    if not (0 <= column0 < column1 <= layout.columns and 0 <= row0 < row1 <= layout.rows):
        raise ValueError(f"window columns {column0}..{column1}, rows {row0}..{row1} is not inside "
                         f"{layout.columns}x{layout.rows} tiles")
    x, y = column0 * layout.tile_width, row0 * layout.tile_height
    width = min(column1 * layout.tile_width, layout.width) - x
    height = min(row1 * layout.tile_height, layout.height) - y
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    shape = (layout.rows, layout.columns)
    row_starts = layout.starts.reshape(shape)[row0:row1, column0].tolist()
    used = layout.lengths.reshape(shape)[row0:row1, column0:column1]
    row_ends = (layout.starts.reshape(shape)[row0:row1, column1 - 1] + used[:, -1] + 2).tolist()
    parts = [layout.prefix, struct.pack(">HH", height, width), layout.suffix]
    header_size = len(layout.prefix) + 4 + len(layout.suffix)
    # each row: its tiles' bytes and the 2-byte marker after each (EOI after the image's last)
    parts.extend(view[start:end] for start, end in zip(row_starts, row_ends))
    jpeg = bytearray().join(parts)
    # Restart markers must count 0, 1, ..., 7, 0, ... from the window's first tile; the marker
    # after the window's last tile becomes EOI. Every marker is checked first: a tile table that
    # does not match the data must not produce a wrong image.
    # [T3] Checked: the marker after every tile, and the one before each row's first tile (or
    # the scan's start), so every tile used begins and ends where the table says.
    marker_ends = np.cumsum(used + 2, axis=None)
    marker_ends += header_size - 1
    out = np.frombuffer(jpeg, dtype=np.uint8)
    codes = out[marker_ends]
    source = np.frombuffer(view, dtype=np.uint8)
    inner = np.asarray(row_starts[1:] if row0 == 0 and column0 == 0 else row_starts,
                       dtype=np.int64) - 2
    image_ends = row1 == layout.rows and column1 == layout.columns  # EOI after the last tile
    if not (np.all(out[marker_ends - 1] == 0xFF) and np.all((codes[:-1] & 0xF8) == 0xD0)
            and (codes[-1] == 0xD9 if image_ends else codes[-1] & 0xF8 == 0xD0)
            and np.all(source[inner] == 0xFF) and np.all((source[inner + 1] & 0xF8) == 0xD0)):
        raise ValueError("the tile table does not match the JPEG's restart markers")
    out[marker_ends[:-1]] = 0xD0 + (np.arange(len(marker_ends) - 1, dtype=np.uint8) & 7)
    out[marker_ends[-1]] = 0xD9
    return jpeg, x, y


def cut_window(data: Any, box: tuple[float, float, float, float], margin: int
               ) -> tuple[bytearray, int, int, int, int] | None:
    """The tiles under ``box`` (left, top, right, bottom) widened by ``margin``, as a JPEG.

    Returns:
        ``(jpeg, x, y, width, height)``: the window JPEG, its origin in the image and its size;
        or ``None`` when ``data`` is not a usable tiled JPEG (T1-T3) or the window would be the
        whole image: then decode ``data`` whole.

    Uses the compiled ``packer.codecs._jpegtiles.window`` when it is installed (same checks, same
    bytes, about 10x faster), else ``read_layout`` + ``window_jpeg``.
    """
    if _window is not None:
        return _window(data, *box, margin)
    layout = read_layout(data)
    if layout is None:
        return None
    window = layout.window(*box, margin)
    column0, column1, row0, row1 = window
    if column1 - column0 == layout.columns and row1 - row0 == layout.rows:
        return None
    try:
        jpeg, x, y = window_jpeg(data, layout, *window)
    except ValueError:  # outside the tiles, or the table does not match the data
        return None
    return (jpeg, x, y, min(column1 * layout.tile_width, layout.width) - x,
            min(row1 * layout.tile_height, layout.height) - y)


#: The transcoder's own pixel bound when untiled_reason asks it why (the build's limit was checked before).
_DEFAULT_TRANSCODE_PIXELS = 65535 * 65535


def untiled_reason(data: Any) -> str:
    """Why a JPEG cannot be tiled, from its frame marker: ``progressive``, ``lossless``,
    ``arithmetic``, ``12-bit``; else ``data after the image`` (bytes after EOI, such as an
    MPO's second image, which a rewrite would drop) or ``damaged or multi-scan``. For the build
    summary."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    position, size = 2, len(view)
    while position + 4 <= size and view[position] == 0xFF:
        marker = view[position + 1]
        if marker in (0xC2, 0xC6):
            return "progressive"
        if marker in (0xC3, 0xC7):
            return "lossless"
        if 0xC9 <= marker <= 0xCF and marker != 0xCC:
            return "arithmetic"
        if marker in _SEQUENTIAL_SOF and position + 4 < size and view[position + 4] != 8:
            return f"{view[position + 4]}-bit"
        if marker == 0xDA:
            break
        position += 2 + ((view[position + 2] << 8) | view[position + 3])
    # Not visible in the header: ask the transcoder (only files it kept get here, so rarely).
    try:
        from . import _jpegtiles
        _jpegtiles.transcode(view, _DEFAULT_TRANSCODE_PIXELS)
    except ValueError as exc:
        if "data after the image" in str(exc):
            return "data after the image"
    except ImportError:
        pass
    return "damaged or multi-scan"


#: The advice of every refusal for want of the transcoder.
TILED_FIX = ("install a packer-shards wheel (pip install --force-reinstall --only-binary packer-shards packer-shards), "
             "or reinstall it from source where a C compiler is available")


def transcoder_available() -> bool:
    """Whether the compiled transcoder (``packer.codecs._jpegtiles``) is installed."""
    try:
        from . import _jpegtiles  # noqa: F401
    except ImportError:
        return False
    return True


def transcode(data: Any, *, max_pixels: int) -> bytes:
    """Losslessly rewrite a baseline JPEG as a tiled JPEG (see the module docstring).

    Raises:
        ValueError: the JPEG cannot be tiled; the message starts with ``unsupported:`` (a
            progressive, arithmetic-coded, 12-bit or multi-scan JPEG, ...) or ``corrupt:``.
        MissingDependencyError: the compiled transcoder is not installed.
    """
    try:
        from . import _jpegtiles
    except ImportError:
        raise MissingDependencyError("the tiled codec needs packer's compiled extension packer.codecs._jpegtiles, "
                                     "which was not built when packer was installed (no C compiler?): "
                                     + TILED_FIX) from None
    return _jpegtiles.transcode(data, int(max_pixels))
