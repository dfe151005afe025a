"""Structure-aware fuzzing of every header parser ``probe_image`` uses (issue #13, class 1).

Each format has a builder that serialises a small, valid file from named header fields (lengths
and checksums recomputed unless a test overrides them). The exhaustive tests change one field at a
time to every value in a table of legal, boundary and illegal values for its width (for TIFF: every
entry's field type, count and value, across all TIFF types, with NaN/Inf/huge/negative/ASCII
values); the hypothesis tests change several fields at once to arbitrary values. The contract
checked everywhere: ``probe_image`` returns a sane ``ImageInfo`` or raises ``RejectedImageError``
with a known reason, in both validate modes; never another exception, never a hang.
"""

from __future__ import annotations

import io
import math
import struct
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from helpers import assert_headers_agree_with_pillow
from packer.errors import RejectedImageError
from packer._internal.imageinfo import ImageInfo, probe_image

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

REASONS = {"empty-file", "not-an-image", "unsupported-format", "truncated", "decode-failed",
           "too-many-pixels"}
#: Trials run by this module, printed at the end for scripts/reliability_report.py.
TRIALS: dict[str, int] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_trial_counts() -> Any:
    """Print the trial counts once the module's tests ran, for scripts/reliability_report.py."""
    yield
    import json

    print(f"\nheader fuzzing trials: {json.dumps(dict(sorted(TRIALS.items())), sort_keys=True)}")


def check(data: bytes, label: str) -> None:
    """The contract: an ImageInfo with sane fields, or a RejectedImageError with a known reason;
    and the header parsers (``packer._internal.imageheaders``) say exactly what Pillow alone says."""
    TRIALS[label] = TRIALS.get(label, 0) + 1
    assert_headers_agree_with_pillow(data, name="fuzzed", max_pixels=4_000_000)
    for validate in ("header", "full"):
        try:
            info = probe_image(data, name="fuzzed", validate=validate, max_pixels=4_000_000)
        except RejectedImageError as exc:
            assert exc.reason in REASONS, (label, exc.reason)
            assert exc.message, label
            continue
        assert isinstance(info, ImageInfo)
        assert type(info.width) is int and type(info.height) is int  # noqa: E721
        assert 1 <= info.width * info.height <= 4_000_000
        assert isinstance(info.mode, str) and 0 <= info.channels <= 4


def width_values(width: int, original: int) -> list[int]:
    """Legal, boundary and illegal values of an unsigned field ``width`` bytes wide."""
    top = (1 << (8 * width)) - 1
    values = {0, 1, 2, 3, 7, 8, 16, 255, top, top - 1, top >> 1, (top >> 1) + 1,
              original - 1, original + 1, original * 2, original * 1000}
    return sorted(v for v in values if 0 <= v <= top and v != original)


def single_field_cases(defaults: dict[str, int], widths: dict[str, int]) -> list[tuple[str, int]]:
    return [(name, value) for name in widths for value in width_values(widths[name], defaults[name])]


# --- PNG ------------------------------------------------------------------------------------

PNG_WIDTHS = {"width": 4, "height": 4, "bit_depth": 1, "color_type": 1, "compression": 1,
              "filter": 1, "interlace": 1, "ihdr_length": 4, "ihdr_crc": 4, "idat_length": 4,
              "plte_length": 4, "trns_length": 4, "actl_frames": 4, "actl_plays": 4,
              "fctl_sequence": 4, "fctl_width": 4, "fctl_height": 4, "fctl_x": 4, "fctl_y": 4,
              "fctl_delay_num": 2, "fctl_delay_den": 2, "fctl_dispose": 1, "fctl_blend": 1,
              "phys_unit": 1, "gama": 4, "ztxt_method": 1, "itxt_flag": 1, "iend_length": 4}
PNG_DEFAULTS = {"width": 8, "height": 6, "bit_depth": 8, "color_type": 3, "compression": 0,
                "filter": 0, "interlace": 0, "ihdr_length": 13, "ihdr_crc": -1, "idat_length": -1,
                "plte_length": 12, "trns_length": 4, "actl_frames": 1, "actl_plays": 0,
                "fctl_sequence": 0, "fctl_width": 8, "fctl_height": 6, "fctl_x": 0, "fctl_y": 0,
                "fctl_delay_num": 1, "fctl_delay_den": 10, "fctl_dispose": 0, "fctl_blend": 0,
                "phys_unit": 1, "gama": 45455, "ztxt_method": 0, "itxt_flag": 1,
                "iend_length": 0}


def _chunk(kind: bytes, payload: bytes, length: int = -1, crc: int = -1) -> bytes:
    return (struct.pack(">I", len(payload) if length < 0 else length) + kind + payload
            + struct.pack(">I", zlib.crc32(kind + payload) if crc < 0 else crc))


def build_png(fields: dict[str, int]) -> bytes:
    f = {**PNG_DEFAULTS, **fields}
    ihdr = struct.pack(">II5B", f["width"], f["height"], f["bit_depth"], f["color_type"],
                       f["compression"], f["filter"], f["interlace"])
    rows = b"".join(b"\x00" + bytes((x + y) % 4 for x in range(8)) for y in range(6))
    idat = zlib.compress(rows)
    fctl = struct.pack(">5I2H2B", f["fctl_sequence"], f["fctl_width"], f["fctl_height"],
                       f["fctl_x"], f["fctl_y"], f["fctl_delay_num"], f["fctl_delay_den"],
                       f["fctl_dispose"], f["fctl_blend"])
    plte = bytes(range(12))
    return b"".join([
        b"\x89PNG\r\n\x1a\n",
        _chunk(b"IHDR", ihdr, f["ihdr_length"] if f["ihdr_length"] != 13 else -1, f["ihdr_crc"]),
        _chunk(b"gAMA", struct.pack(">I", f["gama"])),
        _chunk(b"pHYs", struct.pack(">IIB", 2835, 2835, f["phys_unit"])),
        _chunk(b"PLTE", plte, f["plte_length"] if f["plte_length"] != 12 else -1),
        _chunk(b"tRNS", b"\x00\x80\xff\x10", f["trns_length"] if f["trns_length"] != 4 else -1),
        _chunk(b"zTXt", b"Comment\x00" + bytes([f["ztxt_method"]]) + zlib.compress(b"hello")),
        _chunk(b"iTXt", b"Title\x00" + bytes([f["itxt_flag"]]) + b"\x00en\x00\x00"
               + zlib.compress(b"x")),
        _chunk(b"acTL", struct.pack(">II", f["actl_frames"], f["actl_plays"])),
        _chunk(b"fcTL", fctl),
        _chunk(b"IDAT", idat, f["idat_length"]),
        _chunk(b"IEND", b"", f["iend_length"] if f["iend_length"] else -1),
    ])


def test_png_builder_is_valid() -> None:
    info = probe_image(build_png({}), validate="full")
    assert (info.width, info.height, info.mode) == (8, 6, "P")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("field", sorted(PNG_WIDTHS))
def test_png_every_field(field: str) -> None:
    for name, value in single_field_cases(PNG_DEFAULTS, {field: PNG_WIDTHS[field]}):
        check(build_png({name: value}), "png")


# --- GIF ------------------------------------------------------------------------------------

GIF_WIDTHS = {"screen_width": 2, "screen_height": 2, "screen_flags": 1, "background": 1,
              "aspect": 1, "gce_size": 1, "gce_flags": 1, "gce_delay": 2, "gce_transparent": 1,
              "loop_size": 1, "loop_count": 2, "comment_size": 1, "left": 2, "top": 2,
              "width": 2, "height": 2, "image_flags": 1, "lzw_min": 1, "data_size": 1,
              "trailer": 1}
GIF_DEFAULTS = {"screen_width": 4, "screen_height": 4, "screen_flags": 0x80, "background": 0,
                "aspect": 0, "gce_size": 4, "gce_flags": 1, "gce_delay": 10, "gce_transparent": 1,
                "loop_size": 3, "loop_count": 0, "comment_size": 3, "left": 0, "top": 0,
                "width": 4, "height": 4, "image_flags": 0, "lzw_min": 2, "data_size": -1,
                "trailer": 0x3B}


def build_gif(fields: dict[str, int]) -> bytes:
    f = {**GIF_DEFAULTS, **fields}
    lzw = bytes([0x84, 0x8F, 0xA9, 0xCB, 0xED, 0x0F, 0x63, 0x2B, 0x00])  # 16 pixels, code size 2
    data_size = len(lzw) if f["data_size"] < 0 else f["data_size"]
    return b"".join([
        b"GIF89a", struct.pack("<HHBBB", f["screen_width"], f["screen_height"],
                               f["screen_flags"], f["background"], f["aspect"]),
        bytes([0, 0, 0, 255, 255, 255]),  # global colour table of 2 entries (flags & 7 == 0)
        b"\x21\xff\x0bNETSCAPE2.0", bytes([f["loop_size"], 1]), struct.pack("<H", f["loop_count"]),
        b"\x00",
        b"\x21\xfe", bytes([f["comment_size"]]), b"hey\x00",
        b"\x21\xf9", bytes([f["gce_size"], f["gce_flags"]]), struct.pack("<H", f["gce_delay"]),
        bytes([f["gce_transparent"], 0]),
        b"\x2c", struct.pack("<HHHHB", f["left"], f["top"], f["width"], f["height"],
                             f["image_flags"]),
        bytes([f["lzw_min"], data_size]), lzw, b"\x00",
        bytes([f["trailer"]]),
    ])


def test_gif_builder_is_valid() -> None:
    info = probe_image(build_gif({}), validate="full")
    assert (info.width, info.height) == (4, 4)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("field", sorted(GIF_WIDTHS))
def test_gif_every_field(field: str) -> None:
    for name, value in single_field_cases(GIF_DEFAULTS, {field: GIF_WIDTHS[field]}):
        check(build_gif({name: value}), "gif")


# --- BMP ------------------------------------------------------------------------------------

BMP_WIDTHS = {"file_size": 4, "reserved": 4, "pixel_offset": 4, "header_size": 4, "width": 4,
              "height": 4, "planes": 2, "bpp": 2, "compression": 4, "image_size": 4,
              "x_ppm": 4, "y_ppm": 4, "colors_used": 4, "colors_important": 4, "red_mask": 4,
              "green_mask": 4, "blue_mask": 4, "alpha_mask": 4}
BMP_DEFAULTS = {"file_size": -1, "reserved": 0, "pixel_offset": -1, "header_size": 108,
                "width": 4, "height": 4, "planes": 1, "bpp": 24, "compression": 0,
                "image_size": 48, "x_ppm": 2835, "y_ppm": 2835, "colors_used": 0,
                "colors_important": 0, "red_mask": 0xFF0000, "green_mask": 0xFF00,
                "blue_mask": 0xFF, "alpha_mask": 0}
BMP_EXTRA_VALUES = {"height": [(-4) & 0xFFFFFFFF, 0x80000000], "width": [(-4) & 0xFFFFFFFF],
                    "header_size": [12, 16, 40, 52, 56, 64, 108, 124], "bpp": [1, 2, 4, 8, 16, 32],
                    "compression": [1, 2, 3, 4, 5, 6]}


def build_bmp(fields: dict[str, int]) -> bytes:
    f = {**BMP_DEFAULTS, **fields}
    info = struct.pack("<IIIHHIIIIII", f["header_size"], f["width"], f["height"], f["planes"],
                       f["bpp"], f["compression"], f["image_size"], f["x_ppm"], f["y_ppm"],
                       f["colors_used"], f["colors_important"])
    info += struct.pack("<4I", f["red_mask"], f["green_mask"], f["blue_mask"], f["alpha_mask"])
    info = info.ljust(108, b"\x00")
    palette = bytes(range(64))  # used by the 1-8 bpp mutations
    pixels = bytes((i * 7) % 256 for i in range(48))
    offset = 14 + len(info) + len(palette) if f["pixel_offset"] < 0 else f["pixel_offset"]
    total = 14 + len(info) + len(palette) + len(pixels)
    head = b"BM" + struct.pack("<III", total if f["file_size"] < 0 else f["file_size"],
                               f["reserved"], offset)
    return head + info + palette + pixels


def test_bmp_builder_is_valid() -> None:
    info = probe_image(build_bmp({}), validate="full")
    assert (info.width, info.height, info.mode) == (4, 4, "RGB")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("field", sorted(BMP_WIDTHS))
def test_bmp_every_field(field: str) -> None:
    values = width_values(BMP_WIDTHS[field], max(BMP_DEFAULTS[field], 0))
    for value in values + BMP_EXTRA_VALUES.get(field, []):
        check(build_bmp({field: value}), "bmp")


# --- TIFF -----------------------------------------------------------------------------------

# (type number, struct code, size): every TIFF 6.0 and BigTIFF field type, and invalid ones.
TIFF_TYPES = {1: ("B", 1), 2: ("s", 1), 3: ("H", 2), 4: ("I", 4), 5: ("II", 8), 6: ("b", 1),
              7: ("B", 1), 8: ("h", 2), 9: ("i", 4), 10: ("ii", 8), 11: ("f", 4), 12: ("d", 8),
              13: ("I", 4), 16: ("Q", 8), 17: ("q", 8), 18: ("Q", 8)}
INVALID_TIFF_TYPES = [0, 14, 15, 19, 99, 0xFFFF]
TIFF_VALUES: list[Any] = [0, 1, 2, 3, 255, 65535, 2**31 - 1, 2**32 - 1, 2**63, -1, -(2**31),
                          math.nan, math.inf, -math.inf, 1e308, 0.5, -0.0, "abc", ""]


def tiff_value(field_type: int, count: int, value: Any, order: str) -> bytes:
    """``count`` copies of ``value`` encoded as ``field_type`` (clamped/wrapped to fit)."""
    if field_type not in TIFF_TYPES:
        return struct.pack(order + "I", 16)[: max(min(count, 8), 0)]
    code, size = TIFF_TYPES[field_type]
    if field_type == 2:
        text = (value if isinstance(value, str) else repr(value)).encode() + b"\x00"
        return (text * count)[:count]
    one: bytes
    if code in ("f", "d"):
        number = float(value) if not isinstance(value, str) else math.nan
        if code == "f" and math.isfinite(number) and abs(number) > 3e38:
            number = math.inf
        one = struct.pack(order + code, number)
    else:
        if isinstance(value, str):
            number = 7
        elif isinstance(value, float):
            number = 0 if not math.isfinite(value) else int(value)
        else:
            number = value
        if code in ("II", "ii"):
            bits, signed = 32, code == "ii"
            numerator = _wrap(number, bits, signed)
            one = struct.pack(order + code, numerator, 3)
        else:
            bits, signed = size * 8, code.islower()
            one = struct.pack(order + code, _wrap(number, bits, signed))
    return one * count


def _wrap(number: int, bits: int, signed: bool) -> int:
    number &= (1 << bits) - 1
    if signed and number >= 1 << (bits - 1):
        number -= 1 << bits
    return number


def tiff_entries(tiled: bool = False, rgb: bool = False) -> list[tuple[int, int, int, Any]]:
    """(tag, type, count, value) of a valid 8x8 uncompressed TIFF; offsets patched at build."""
    samples = 3 if rgb else 1
    entries = [(256, 3, 1, 8), (257, 3, 1, 8), (258, 3, samples, 8), (259, 3, 1, 1),
               (262, 3, 1, 2 if rgb else 1), (277, 3, 1, samples), (282, 5, 1, 72),
               (283, 5, 1, 72), (284, 3, 1, 1), (296, 3, 1, 2), (339, 3, samples, 1),
               (274, 3, 1, 1), (266, 3, 1, 1)]
    if tiled:
        entries += [(322, 3, 1, 16), (323, 3, 1, 16), (324, 4, 1, "data"),
                    (325, 4, 1, 256 * samples)]
    else:
        entries += [(278, 3, 1, 8), (273, 4, 1, "data"), (279, 4, 1, 64 * samples)]
    return entries


def build_tiff(entries: list[tuple[int, int, int, Any]], order: str = "<",
               header: dict[str, int] | None = None) -> bytes:
    header = header or {}
    entries = sorted(entries, key=lambda e: e[0])
    count = header.get("entry_count", len(entries))
    ifd_offset = 8
    data_start = ifd_offset + 2 + 12 * len(entries) + 4
    extra = b""
    encoded = []
    pixels_at = None
    pixel_bytes = bytes((i * 37) % 256 for i in range(16 * 16 * 3))
    for tag, field_type, field_count, value in entries:
        if value == "data":
            pixels_at = True
            value = 0  # patched below once the data offset is known
        encoded.append((tag, field_type, field_count, value))
    out_entries = []
    # Out-of-line values first, then the pixels.
    for tag, field_type, field_count, value in encoded:
        raw = tiff_value(field_type, field_count, value, order)
        out_entries.append([tag, field_type, field_count, raw])
    for entry in out_entries:
        if len(entry[3]) > 4:
            entry.append(data_start + len(extra))
            extra += entry[3] + (b"\x00" if len(entry[3]) % 2 else b"")
    pixel_offset = data_start + len(extra)
    body = b""
    for tag, field_type, field_count, raw, *where in out_entries:
        if pixels_at and tag in (273, 324) and raw == tiff_value(field_type, field_count, 0, order):
            raw = tiff_value(field_type, field_count, pixel_offset, order)
            if where:  # out of line: rewrite the copy in extra
                start = where[0] - data_start
                extra = extra[:start] + raw + extra[start + len(raw):]
        inline = struct.pack(order + "I", where[0]) if where else raw.ljust(4, b"\x00")[:4]
        body += struct.pack(order + "HHI", tag, field_type, field_count) + inline
    magic = b"II*\x00" if order == "<" else b"MM\x00*"
    magic = header.get("magic_bytes", magic)  # type: ignore[assignment]
    first = header.get("ifd_offset", ifd_offset)
    return (magic + struct.pack(order + "I", first) + struct.pack(order + "H", count & 0xFFFF)
            + body + struct.pack(order + "I", header.get("next_ifd", 0)) + extra + pixel_bytes)


def test_tiff_builder_is_valid() -> None:
    for tiled in (False, True):
        for rgb in (False, True):
            for order in ("<", ">"):
                info = probe_image(build_tiff(tiff_entries(tiled, rgb), order), validate="full")
                assert (info.width, info.height) == (8, 8)
                assert info.mode == ("RGB" if rgb else "L")


def tiff_mutations(entries: list[tuple[int, int, int, Any]]) -> list[list[tuple[int, int, int, Any]]]:
    """Every entry's type, count and value changed one at a time, across all TIFF types."""
    cases = []
    for i, (tag, field_type, count, value) in enumerate(entries):
        def swap(new: tuple[int, int, int, Any]) -> list[tuple[int, int, int, Any]]:
            return entries[:i] + [new] + entries[i + 1:]
        keep = 0 if value == "data" else value
        for new_type in [*TIFF_TYPES, *INVALID_TIFF_TYPES]:
            cases.append(swap((tag, new_type, count, keep)))
            for new_value in (math.nan, math.inf, 2**63, -1, "abc"):
                cases.append(swap((tag, new_type, count, new_value)))
        for new_count in (0, 2, 3, 64, 1000):
            cases.append(swap((tag, field_type, new_count, keep)))
        for new_value in TIFF_VALUES:
            cases.append(swap((tag, field_type, count, new_value)))
        cases.append(entries[:i] + entries[i + 1:])  # the field missing
        cases.append(entries + [(tag, field_type, count, keep)])  # the field twice
    return cases


@pytest.mark.timeout(300)
@pytest.mark.parametrize("tiled", [False, True], ids=["strips", "tiles"])
@pytest.mark.parametrize("rgb", [False, True], ids=["gray", "rgb"])
@pytest.mark.parametrize("order", ["<", ">"], ids=["II", "MM"])
def test_tiff_every_entry_type_count_value(tiled: bool, rgb: bool, order: str) -> None:
    for entries in tiff_mutations(tiff_entries(tiled, rgb)):
        check(build_tiff(entries, order), "tiff")


def test_tiff_issue_examples_are_rejected_with_a_reason() -> None:
    """The issue's 134-byte-class examples: DOUBLE NaN/Inf, RATIONAL counts, ASCII offsets."""
    base = tiff_entries()
    cases = {
        "double-nan": (279, 12, 1, math.nan), "double-inf": (279, 12, 1, math.inf),
        "rational": (279, 5, 1, 64), "ascii-offsets": (273, 2, 4, "abc"),
        "float-offsets": (273, 11, 1, 1e30),
    }
    for label, entry in cases.items():
        entries = [e for e in base if e[0] != entry[0]] + [entry]
        with pytest.raises(RejectedImageError) as caught:
            probe_image(build_tiff(entries), name=label)
        assert caught.value.reason == "decode-failed", label
        assert caught.value.path == label


@pytest.mark.timeout(120)
def test_tiff_header_fields() -> None:
    entries = tiff_entries()
    for key, values in {"ifd_offset": [0, 1, 4, 7, 9, 2**31, 2**32 - 1],
                        "entry_count": [0, 1, 2, 200, 0xFFFF],
                        "next_ifd": [1, 8, 2**32 - 1, 100],
                        "magic_bytes": [b"II+\x00", b"MM\x00+", b"II*\x01"]}.items():
        for value in values:
            check(build_tiff(entries, "<", {key: value}), "tiff")  # type: ignore[dict-item]


# --- JPEG (and MPO) ---------------------------------------------------------------------------

def _encode(img: Image.Image, fmt: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, fmt, **options)
    return buffer.getvalue()


def _rgb(seed: int = 0, size: tuple[int, int] = (16, 16)) -> Image.Image:
    array = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    return Image.fromarray(array)


def jpeg_segments(data: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """(marker, payload) of every header segment up to and including SOS, and the rest."""
    segments, pos = [], 2
    while True:
        marker = data[pos + 1]
        length = struct.unpack(">H", data[pos + 2:pos + 4])[0]
        segments.append((marker, data[pos + 4:pos + 2 + length]))
        pos += 2 + length
        if marker == 0xDA:
            return segments, data[pos:]


def join_jpeg(segments: list[tuple[int, bytes]], rest: bytes,
              length_override: tuple[int, int] | None = None) -> bytes:
    out = [b"\xff\xd8"]
    for i, (marker, payload) in enumerate(segments):
        length = len(payload) + 2
        if length_override is not None and length_override[0] == i:
            length = length_override[1]
        out.append(bytes([0xFF, marker]) + struct.pack(">H", length & 0xFFFF) + payload)
    return b"".join(out) + rest


def jpeg_bases() -> dict[str, bytes]:
    exif = Image.Exif()
    exif[0x010F] = "fuzz"
    exif[0x0112] = 6
    return {
        "baseline": _encode(_rgb(), "JPEG", quality=80, exif=exif.tobytes()),
        "progressive-420": _encode(_rgb(1, (17, 23)), "JPEG", progressive=True, subsampling=2),
        "gray-restart": _encode(_rgb(2).convert("L"), "JPEG", restart_marker_blocks=1),
        "cmyk": _encode(_rgb(3).convert("CMYK"), "JPEG"),
        "mpo": _encode(_rgb(4), "MPO", save_all=True, append_images=[_rgb(5)]),
    }


@pytest.mark.timeout(300)
@pytest.mark.parametrize("base", sorted(jpeg_bases()))
def test_jpeg_every_segment_field(base: str) -> None:
    """Each segment's marker, length, and every byte of its first 48 payload bytes, mutated.

    The first 48 bytes cover every fixed field of SOF (precision, height, width, components,
    sampling factors, table ids), SOS, DQT/DHT table classes, ids and counts, DRI, the JFIF and
    Adobe fields, the Exif TIFF header and first directory entries, and the MPF index.
    """
    segments, rest = jpeg_segments(jpeg_bases()[base])
    for i, (marker, payload) in enumerate(segments):
        for length in (0, 1, 2, 3, len(payload) + 1, len(payload) + 3, 0xFFFF):
            check(join_jpeg(segments, rest, (i, length)), "jpeg")
        for new_marker in (0xC0, 0xC2, 0xC3, 0xC9, 0xCF, 0xD8, 0xD9, 0xDA, 0xDD, 0xFF, 0x01):
            check(join_jpeg(segments[:i] + [(new_marker, payload)] + segments[i + 1:], rest),
                  "jpeg")
        for offset in range(min(len(payload), 48)):
            for value in (0, 1, 0x0F, 0x10, 0x11, 0x44, 0x7F, 0x80, 0xFE, 0xFF):
                if payload[offset] == value:
                    continue
                mutated = payload[:offset] + bytes([value]) + payload[offset + 1:]
                check(join_jpeg(segments[:i] + [(marker, mutated)] + segments[i + 1:], rest),
                      "jpeg")
    # SOF height/width as 16-bit fields, and the scan data cut or extended.
    sof = next(i for i, (m, _) in enumerate(segments) if m in (0xC0, 0xC1, 0xC2))
    marker, payload = segments[sof]
    for offset in (1, 3):
        for value in (0, 1, 0x7FFF, 0x8000, 0xFFFF):
            mutated = payload[:offset] + struct.pack(">H", value) + payload[offset + 2:]
            check(join_jpeg(segments[:sof] + [(marker, mutated)] + segments[sof + 1:], rest),
                  "jpeg")
    for cut in (0, 1, len(rest) // 2, len(rest) - 2, len(rest) - 1):
        check(join_jpeg(segments, rest[:cut]), "jpeg")
    check(join_jpeg(segments, rest + b"\xff" * 5000), "jpeg")


# --- WEBP -----------------------------------------------------------------------------------

def webp_bases() -> dict[str, bytes]:
    rgba = _rgb(6).convert("RGBA")
    return {
        "lossy": _encode(_rgb(6), "WEBP", quality=70),
        "lossless": _encode(_rgb(7), "WEBP", lossless=True),
        "alpha-vp8x": _encode(rgba, "WEBP", quality=70),
        "animated": _encode(_rgb(8), "WEBP", save_all=True, append_images=[_rgb(9)],
                            duration=50),
    }


def riff_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    chunks, pos = [], 12
    while pos + 8 <= len(data):
        kind = data[pos:pos + 4]
        size = struct.unpack("<I", data[pos + 4:pos + 8])[0]
        chunks.append((kind, data[pos + 8:pos + 8 + size]))
        pos += 8 + size + (size & 1)
    return chunks


def join_riff(chunks: list[tuple[bytes, bytes]], riff_size: int | None = None,
              size_override: tuple[int, int] | None = None) -> bytes:
    body = b"WEBP"
    for i, (kind, payload) in enumerate(chunks):
        size = len(payload)
        if size_override is not None and size_override[0] == i:
            size = size_override[1]
        body += kind + struct.pack("<I", size) + payload + (b"\x00" if len(payload) & 1 else b"")
    return b"RIFF" + struct.pack("<I", len(body) if riff_size is None else riff_size) + body


@pytest.mark.timeout(300)
@pytest.mark.parametrize("base", sorted(webp_bases()))
def test_webp_every_chunk_field(base: str) -> None:
    """RIFF size, each chunk's size and first 32 payload bytes (VP8X flags and canvas size,
    VP8 frame tag and dimensions, VP8L signature and packed size, ANIM/ANMF fields)."""
    data = webp_bases()[base]
    chunks = riff_chunks(data)
    for riff_size in (0, 4, len(data) - 9, len(data), 2**32 - 1):
        check(join_riff(chunks, riff_size), "webp")
    for i, (kind, payload) in enumerate(chunks):
        for size in (0, 1, len(payload) - 1, len(payload) + 1, 2**31, 2**32 - 1):
            check(join_riff(chunks, None, (i, max(size, 0))), "webp")
        for offset in range(min(len(payload), 32)):
            for value in (0, 1, 0x2F, 0x7F, 0x80, 0x9D, 0xFE, 0xFF):
                if payload[offset] == value:
                    continue
                mutated = payload[:offset] + bytes([value]) + payload[offset + 1:]
                check(join_riff(chunks[:i] + [(kind, mutated)] + chunks[i + 1:]), "webp")


# --- several fields at once, and arbitrary bytes ---------------------------------------------

BUILDERS: dict[str, tuple[Callable[[dict[str, int]], bytes], dict[str, int]]] = {
    "png": (build_png, PNG_WIDTHS), "gif": (build_gif, GIF_WIDTHS), "bmp": (build_bmp, BMP_WIDTHS),
}


@st.composite
def multi_field(draw: st.DrawFn) -> tuple[str, dict[str, int]]:
    fmt = draw(st.sampled_from(sorted(BUILDERS)))
    widths = BUILDERS[fmt][1]
    names = draw(st.lists(st.sampled_from(sorted(widths)), min_size=1, max_size=4, unique=True))
    fields = {name: draw(st.integers(0, (1 << (8 * widths[name])) - 1)) for name in names}
    return fmt, fields


@pytest.mark.timeout(300)
@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(multi_field())
def test_several_fields_at_once(case: tuple[str, dict[str, int]]) -> None:
    fmt, fields = case
    check(BUILDERS[fmt][0](fields), f"{fmt}-multi")


@st.composite
def tiff_multi(draw: st.DrawFn) -> list[tuple[int, int, int, Any]]:
    entries = tiff_entries(draw(st.booleans()), draw(st.booleans()))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(entries) - 1))
        tag = entries[i][0]
        field_type = draw(st.sampled_from([*TIFF_TYPES, *INVALID_TIFF_TYPES]))
        count = draw(st.integers(0, 70))
        value = draw(st.one_of(st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=5)))
        entries[i] = (tag, field_type, count, value)
    return entries


@pytest.mark.timeout(300)
@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(tiff_multi(), st.sampled_from(["<", ">"]))
def test_tiff_several_entries_at_once(entries: list[tuple[int, int, int, Any]], order: str) -> None:
    check(build_tiff(entries, order), "tiff-multi")


MAGICS = [b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"RIFF\x00\x00\x00\x00WEBPVP8 ", b"GIF89a",
          b"GIF87a", b"II*\x00", b"MM\x00*", b"II+\x00", b"BM", b""]


@pytest.mark.timeout(300)
@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(MAGICS), st.binary(max_size=300))
def test_any_bytes_after_any_magic(magic: bytes, tail: bytes) -> None:
    check(magic + tail, "random-bytes")
