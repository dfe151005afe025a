"""The header parsers (``packer._internal.imageheaders``) against Pillow: the same answer, or none at all.

``probe_image`` reads the common headers itself and asks Pillow only when a parser says None. The
contract: for any bytes, ``probe_image`` says exactly what it says with Pillow alone (the same
``ImageInfo``, or the same rejection reason and message), and for the images people have, the
parsers do answer (else the build would pay for Pillow again). Every format the tests and the
sample generator write is checked whole, cut at every length, and with bytes of its header
changed; ``test_header_fuzzing.py`` runs the same comparison over its field-by-field mutations.
"""

from __future__ import annotations

import io
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import assert_headers_agree_with_pillow, pillow_headers_only, probe_outcome
from packer._internal.imageheaders import parse_header
from packer._internal.imageinfo import detect_format

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import make_sample  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def _save(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _noise(height: int = 29, width: int = 41, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def corpus() -> dict[str, bytes]:
    """Every format the tests write, in the modes and options they use (and a few more)."""
    rgb = _noise()
    image = Image.fromarray(rgb)
    out = {f"sample-{name}": encode(rgb, 85) for name, (_, encode) in make_sample._ENCODERS.items()}
    exif = Image.Exif()
    exif[0x010F] = "camera"
    icc = b"\0" * 128 + b"acsp" + b"\0" * 300
    gray_palette = Image.fromarray(rgb[..., 0]).convert("P")
    out.update({
        "jpeg-progressive": _save(image, "JPEG", progressive=True),
        "jpeg-exif": _save(image, "JPEG", exif=exif.tobytes()),
        "jpeg-exif-dpi": _save(image, "JPEG", exif=exif.tobytes(), dpi=(300, 300)),
        "jpeg-dpi": _save(image, "JPEG", dpi=(72, 72)),
        "jpeg-icc": _save(image, "JPEG", icc_profile=icc),
        "jpeg-restart": _save(image, "JPEG", restart_marker_blocks=1),
        "jpeg-420": _save(image, "JPEG", subsampling=2),
        "jpeg-comment": _save(image, "JPEG", comment=b"a comment"),
        "jpeg-big-sample": make_sample._jpeg_near_size(np.random.default_rng(0), 20_000, 0),
        "png-1bit": _save(image.convert("1"), "PNG"),
        "png-la": _save(image.convert("LA"), "PNG"),
        "png-interlaced": _save(image, "PNG", optimize=False, interlace=1),
        "png-text": _save(image, "PNG", pnginfo=_png_text()),
        "png-dpi": _save(image, "PNG", dpi=(96, 96)),
        "png-transparent-rgb": _save(image, "PNG", transparency=(1, 2, 3)),
        "png-transparent-palette": _save(image.quantize(8), "PNG", transparency=0),
        "png-4bit-palette": _save(image.quantize(16), "PNG", bits=4),
        "gif-transparent": _save(image.quantize(32), "GIF", transparency=3),
        "gif-gray": _save(Image.fromarray(rgb[..., 0]), "GIF"),
        "gif-animated": _save(image.quantize(32), "GIF", save_all=True, append_images=[image.quantize(32)],
                              duration=40, loop=0),
        "gif-comment": _save(image.quantize(32), "GIF", comment=b"hello"),
        "bmp-gray": _save(image.convert("L"), "BMP"),
        "bmp-palette": _save(image.quantize(200), "BMP"),
        "bmp-gray-palette": _save(gray_palette, "BMP"),
        "bmp-1bit": _save(image.convert("1"), "BMP"),
        "bmp-rgba": _save(image.convert("RGBA"), "BMP"),
        "webp-lossless": _save(image, "WEBP", lossless=True),
        "webp-lossless-alpha": _save(image.convert("RGBA"), "WEBP", lossless=True),
        "webp-alpha": _save(image.convert("RGBA"), "WEBP", quality=70),
        "webp-exif": _save(image, "WEBP", exif=exif.tobytes()),
        "mpo": _save(image, "MPO", save_all=True, append_images=[Image.fromarray(_noise(seed=1))]),
        "tiff": _save(image, "TIFF"),
    })
    for bits in (1, 2, 4, 8, 16):  # every depth and colour type, the unknown pairs too
        for color in (0, 2, 3, 4, 6, 5):
            out[f"png-raw-{bits}-{color}"] = _raw_png(bits, color)
    return out


def _raw_png(bits: int, color: int, width: int = 7, height: int = 3) -> bytes:
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    samples = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(color, 1)
    row = 1 + (width * samples * bits + 7) // 8
    palette = chunk(b"PLTE", bytes(range(48))) if color == 3 else b""
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, bits, color, 0, 0, 0))
            + palette + chunk(b"IDAT", zlib.compress(b"\0" * row * height)) + chunk(b"IEND", b""))


def _png_text() -> object:
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "text")
    return info


CORPUS = corpus()
#: The forms the build meets every day: the parsers must answer for them, not leave them to Pillow.
ANSWERED = {"sample-jpeg", "sample-jpeg-gray", "sample-jpeg-cmyk", "sample-png", "sample-png-rgba",
            "sample-png-gray", "sample-png-palette", "sample-png16", "sample-webp", "sample-gif", "sample-bmp",
            "jpeg-progressive", "jpeg-exif-dpi", "jpeg-dpi", "jpeg-icc", "jpeg-restart", "jpeg-420", "jpeg-comment",
            "jpeg-big-sample", "png-1bit", "png-la", "png-interlaced", "png-dpi", "png-transparent-rgb",
            "png-transparent-palette", "png-4bit-palette", "gif-transparent", "gif-gray", "gif-animated",
            "gif-comment", "bmp-gray", "bmp-palette", "bmp-gray-palette", "bmp-1bit", "webp-lossless",
            "webp-lossless-alpha", "webp-alpha"} | {f"png-raw-{bits}-{color}" for bits, color in (
                (1, 0), (2, 0), (4, 0), (8, 0), (16, 0), (8, 2), (16, 2), (1, 3), (2, 3), (4, 3), (8, 3), (8, 4),
                (16, 4), (8, 6), (16, 6))}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_whole_files_agree_with_pillow(name: str) -> None:
    data = CORPUS[name]
    assert_headers_agree_with_pillow(data)
    assert_headers_agree_with_pillow(data, max_pixels=100)  # the limit checked after the parse
    header = parse_header(data, detect_format(data))
    assert (header is not None) == (name in ANSWERED), name
    if header is not None:
        with Image.open(io.BytesIO(data)) as image:
            assert (header.format, header.size, header.mode) == (image.format, image.size, image.mode)
            if header.format == "BMP":
                tile = image.tile[0]
                assert header.tile[0] == (tile[0], tuple(tile[1]), tile[2], tuple(tile[3]))


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_cut_agrees_with_pillow(name: str) -> None:
    data = CORPUS[name]
    cuts = set(range(0, min(len(data), 400))) | set(range(0, len(data), max(1, len(data) // 60)))
    for cut in sorted(cuts):
        assert_headers_agree_with_pillow(data[:cut])


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_changed_header_bytes_agree_with_pillow(name: str) -> None:
    data = CORPUS[name]
    rng = np.random.default_rng(len(name))
    head = min(len(data), 160)
    for position in range(head):
        for value in (0x00, 0xFF, data[position] ^ 0x01, int(rng.integers(0, 256))):
            if value != data[position]:
                assert_headers_agree_with_pillow(data[:position] + bytes([value]) + data[position + 1:])
    for _ in range(200):  # several bytes at once
        mutated = bytearray(data)
        for position in rng.integers(0, head, size=3):
            mutated[position] = int(rng.integers(0, 256))
        assert_headers_agree_with_pillow(bytes(mutated))


def test_hostile_headers_agree_with_pillow() -> None:
    jpeg = CORPUS["sample-jpeg"]
    png = CORPUS["sample-png"]
    cases = [
        jpeg[:2] + b"\xff\xff\xff" + jpeg[2:],                    # fill bytes before a marker
        jpeg[:2] + b"\x00\x13" + jpeg[2:],                        # junk between markers
        jpeg[:2] + b"\xff\x01" + jpeg[2:],                        # TEM: "no marker found"
        jpeg[:2] + b"\xff\x00" + jpeg[2:],                        # an escaped FF outside a scan
        jpeg[:2] + b"\xff\xe0\x00\x01" + jpeg[2:],                # a length below 2
        jpeg[:2] + b"\xff\xe0\x00\x07JFIF\x00" + jpeg[2:],        # a JFIF segment too short for its version
        jpeg[:2] + b"\xff\xee\x00\x07Adobe" + jpeg[2:],           # an Adobe segment too short
        jpeg[:2] + b"\xff\xe2\x00\x10ICC_PROFILE\x00\x01" + jpeg[2:],  # an ICC chunk without its count
        jpeg[:2] + b"\xff\xed\x00\x14Photoshop 3.0\x008BI" + jpeg[2:],
        jpeg[:2] + b"\xff\xe2\x00\x0aMPF\x00II*\x00" + jpeg[2:],
        jpeg.replace(b"\xff\xda", b"\xff\xd9", 1),                # no start of scan
        png[:8] + png[33:],                                       # no IHDR
        png.replace(b"IDAT", b"IEND", 1),                          # IEND before IDAT
        png[:12] + b"IH\x00R" + png[16:],                         # not a chunk id
        png[:29] + b"\0\0\0\0" + png[33:],                        # a bad IHDR checksum
        png[:8] + struct.pack(">I", 1 << 31) + png[12:],          # an IHDR claiming 2 GiB
        b"GIF89a\x05\x00\x05\x00\x00\x00\x00!\xf9\x00,",          # an empty graphic control block
        b"BM" + b"\0" * 12 + struct.pack("<I", 40) + b"\0" * 36,  # a BMP of zero size
        b"RIFF\x1a\x00\x00\x00WEBPVP8 \x0e\x00\x00\x00" + b"\0" * 14,
    ]
    for data in cases:
        assert_headers_agree_with_pillow(data)
        assert_headers_agree_with_pillow(data, validate="full")


def test_a_changed_pillow_setting_hands_the_header_to_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import GifImagePlugin, ImageFile

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    assert parse_header(CORPUS["sample-png"], detect_format(CORPUS["sample-png"])) is None
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)
    monkeypatch.setattr(GifImagePlugin, "LOADING_STRATEGY", GifImagePlugin.LoadingStrategy.RGB_ALWAYS)
    assert parse_header(CORPUS["sample-gif"], detect_format(CORPUS["sample-gif"])) is None
    assert_headers_agree_with_pillow(CORPUS["sample-gif"])


def test_pillow_alone_is_what_the_helper_switches_to() -> None:
    with pillow_headers_only():
        import packer._internal.imageinfo as imageinfo

        assert imageinfo.parse_header(CORPUS["sample-jpeg"], 1) is None
    assert probe_outcome(CORPUS["sample-jpeg"])[0] == "ok"
