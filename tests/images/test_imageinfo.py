"""Tests for packer._internal.imageinfo: format detection, header facts, and every rejection reason."""

from __future__ import annotations

import io
import io as _io
import re
import struct
import warnings
import zlib
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from packer import format as fmt
from packer._internal import imageinfo as imageinfo_module
from packer.errors import DecodeError, OptionError, PackerError, RejectedImageError
from packer.format import ImageFormat
from packer._internal.imageinfo import DEFAULT_MAX_PIXELS, ImageInfo, detect_format, probe_image

from helpers import jpeg_bytes

REASONS = {"empty-file", "not-an-image", "unsupported-format", "truncated", "decode-failed",
           "too-many-pixels"}


# --- helpers --------------------------------------------------------------------------------

def encode(img: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, fmt, **options)
    return buffer.getvalue()


def noise(height: int = 40, width: int = 50, channels: int = 3, seed: int = 0) -> np.ndarray:
    shape = (height, width) if channels == 1 else (height, width, channels)
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def rgb_image(height: int = 40, width: int = 50) -> Image.Image:
    return Image.fromarray(noise(height, width))


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return (struct.pack(">I", len(payload)) + kind + payload
            + struct.pack(">I", zlib.crc32(kind + payload)))


def raw_png(width: int, height: int, *, bit_depth: int = 8, color_type: int = 2,
            rows: bytes | None = None) -> bytes:
    """A PNG written by hand, so headers Pillow would never write (0 px, 20000 px) can be tested."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    data = zlib.compress(rows if rows is not None else b"\x00" * 16)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", data)
            + png_chunk(b"IEND", b""))


def reject(data: bytes | memoryview, **kwargs: object) -> RejectedImageError:
    with pytest.raises(RejectedImageError) as caught:
        probe_image(data, **kwargs)
    assert caught.value.reason in REASONS
    return caught.value


VALID = {
    "jpeg-rgb": (lambda: encode(rgb_image(), "JPEG"), ImageFormat.JPEG, "RGB", 3),
    "jpeg-gray": (lambda: encode(rgb_image().convert("L"), "JPEG"), ImageFormat.JPEG, "L", 1),
    "jpeg-cmyk": (lambda: encode(rgb_image().convert("CMYK"), "JPEG"), ImageFormat.JPEG,
                  "CMYK", 4),
    "mpo": (lambda: encode(rgb_image(), "MPO", save_all=True, append_images=[rgb_image()]),
            ImageFormat.JPEG, "RGB", 3),
    "png-rgb": (lambda: encode(rgb_image(), "PNG"), ImageFormat.PNG, "RGB", 3),
    "png-rgba": (lambda: encode(Image.fromarray(noise(channels=4)), "PNG"), ImageFormat.PNG,
                 "RGBA", 4),
    "png-la": (lambda: encode(Image.fromarray(noise(channels=2), "LA"), "PNG"),
               ImageFormat.PNG, "LA", 2),
    "png-gray": (lambda: encode(rgb_image().convert("L"), "PNG"), ImageFormat.PNG, "L", 1),
    "png-palette": (lambda: encode(rgb_image().quantize(16), "PNG"), ImageFormat.PNG, "P", 1),
    "png16": (lambda: encode(Image.fromarray(noise(channels=1).astype(np.uint16) * 257), "PNG"),
              ImageFormat.PNG, "I;16", 1),
    "png-1bit": (lambda: encode(rgb_image().convert("1"), "PNG"), ImageFormat.PNG, "1", 1),
    "webp-rgb": (lambda: encode(rgb_image(), "WEBP"), ImageFormat.WEBP, "RGB", 3),
    "webp-rgba": (lambda: encode(Image.fromarray(noise(channels=4)), "WEBP", lossless=True),
                  ImageFormat.WEBP, "RGBA", 4),
    "gif": (lambda: encode(rgb_image().quantize(32), "GIF"), ImageFormat.GIF, "P", 1),
    "bmp": (lambda: encode(rgb_image(), "BMP"), ImageFormat.BMP, "RGB", 3),
    "tiff-rgb": (lambda: encode(rgb_image(), "TIFF"), ImageFormat.TIFF, "RGB", 3),
    "tiff-deflate": (lambda: encode(rgb_image(), "TIFF", compression="tiff_deflate"),
                     ImageFormat.TIFF, "RGB", 3),
    "tiff16": (lambda: encode(Image.fromarray(noise(channels=1).astype(np.uint16) * 257), "TIFF"),
               ImageFormat.TIFF, "I;16", 1),
}


# --- detect_format ----------------------------------------------------------------------------

@pytest.mark.parametrize("data, expected", [
    (b"\xff\xd8\xff\xe0" + bytes(20), ImageFormat.JPEG),
    (b"\x89PNG\r\n\x1a\n" + bytes(20), ImageFormat.PNG),
    (b"RIFF\x10\x00\x00\x00WEBPVP8 " + bytes(8), ImageFormat.WEBP),
    (b"GIF89a" + bytes(20), ImageFormat.GIF),
    (b"GIF87a" + bytes(20), ImageFormat.GIF),
    (b"BM" + bytes(12) + struct.pack("<I", 40) + bytes(8), ImageFormat.BMP),
    (b"II*\x00" + bytes(20), ImageFormat.TIFF),
    (b"MM\x00*" + bytes(20), ImageFormat.TIFF),
    (b"II+\x00" + bytes(20), ImageFormat.TIFF),
    (b"RIFF\x10\x00\x00\x00WAVEfmt " + bytes(8), ImageFormat.UNKNOWN),  # a RIFF that is no WEBP
    (b"BMW drivers handbook, chapter 1", ImageFormat.UNKNOWN),  # "BM" text, no BMP header
    (b"P6\n16 16\n255\n" + bytes(20), ImageFormat.UNKNOWN),
    (b"", ImageFormat.UNKNOWN),
    (b"\xff\xd8", ImageFormat.UNKNOWN),
])
def test_detect_format_reads_magic_bytes(data: bytes, expected: int) -> None:
    assert detect_format(data) == expected
    assert detect_format(memoryview(data)) == expected
    assert detect_format(np.frombuffer(data, dtype=np.uint8)) == expected


@pytest.mark.parametrize("kind", sorted(VALID))
def test_detect_format_agrees_with_probe(kind: str) -> None:
    make, image_format, _, _ = VALID[kind]
    assert detect_format(make()) == image_format


# --- accepted images ----------------------------------------------------------------------------

@pytest.mark.parametrize("validate", ["header", "full"])
@pytest.mark.parametrize("kind", sorted(VALID))
def test_probe_reports_format_size_channels_and_mode(kind: str, validate: str) -> None:
    make, image_format, mode, channels = VALID[kind]
    info = probe_image(make(), name=f"{kind}.img", validate=validate)
    assert info == ImageInfo(image_format=image_format, width=50, height=40, channels=channels,
                             mode=mode)


def test_image_info_is_frozen() -> None:
    info = probe_image(VALID["png-rgb"][0]())
    with pytest.raises(FrozenInstanceError):
        info.width = 1  # type: ignore[misc]


def test_probe_reports_width_and_height_in_the_right_order() -> None:
    info = probe_image(encode(rgb_image(height=7, width=300), "PNG"))
    assert (info.width, info.height) == (300, 7)


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview,
                                  lambda d: np.frombuffer(d, dtype=np.uint8)])
def test_probe_accepts_any_bytes_like(wrap) -> None:
    data = VALID["jpeg-rgb"][0]()
    assert probe_image(wrap(data), validate="full") == probe_image(data)


def test_probe_accepts_zero_copy_slices_of_a_larger_buffer() -> None:
    data = VALID["png-rgb"][0]()
    blob = np.zeros(len(data) + 8192, dtype=np.uint8)
    blob[4096:4096 + len(data)] = np.frombuffer(data, dtype=np.uint8)
    assert probe_image(blob[4096:4096 + len(data)]) == probe_image(data)
    assert probe_image(memoryview(blob)[4096:4096 + len(data)]) == probe_image(data)


def test_probe_accepts_non_contiguous_arrays() -> None:
    data = VALID["gif"][0]()
    spread = np.zeros(2 * len(data), dtype=np.uint8)
    spread[::2] = np.frombuffer(data, dtype=np.uint8)
    assert probe_image(spread[::2]) == probe_image(data)


def test_jpeg_with_padding_after_end_marker_is_accepted() -> None:
    data = VALID["jpeg-rgb"][0]()
    assert probe_image(data + bytes(60)).width == 50
    assert probe_image(data + b"\xde\xad" * 20).width == 50


def test_jpeg_with_a_video_appended_after_end_marker_is_accepted() -> None:
    # Phone "motion photos" append an MP4 after the JPEG's end-of-image marker.
    data = VALID["jpeg-rgb"][0]()
    video = b"\x00\x00\x00\x18ftypmp42" + noise(100, 100).tobytes()
    assert probe_image(data + video).image_format == ImageFormat.JPEG


def test_jpeg_with_exif_thumbnail_is_still_caught_when_truncated() -> None:
    # The EXIF thumbnail carries its own FF D9: the slow path must not mistake it for the end.
    thumbnail = encode(rgb_image(8, 8), "JPEG")
    exif = Image.Exif()
    exif[0x010E] = "x" * 10
    base = encode(rgb_image(64, 64), "JPEG", exif=exif.tobytes())
    data = base[:2] + png_like_app1(thumbnail) + base[2:]
    assert probe_image(data).width == 64
    err = reject(data[: len(data) - 200])
    assert err.reason == "truncated"


def png_like_app1(payload: bytes) -> bytes:
    """An APP1 segment that holds ``payload`` (a whole JPEG thumbnail) verbatim."""
    body = b"Exif\x00\x00" + payload
    return b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body


def test_png_and_gif_with_trailing_bytes_are_accepted() -> None:
    png = VALID["png-rgb"][0]()
    gif = VALID["gif"][0]()
    assert probe_image(png + noise(10, 10).tobytes()).image_format == ImageFormat.PNG
    assert probe_image(gif + b"\x00" * 100).image_format == ImageFormat.GIF


def test_animated_gif_reports_first_frame() -> None:
    frames = [Image.new("P", (30, 20), k) for k in range(3)]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    info = probe_image(data, validate="full")
    assert (info.image_format, info.width, info.height, info.mode) == (ImageFormat.GIF, 30, 20,
                                                                       "P")


def test_max_pixels_above_pillows_own_limit_is_honoured() -> None:
    # 200 Mpx is past Pillow's default refusal threshold (2 x 89.5 Mpx): without bypassing it
    # Image.open would raise DecompressionBombError even though the caller allows 300 Mpx.
    data = raw_png(20_000, 10_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        info = probe_image(data, max_pixels=300_000_000)
    assert (info.width, info.height) == (20_000, 10_000)


def test_probe_does_not_change_pillow_globals() -> None:
    before = (Image.MAX_IMAGE_PIXELS,)
    probe_image(raw_png(20_000, 10_000), max_pixels=300_000_000)
    with pytest.raises(RejectedImageError):
        probe_image(raw_png(30_000, 30_000))
    assert (Image.MAX_IMAGE_PIXELS,) == before


# --- every rejection reason from real bytes ----------------------------------------------------

def test_empty_file() -> None:
    for data in (b"", memoryview(b""), np.zeros(0, dtype=np.uint8)):
        err = reject(data, name="a/empty.jpg")
        assert err.reason == "empty-file"
        assert "0 bytes" in err.message


@pytest.mark.parametrize("data, hint", [
    (b"This is not a JPEG, just text.\n", "b'This is not a JP'"),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:abcd\nsize 123\n", "git-LFS"),
    (b"<!DOCTYPE html><html><body>404 Not Found</body></html>", "HTML"),
    (bytes(range(256)) * 4, "bytes starting"),
    (b"\x00\x00\x00\x01Bud1" + bytes(500), "bytes starting"),  # a .DS_Store
])
def test_not_an_image(data: bytes, hint: str) -> None:
    err = reject(data, name="x.jpg")
    assert err.reason == "not-an-image"
    assert "expected a JPEG, PNG, WEBP, GIF, BMP or TIFF image" in err.message
    assert hint in err.message


@pytest.mark.parametrize("width, height", [(0, 10), (10, 0), (0, 0)])
def test_zero_sized_header_is_not_an_image(width: int, height: int) -> None:
    err = reject(raw_png(width, height))
    assert err.reason == "not-an-image"
    assert "zero width or height" in err.message


@pytest.mark.parametrize("fmt", ["PPM", "ICO", "TGA", "PCX", "SGI"])
def test_other_pillow_formats_are_accepted(fmt: str) -> None:
    info = probe_image(encode(rgb_image(), fmt), name=f"x.{fmt.lower()}")
    assert info.image_format == ImageFormat.BY_PIL_NAME[fmt] and info.width > 0


TRUNCATIONS = {
    "jpeg-half": lambda: VALID["jpeg-rgb"][0]()[: len(VALID["jpeg-rgb"][0]()) // 2],
    "jpeg-header-only": lambda: VALID["jpeg-rgb"][0]()[:200],
    "jpeg-tiny": lambda: b"\xff\xd8\xff\xe0\x00",
    "png-half": lambda: VALID["png-rgb"][0]()[: len(VALID["png-rgb"][0]()) // 2],
    "png-inside-ihdr": lambda: VALID["png-rgb"][0]()[:20],
    "png-no-iend": lambda: VALID["png-rgb"][0]()[:-12],
    "gif-half": lambda: VALID["gif"][0]()[: len(VALID["gif"][0]()) // 2],
    "gif-no-trailer": lambda: VALID["gif"][0]()[:-1],
    "webp-half": lambda: VALID["webp-rgb"][0]()[: len(VALID["webp-rgb"][0]()) // 2],
    "bmp-half": lambda: VALID["bmp"][0]()[: len(VALID["bmp"][0]()) // 2],
    "bmp-header-only": lambda: VALID["bmp"][0]()[:30],
    "tiff-half": lambda: VALID["tiff-rgb"][0]()[: len(VALID["tiff-rgb"][0]()) // 2],
    "tiff-header-only": lambda: VALID["tiff-rgb"][0]()[:12],
}


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data")
@pytest.mark.parametrize("validate", ["header", "full"])
@pytest.mark.parametrize("kind", sorted(TRUNCATIONS))
def test_truncated(kind: str, validate: str) -> None:
    err = reject(TRUNCATIONS[kind](), name=f"{kind}.bin", validate=validate)
    assert err.reason == "truncated", err.message
    assert "truncated" in err.message
    assert err.path == f"{kind}.bin"


def test_truncated_jpeg_message_says_expected_and_found() -> None:
    err = reject(TRUNCATIONS["jpeg-half"]())
    assert "end-of-image marker (FF D9)" in err.message
    assert "last 64 bytes" in err.message


def test_jpeg_header_garbage_is_decode_failed() -> None:
    # Starts like a JPEG and ends like one, but the segments in between are nonsense.
    data = b"\xff\xd8\xff\xc0\x00\x03" + bytes(200) + b"\xff\xd9"
    err = reject(data)
    assert err.reason == "decode-failed"
    assert "JPEG signature" in err.message


def test_corrupt_png_pixels_pass_header_mode_but_fail_full_mode() -> None:
    data = bytearray(VALID["png-rgb"][0]())
    start = data.index(b"IDAT") + 20
    for k in range(start, start + 40):
        data[k] ^= 0x55
    assert probe_image(bytes(data)).mode == "RGB"  # the header is intact
    err = reject(bytes(data), validate="full")
    assert err.reason == "decode-failed"
    assert "decoding the pixels failed" in err.message


def test_too_many_pixels_from_a_small_header() -> None:
    # 20000 x 20000 = 400 Mpx declared in a 70-byte file: refused before any allocation.
    err = reject(raw_png(20_000, 20_000), name="bomb.png", validate="full")
    assert err.reason == "too-many-pixels"
    assert "20000x20000" in err.message and str(DEFAULT_MAX_PIXELS) in err.message


def test_too_many_pixels_with_a_caller_limit() -> None:
    data = VALID["jpeg-rgb"][0]()
    assert probe_image(data, max_pixels=50 * 40).width == 50
    err = reject(data, max_pixels=50 * 40 - 1)
    assert err.reason == "too-many-pixels"
    assert "50x40 = 2000 pixels" in err.message


def test_gif_frame_larger_than_its_screen_is_too_many_pixels() -> None:
    # Pillow's GIF plugin grows the canvas to the frame and checks its own global limit while
    # reading; that DecompressionBombError must come out as a rejection, not escape.
    data = bytearray(VALID["gif"][0]())
    descriptor = 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0)
    while data[descriptor] == 0x21:  # skip extensions (label byte, then sub-blocks)
        descriptor += 2
        while data[descriptor]:
            descriptor += data[descriptor] + 1
        descriptor += 1
    assert data[descriptor] == 0x2C
    data[descriptor + 5:descriptor + 9] = struct.pack("<HH", 60_000, 60_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        err = reject(bytes(data))
    assert err.reason == "too-many-pixels"


def test_huge_gif_screen_is_too_many_pixels() -> None:
    data = bytearray(VALID["gif"][0]())
    data[6:10] = struct.pack("<HH", 40_000, 40_000)
    err = reject(bytes(data))
    assert err.reason == "too-many-pixels"


def test_rejection_carries_path_and_is_a_decode_error() -> None:
    err = reject(b"", name="cats/001.jpg")
    assert isinstance(err, DecodeError) and isinstance(err, PackerError)
    assert err.path == "cats/001.jpg"
    assert str(err).startswith("cats/001.jpg: ")


def test_rejection_without_name_has_no_dangling_prefix() -> None:
    err = reject(b"")
    assert err.path is None
    assert str(err) == err.message


def test_bad_arguments_are_value_errors() -> None:
    data = VALID["png-rgb"][0]()
    with pytest.raises(OptionError, match="validate"):
        probe_image(data, validate="pixels")
    with pytest.raises(OptionError, match="max_pixels"):
        probe_image(data, max_pixels=0)


# --- sample folders from scripts/make_sample.py ---------------------------------------------

def test_every_sample_format_probes_cleanly(sample_folder: Path) -> None:
    paths = sorted(p for p in sample_folder.rglob("*") if p.is_file())
    assert len(paths) == 18
    seen = set()
    for path in paths:
        info = probe_image(path.read_bytes(), name=str(path), validate="full")
        assert info.width >= 24 and info.height >= 24
        seen.add((info.image_format, info.mode))
    assert {(ImageFormat.JPEG, "RGB"), (ImageFormat.JPEG, "L"), (ImageFormat.JPEG, "CMYK"),
            (ImageFormat.PNG, "RGBA"), (ImageFormat.PNG, "P"), (ImageFormat.PNG, "I;16"),
            (ImageFormat.GIF, "P"), (ImageFormat.WEBP, "RGB"), (ImageFormat.BMP, "RGB"),
            (ImageFormat.TIFF, "RGB")} <= seen


@pytest.mark.parametrize("validate", ["header", "full"])
def test_bad_files_get_their_expected_reasons(tmp_path: Path, validate: str) -> None:
    import make_sample

    make_sample.make_image_folder(tmp_path, classes=3, per_class=1)
    expected = make_sample.add_bad_files(tmp_path)
    assert set(expected.values()) >= {"empty-file", "truncated", "not-an-image",
                                      "unsupported-format", "hidden-file"}
    for relative, reason in expected.items():
        path = tmp_path / relative
        if reason in ("dangling-symlink", "hidden-file"):
            continue  # discovery's business, not probe_image's
        err = reject(path.read_bytes(), name=relative, validate=validate)
        assert err.reason == reason, (relative, err.message)


def test_sample_generator_is_deterministic(tmp_path: Path) -> None:
    import make_sample

    formats = tuple(make_sample.FORMATS)
    first = make_sample.make_image_folder(tmp_path / "a", classes=2, per_class=6, seed=3,
                                          formats=formats)
    second = make_sample.make_image_folder(tmp_path / "b", classes=2, per_class=6, seed=3,
                                           formats=formats)
    assert [p.relative_to(tmp_path / "a") for p in first] == \
        [p.relative_to(tmp_path / "b") for p in second]
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
    assert first[0].relative_to(tmp_path / "a").as_posix() == "class_000/img_0000.jpg"


def test_big_folder_files_are_distinct_valid_jpegs(tmp_path: Path) -> None:
    import make_sample

    paths = make_sample.make_big_folder(tmp_path, 12, size_kb=20, classes=3)
    assert len(paths) == 12 and paths == sorted(paths)
    blobs = [p.read_bytes() for p in paths]
    assert len(set(blobs)) == 12
    for blob in blobs:
        assert 10_000 < len(blob) < 30_000
        assert probe_image(blob, validate="full").image_format == ImageFormat.JPEG


def test_make_sample_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import make_sample

    assert make_sample.main([str(tmp_path / "out"), "--classes", "2", "--per-class", "3",
                             "--formats", "png,gif", "--bad"]) == 0
    bad = json.loads(capsys.readouterr().out)
    assert bad["class_000/bad_empty.jpg"] == "empty-file"
    assert len(list((tmp_path / "out").rglob("img_*"))) == 6
    with pytest.raises(SystemExit) as usage:
        make_sample.main([str(tmp_path / "x"), "--formats", "jpeg,heic"])
    assert usage.value.code == 2


# --- robustness: mutated bytes give an ImageInfo or a RejectedImageError, nothing else ----------

_SEEDS = {kind: VALID[kind][0]() for kind in ("jpeg-rgb", "png-rgb", "gif", "webp-rgb", "bmp",
                                              "tiff-rgb", "png-palette")}


@pytest.mark.filterwarnings("ignore::UserWarning")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(_SEEDS)), data=st.data())
def test_mutations_never_crash(kind: str, data: st.DataObject) -> None:
    blob = bytearray(_SEEDS[kind])
    action = data.draw(st.sampled_from(["truncate", "flip", "extend", "splice"]))
    if action == "truncate":
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    elif action == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            position = data.draw(st.integers(0, len(blob) - 1))
            blob[position] ^= data.draw(st.integers(1, 255))
    elif action == "extend":
        blob += data.draw(st.binary(min_size=1, max_size=200))
    else:
        position = data.draw(st.integers(0, len(blob)))
        blob[position:position] = data.draw(st.binary(min_size=1, max_size=64))
    validate = data.draw(st.sampled_from(["header", "full"]))
    try:
        info = probe_image(bytes(blob), validate=validate)
    except RejectedImageError as err:
        assert err.reason in REASONS
    else:
        assert info.width > 0 and info.height > 0
        assert info.image_format in (ImageFormat.JPEG, ImageFormat.PNG, ImageFormat.GIF,
                                     ImageFormat.WEBP, ImageFormat.BMP, ImageFormat.TIFF)


# --- imageinfo ------------------------------------------------------------------------------------


def _encoded(fmt_name: str, **options: Any) -> bytes:
    rng = np.random.default_rng(7)
    buffer = _io.BytesIO()
    if fmt_name == "GIF":
        frames = [Image.fromarray(rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)).convert("P") for _ in range(3)]
        frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=40)
    else:
        Image.fromarray(rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)).save(buffer, fmt_name, **options)
    return buffer.getvalue()


def _exif_jpeg() -> bytes:
    """A JPEG whose EXIF segment holds a whole JPEG thumbnail (so an FF D9 sits before the scan)."""
    thumb = _encoded("JPEG", quality=50)
    app1 = b"Exif\x00\x00" + thumb
    segment = b"\xff\xe1" + (len(app1) + 2).to_bytes(2, "big") + app1
    main = _encoded("JPEG", quality=90)
    return main[:2] + segment + main[2:]


IMAGES = {"jpeg": lambda: _encoded("JPEG", quality=90), "jpeg-exif": _exif_jpeg,
          "jpeg-restart": lambda: _encoded("JPEG", quality=90, restart_marker_blocks=1),
          "png": lambda: _encoded("PNG"), "gif": lambda: _encoded("GIF"), "bmp": lambda: _encoded("BMP"),
          "webp": lambda: _encoded("WEBP", quality=80)}


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_every_cut_is_refused_and_appended_bytes_are_not(kind: str) -> None:
    data = IMAGES[kind]()
    probe_image(data, name=f"ok.{kind}")
    # a PNG cut inside its IEND chunk's CRC still holds every pixel: only cuts before "IEND" count
    end = len(data) - 8 if kind == "png" else len(data)
    cuts = sorted(set(range(1, end, max(1, len(data) // 97))) | {end - 1, end - 2, 8, 13})
    for cut in cuts:
        with pytest.raises(RejectedImageError) as caught:
            probe_image(data[:cut], name=f"cut.{kind}")
        assert caught.value.reason in ("truncated", "not-an-image", "decode-failed"), (kind, cut)
        assert caught.value.path == f"cut.{kind}"
    if kind.startswith(("jpeg", "png", "gif")):  # bytes after the end (a phone's motion photo) are fine
        probe_image(data + bytes(range(200)) * 2, name=f"long.{kind}")


def test_truncation_messages() -> None:
    png = IMAGES["png"]()
    with pytest.raises(RejectedImageError) as caught:
        probe_image(png[:-12], name="x.png")
    assert caught.value.reason == "truncated"
    idat = png.rindex(b"IDAT") - 4
    assert caught.value.message == (f"PNG has no IEND chunk: expected chunks up to IEND, but the file ({len(png) - 12} "
                                    f"bytes) ends after 'IDAT' at offset {idat}: the file is truncated")
    probe_image(png + bytes(100), name="x.png")  # bytes after IEND: the chunk walk finds IEND
    jpeg = IMAGES["jpeg-exif"]()
    with pytest.raises(RejectedImageError) as caught:
        probe_image(jpeg[:-2] + bytes(100), name="x.jpg")
    assert caught.value.message == ("JPEG has no end-of-image marker (FF D9) in its last 64 bytes, nor after the start "
                                    f"of its scan data: the file ({len(jpeg) + 98} bytes) is truncated")
    probe_image(jpeg + bytes(100), name="x.jpg")  # its end is found after the scan, not in the thumbnail
    gif = IMAGES["gif"]()
    with pytest.raises(RejectedImageError) as caught:
        probe_image(gif[:-1], name="x.gif")
    assert caught.value.message == ("GIF ends without its trailer byte (0x3B) after 3 complete frame(s): expected the "
                                    f"block structure to end with 0x3B within the file ({len(gif) - 1} bytes): "
                                    "the file is truncated")
    with pytest.raises(RejectedImageError) as caught:
        probe_image(gif[:12], name="x.gif")
    assert caught.value.reason == "truncated"


@pytest.mark.parametrize("data, text", [
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:0\n",
     "a git-LFS pointer file (the image was never fetched: run `git lfs pull`)"),
    (b"  \n<!DOCTYPE html><html></html>", "an HTML page (a failed download?)"),
    (b"\t<HTML><body>403</body></HTML>", "an HTML page (a failed download?)"),
    (b"hello, this is plain text and more", "bytes starting b'hello, this is p'"),
])
def test_not_an_image_says_what_it_looks_like(data: bytes, text: str) -> None:
    with pytest.raises(RejectedImageError) as caught:
        probe_image(data, name="a.jpg")
    assert caught.value.reason == "not-an-image" and caught.value.path == "a.jpg"
    assert caught.value.message == f"expected a JPEG, PNG, WEBP, GIF, BMP or TIFF image, found {text}"


def test_full_validation_names_damaged_pixels() -> None:
    png = bytearray(IMAGES["png"]())
    start = png.index(b"IDAT") + 4
    png[start + 2:start + 40] = bytes(38)  # zlib data damaged, the header intact
    with pytest.raises(RejectedImageError) as caught:
        probe_image(bytes(png), name="d.png", validate="full")
    assert caught.value.path == "d.png"
    assert caught.value.reason in ("decode-failed", "truncated")
    assert caught.value.message.startswith("PNG ")
    assert probe_image(IMAGES["png"](), validate="full").channels == 3


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning", "ignore:Truncated File Read:UserWarning")  # Pillow, on purpose
@pytest.mark.parametrize("options", [{}, {"compression": "tiff_lzw"}, {"compression": "tiff_deflate"}])
def test_every_cut_of_a_tiff_is_refused(options: dict[str, Any]) -> None:
    data = _encoded("TIFF", **options)
    probe_image(data, name="ok.tif")
    for cut in sorted(set(range(1, len(data), max(1, len(data) // 97))) | {len(data) - 1, 8, 9}):
        with pytest.raises(RejectedImageError) as caught:
            probe_image(data[:cut], name="cut.tif")
        assert caught.value.reason in ("truncated", "not-an-image", "decode-failed"), cut


# --- imageinfo: exact rejections, the structure walkers' edges, buffers ---------------------------


def _rejection(data: Any, **options: Any) -> tuple[str, str, str | None]:
    with pytest.raises(RejectedImageError) as caught:
        probe_image(data, **options)
    return caught.value.reason, caught.value.message, caught.value.path


def _png(width: int, height: int) -> bytes:
    buffer = _io.BytesIO()
    Image.new("RGB", (width, height), (9, 8, 7)).save(buffer, "PNG")
    return buffer.getvalue()


def test_probe_limits_and_thin_images() -> None:
    for width, height in [(1, 5), (5, 1), (1, 1)]:
        assert probe_image(_png(width, height), max_pixels=width * height).width == width
    assert _rejection(_png(30, 20), name="p.png", max_pixels=100) == (
        "too-many-pixels", "image is 30x20 = 600 pixels; the limit (max_pixels) is 100", "p.png")
    assert _rejection(b"", name="e.png") == ("empty-file", "the file is empty (0 bytes); expected image data", "e.png")
    with pytest.raises(OptionError, match="^max_pixels must be at least 1, got 0$"):
        probe_image(_png(1, 1), max_pixels=0)


def test_probe_rejections_name_the_file() -> None:
    big_ppm = b"P6\n20000 20000\n255\n" + bytes(10)
    reason, message, path = _rejection(big_ppm, name="big.ppm")
    assert (reason, path) == ("too-many-pixels", "big.ppm") and message.startswith("Pillow refused the image: ")
    garbage = b"\xff\xd8\xff\xc0\x00\x03" + bytes(200) + b"\xff\xd9"
    reason, message, path = _rejection(garbage, name="g.jpg")
    assert (reason, path) == ("decode-failed", "g.jpg")
    assert re.fullmatch(r"starts with the JPEG signature but its header cannot be parsed: SyntaxError: \S.*", message), message
    import zlib

    zero = bytearray(_png(3, 3))
    zero[16:20] = (0).to_bytes(4, "big")  # IHDR width 0, its CRC fixed
    zero[29:33] = zlib.crc32(bytes(zero[12:29])).to_bytes(4, "big")
    assert _rejection(bytes(zero), name="z.png") == (
        "not-an-image", "PNG header gives a zero width or height (or no pixel mode); expected at least 1x1 pixels",
        "z.png")
    assert _rejection(b"hello, plain text bytes", name="t.jpg", show_bytes=False) == (
        "not-an-image", "expected a JPEG, PNG, WEBP, GIF, BMP or TIFF image, found bytes that are not an image "
        "(not quoted: the file lies outside the source folder)", "t.jpg")
    # only the first 64 bytes are looked at: an HTML start that ends past them is just bytes
    late_html = b" " * 51 + b"<!doctype html><html></html>"
    assert _rejection(late_html)[1].endswith(f"found bytes starting {late_html[:16]!r}")
    assert _rejection(b" " * 50 + b"<!doctype html>")[1].endswith("found an HTML page (a failed download?)")


def test_full_validation_of_cut_pixel_data_is_truncated() -> None:
    """A PNG whose IDAT holds half its zlib stream (chunk length and CRC fixed): the header is fine."""
    import zlib

    buffer = _io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buffer, "PNG")
    png = buffer.getvalue()
    at = png.index(b"IDAT") - 4
    length = int.from_bytes(png[at:at + 4], "big")
    half = png[at + 8:at + 8 + length][:length // 2]
    chunk = struct.pack(">I", len(half)) + b"IDAT" + half + struct.pack(">I", zlib.crc32(b"IDAT" + half))
    cut = png[:at] + chunk + png[at + 12 + length:]
    assert probe_image(cut).width == 32
    reason, message, path = _rejection(cut, name="c.png", validate="full")
    assert (reason, path) == ("truncated", "c.png")
    assert message.startswith("PNG pixel data ends early while decoding: OSError: image file is truncated"), message


def _gif(*, global_table: bool = True, flags: int | None = None, local_flags: int = 0x00, stray: bytes = b"",
         comment: bytes = b"", trailer: bool = True, lead: bytes = b"", table_end: int = 0) -> bytes:
    """A hand-made 1x1 GIF: header, optional global colour table, an optional comment extension,
    one image (optional local table), LZW data, optional stray bytes, the trailer."""
    if flags is None:
        flags = 0x80 if global_table else 0x00
    head = b"GIF89a" + struct.pack("<HH", 1, 1) + bytes([flags, 0, 0])
    table = (bytes((3 << ((flags & 7) + 1)) - 1) + bytes([table_end])) if flags & 0x80 else b""
    table += lead
    extension = b"\x21\xfe" + bytes([len(comment)]) + comment + b"\x00" if comment else b""
    local = bytes(3 << ((local_flags & 7) + 1)) if local_flags & 0x80 else b""
    image = b"\x2c" + struct.pack("<HHHH", 0, 0, 1, 1) + bytes([local_flags]) + local + b"\x02\x02\x44\x01\x00"
    return head + table + extension + image + stray + (b";" if trailer else b"")


def _gif_truncated(frames: int, size: int) -> str:
    return (f"GIF ends without its trailer byte (0x3B) after {frames} complete frame(s): expected the block structure "
            f"to end with 0x3B within the file ({size} bytes): the file is truncated")


def test_gif_walker_tables_extensions_and_stray_bytes() -> None:
    problem = imageinfo_module._gif_problem
    for data in [_gif(), _gif(global_table=False, local_flags=0x80), _gif(global_table=False, flags=0x01),
                 _gif(local_flags=0x01), _gif(local_flags=0x81), _gif(stray=b"\x00"), _gif(stray=b"\x00\x07\x00"),
                 _gif(comment=b"a,b;c"), _gif(table_end=0x2C, lead=b"\x00"), _gif(table_end=0x3B, lead=b"\x07")]:
        assert problem(data) is None, data
    ends_in_stray = _gif(trailer=False, stray=b"\x00\x07")
    assert problem(ends_in_stray) == _gif_truncated(1, len(ends_in_stray))
    for data, frames in [(_gif(trailer=False), 1), (_gif(global_table=False, flags=0x01, trailer=False), 1),
                         (_gif(global_table=False, local_flags=0x80, trailer=False), 1)]:
        assert problem(data) == _gif_truncated(frames, len(data)), data
    commented = _gif(comment=b"x;y,z" * 10)
    inside = commented.index(b"x;y")  # cut inside the comment: a 0x3B there is data, not the trailer
    for cut in (inside + 3, inside + 20):
        assert problem(commented[:cut]) == _gif_truncated(0, cut)
    image = _gif().index(b"\x2c")
    for cut in (image + 5, image + 9):  # inside the image descriptor
        assert problem(_gif()[:cut]) == _gif_truncated(0, cut)
    lzw_end = len(_gif()) - 1  # after the LZW sub-blocks' terminator, before the trailer
    assert problem(_gif()[:lzw_end - 1]) == _gif_truncated(1, lzw_end - 1)  # a sub-block chain that runs out
    assert problem(b"GIF89a" + bytes(7)) == _gif_truncated(0, 13)
    assert problem(b"GIF89a" + bytes(6)) == "GIF is 12 bytes, shorter than its 13-byte header: the file is truncated"


def test_gif_plugin_warnings_are_not_shown(tmp_path: Path) -> None:
    """A GIF whose screen is over Pillow's warning size (89 Mpx) but within the caller's limit."""
    data = bytearray(_gif())
    data[6:10] = struct.pack("<HH", 10_000, 10_000)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            probe_image(bytes(data), max_pixels=200_000_000)
        except RejectedImageError:
            pass
    assert not [w for w in seen if issubclass(w.category, Image.DecompressionBombWarning)]


def test_webp_png_and_tiff_cut_messages() -> None:
    webp = _encoded("WEBP")
    assert imageinfo_module._webp_problem(webp[:11]) == "WEBP is 11 bytes, shorter than its 12-byte RIFF header: truncated"
    assert imageinfo_module._webp_problem(webp[:12]) == (
        f"WEBP RIFF header says the file is {len(webp)} bytes, found 12: the file is truncated")
    png = _png(4, 4)
    assert imageinfo_module._png_problem(png[:12]) == (
        "PNG has no IEND chunk: expected chunks up to IEND, but the file (12 bytes) ends after the signature: the file "
        "is truncated")
    idat = png.index(b"IDAT") - 4
    assert imageinfo_module._png_problem(png[:idat + 8]) == (
        f"PNG has no IEND chunk: expected chunks up to IEND, but the file ({idat + 8} bytes) ends after 'IDAT' at "
        f"offset {idat}: the file is truncated")
    cases = [
        (b"II*\x00\x08\x00", "TIFF is 6 bytes, shorter than its 8-byte header: the file is truncated"),
        (b"II+\x00\x08\x00\x00\x00\x10\x00\x00", "TIFF is 11 bytes, shorter than its 16-byte header: the file is truncated"),
        (b"II*\x00\x64\x00\x00\x00", "TIFF header points to its first directory at offset 100, but the file has 8 bytes: "
                                     "the file is truncated"),
        (b"MM\x00*\x00\x00\x00\x08\x00\x05\x00\x00", "TIFF directory at offset 8 has 5 entries ending at byte 70, but "
                                                     "the file has 12 bytes: the file is truncated"),
        (b"II+\x00\x08\x00\x00\x00\x10" + bytes(7) + b"\x02" + bytes(7) + bytes(10),
         "TIFF directory at offset 16 has 2 entries ending at byte 64, but the file has 34 bytes: the file is truncated"),
        (b"II*\x00\x08\x00\x00\x00\x01\x00" + bytes(12), None),
        (b"II*\x00\x08\x00\x00\x00\x00\x00", None),  # an empty directory ending exactly at the end
        (b"II*\x00\x08\x00\x00\x00\x00", "TIFF header points to its first directory at offset 8, but the file has 9 "
                                            "bytes: the file is truncated"),
    ]
    for data, expected in cases:
        assert imageinfo_module._tiff_ifd_problem(data) == expected, data
        if expected is not None:
            assert _rejection(data, name="t.tif") == ("truncated", expected, "t.tif")


def _tiff_with_strip_offsets_type(field_type: int) -> bytes:
    buffer = _io.BytesIO()
    Image.new("L", (8, 6), 5).save(buffer, "TIFF")
    data = bytearray(buffer.getvalue())
    assert data[:4] == b"II*\x00"
    ifd = int.from_bytes(data[4:8], "little")
    for k in range(int.from_bytes(data[ifd:ifd + 2], "little")):
        entry = ifd + 2 + 12 * k
        if int.from_bytes(data[entry:entry + 2], "little") == 273:
            assert int.from_bytes(data[entry + 2:entry + 4], "little") in (3, 4)
            data[entry + 2:entry + 4] = field_type.to_bytes(2, "little")
    return bytes(data)


def test_tiff_offsets_of_a_signed_type_are_refused_by_name() -> None:
    assert _rejection(_tiff_with_strip_offsets_type(9), name="s.tif") == (
        "decode-failed", "TIFF header field StripOffsets: expected type SHORT, LONG or LONG8, got SLONG", "s.tif")
    buffer = _io.BytesIO()
    Image.new("L", (8, 6), 5).save(buffer, "TIFF")
    tiff = buffer.getvalue()
    with Image.open(_io.BytesIO(tiff)) as img:
        end = max(o + c for o, c in zip(img.tag_v2[273], img.tag_v2[279]))
    assert _rejection(tiff[:end - 1], name="c.tif") == (
        "truncated", f"TIFF image data extends to byte {end} (strip/tile offsets plus byte counts), found {end - 1} "
                     f"bytes: the file is truncated", "c.tif")


def _jpeg_with(segments: bytes, *, junk: int = 100, end: bool = True) -> bytes:
    """A real JPEG with ``segments`` inserted after SOI, optionally without its end marker, then junk."""
    jpeg = jpeg_bytes(16, 16)
    body = jpeg[2:-2] + (b"\xff\xd9" if end else b"")
    return jpeg[:2] + segments + body + bytes(junk)


def test_jpeg_walker_fill_bytes_and_markers_without_length() -> None:
    problem = imageinfo_module._jpeg_problem
    headers = [b"\xff\xff\xff\xfe\x00\x04ab", b"\xff\x01", b"\xff\xd0", b"\xff\xd7", b"\xff\xd8\x00\x04ab",
               b"\xff\x01\xff\xff\xd3\xff\xfe\x00\x03x"]
    for segments in headers:
        assert problem(_jpeg_with(segments)) is None, segments  # the end marker is found after the scan starts
        cut = _jpeg_with(segments, end=False)
        assert problem(cut) == (f"JPEG has no end-of-image marker (FF D9) in its last 64 bytes, nor after the start of "
                                f"its scan data: the file ({len(cut)} bytes) is truncated"), segments
    # an FF D9 inside a header segment (a comment here, an EXIF thumbnail in practice) is not the end
    comment = b"\xff\xfe\x00\x04\xff\xd9"
    assert problem(_jpeg_with(comment, end=False)) is not None
    jpeg = jpeg_bytes(16, 16)
    sos = jpeg.index(b"\xff\xda")
    late_comment = jpeg[:sos] + comment + jpeg[sos:-2] + bytes(100)
    assert problem(late_comment) is not None
    scan_end = jpeg[:sos] + b"\xff\xda\x00\x02" + b"\xff\xd9" + bytes(100)  # an empty scan right before the end
    assert problem(scan_end) is None


def test_byte_view_flattens_any_contiguous_buffer() -> None:
    data = bytes(range(12))
    assert imageinfo_module.byte_view(data) is data
    for buffer in (bytearray(data), memoryview(data), np.frombuffer(data, dtype=np.uint8).reshape(3, 4),
                   np.frombuffer(data, dtype=np.int8), np.frombuffer(data, dtype=np.uint16),
                   memoryview(data).cast("B", (2, 6))):
        view = imageinfo_module.byte_view(buffer)
        assert isinstance(view, memoryview) and view.format == "B" and view.ndim == 1, type(buffer)
        assert view.tobytes() == data and list(view) == list(data)
    strided = np.arange(24, dtype=np.uint8)[::2]
    assert imageinfo_module.byte_view(strided) == strided.tobytes()


def test_exception_descriptions_and_mode_channels() -> None:
    assert imageinfo_module._describe(ValueError("bad thing")) == "ValueError: bad thing"
    assert imageinfo_module._describe(EOFError()) == "EOFError"
    assert [imageinfo_module._mode_channels(m) for m in ("L", "LA", "RGB", "RGBA", "I;16", "no-such-mode")] == [
        1, 2, 3, 4, 1, 0]


def test_plugin_factory_without_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(imageinfo_module._PIL_PLUGIN, fmt.ImageFormat.WEBP, "NO-SUCH-PLUGIN")
    assert imageinfo_module.plugin_factory(fmt.ImageFormat.WEBP) is None
    assert imageinfo_module.plugin_factory(fmt.ImageFormat.UNKNOWN) is None


def test_jpeg_walker_fill_bytes_to_the_end() -> None:
    data = b"\xff\xd8" + b"\xff" * 100
    assert imageinfo_module._jpeg_problem(data) == (
        "JPEG has no end-of-image marker (FF D9) in its last 64 bytes, nor after the start of its scan data: the file "
        "(102 bytes) is truncated")


def test_other_pillow_formats_are_checked_with_the_file_and_its_name() -> None:
    buffer = _io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "PPM")
    ppm = buffer.getvalue()
    reason, message, path = _rejection(ppm[:-5], name="x.ppm")
    assert (reason, path) == ("truncated", "x.ppm")
    assert message.startswith("PPM pixel data ends early while decoding: ") and message.endswith(
        f"(the file, {len(ppm) - 5} bytes, is truncated)"), message


class _FakeImage:
    """What _check_opened and the BMP/TIFF checks read from a Pillow image, set by hand: the values a
    hostile header can make a plugin report."""

    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)


def test_check_opened_refuses_sizes_and_modes_pillow_should_not_give() -> None:
    png = _png(3, 3)
    check = imageinfo_module._check_opened
    for size in [(0, 5), (5, 0), (0, 0), (-1, 3), (3, -2)]:
        with pytest.raises(RejectedImageError) as caught:
            check(png, _FakeImage(size=size, mode="RGB", format="PNG"), "PNG", "x.png", "header", 100)
        assert (caught.value.reason, caught.value.path) == ("not-an-image", "x.png")
        assert caught.value.message == f"PNG header gives a size of {size[0]}x{size[1]}; expected at least 1x1 pixels"
    for size in [(True, 3), (3, 2.0), (3, None)]:
        with pytest.raises(imageinfo_module._BadField) as caught:
            check(png, _FakeImage(size=size, mode="RGB", format="PNG"), "PNG", "x.png", "header", 100)
        assert str(caught.value) == f"size: expected integer width and height, got {size[0]!r} x {size[1]!r}"
    with pytest.raises(imageinfo_module._BadField, match=r"^mode: expected a Pillow mode name, got 5$"):
        check(png, _FakeImage(size=(3, 3), mode=5, format="PNG"), "PNG", "x.png", "header", 100)
    assert check(png, _FakeImage(size=(3, 3), mode="RGB", format="PNG"), "PNG", None, "header", 9).width == 3


def test_a_check_that_trips_is_a_decode_failure_naming_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("a field nobody validated")

    monkeypatch.setattr(imageinfo_module, "_truncation_problem", broken)
    assert _rejection(_png(3, 3), name="b.png") == (
        "decode-failed", "PNG header cannot be checked: RuntimeError: a field nobody validated", "b.png")


def _bmp(tile: Any) -> _FakeImage:
    return _FakeImage(tile=tile)


def test_bmp_pixel_array_check_cases() -> None:
    problem = imageinfo_module._bmp_problem
    view = bytes(80)

    def needs(end: int, rows: int, stride: int, offset: int) -> str:
        return (f"BMP pixel array needs {end} bytes ({rows} rows of {stride} bytes from offset {offset}), found 80: "
                f"the file is truncated")

    assert problem(view, _bmp([("raw", (0, 0, 4, 3), 54, ("BGR", 12, -1))])) == needs(90, 3, 12, 54)
    assert problem(view, _bmp([("raw", (0, 2, 4, 5), 54, ("BGR", 12))])) == needs(90, 3, 12, 54)
    assert problem(bytes(62), _bmp([("raw", (0, 0, 4, 3), 60, ("BGR", 1))])) == (
        "BMP pixel array needs 63 bytes (3 rows of 1 bytes from offset 60), found 62: the file is truncated")
    assert problem(view, _bmp([("raw", (0, 0, 4, 3), 0, ("BGR", 12))])) is None  # offset 0 is allowed
    assert problem(view, _bmp([("raw", (0, 3, 4, 3), 90, ("BGR", 12))])) == needs(90, 0, 12, 90)  # no rows
    for tiles in ([("raw", (0, 0, 4, 3), 54, ("BGR", 12)), ("raw", (0, 0, 4, 3), 54, ("BGR", 12))],
                  [("bmp_rle", (0, 0, 4, 3), 54, ("BGR", 12))],
                  [("raw", (0, 0, 4, 3), 200, "BGR")], [("raw", (0, 0, 4, 3), 200, ("BGR",))],
                  [("raw", (0, 0, 4, 3), 200, ("BGR", "x"))], [("raw", (0, 0, 4, 3), 200, ("BGR", 0))], []):
        assert problem(view, _bmp(tiles)) is None, tiles
    assert problem(view, _FakeImage()) is None  # no tile attribute at all
    refused = [((0, 0, 4, 3), -1, "pixel data offset: expected a non-negative integer, got -1"),
               ((0, 0, 4, 3), 5.0, "pixel data offset: expected a non-negative integer, got 5.0"),
               ((0, 0, 4), 54, "pixel array extent: expected 4 ordered integers, got (0, 0, 4)"),
               ((0, 5, 4, 3), 54, "pixel array extent: expected 4 ordered integers, got (0, 5, 4, 3)"),
               ((0, 0, 4.0, 3), 54, "pixel array extent: expected 4 ordered integers, got (0, 0, 4.0, 3)"),
               ([0, 0, 4, 3], 54, "pixel array extent: expected 4 ordered integers, got [0, 0, 4, 3]")]
    for extents, offset, message in refused:
        with pytest.raises(imageinfo_module._BadField) as caught:
            problem(view, _bmp([("raw", extents, offset, ("BGR", 12))]))
        assert str(caught.value) == message


class _Tags(dict):
    """A TIFF tag directory as Pillow exposes it: values by tag, and their field types."""

    def __init__(self, values: dict[int, Any], types: dict[int, int] | None) -> None:
        super().__init__(values)
        if types is not None:
            self.tagtype = types


def test_tiff_offset_fields_and_strip_or_tile_ends() -> None:
    integers = imageinfo_module._tiff_integers
    assert integers(_Tags({273: 5}, {273: 4}), 273) == (5,)
    assert integers(_Tags({273: (0, 7)}, {273: 3}), 273) == (0, 7)
    assert integers(_Tags({}, {}), 279) is None
    for tags, message in [(_Tags({273: (5,)}, None), "StripOffsets: expected type SHORT, LONG or LONG8, got type None"),
                          (_Tags({279: (5,)}, {279: 99}), "StripByteCounts: expected type SHORT, LONG or LONG8, got type 99"),
                          (_Tags({324: ()}, {324: 16}), "TileOffsets: expected at least one value, got none"),
                          (_Tags({325: (3, -1)}, {325: 4}), "TileByteCounts: expected non-negative integers, got -1"),
                          (_Tags({273: (2.5,)}, {273: 4}), "StripOffsets: expected non-negative integers, got 2.5")]:
        tag = next(iter(tags))
        with pytest.raises(imageinfo_module._BadField) as caught:
            integers(tags, tag)
        assert str(caught.value) == message
    tiff = imageinfo_module._tiff_problem
    tiles = _Tags({324: (8, 40), 325: (30, 30)}, {324: 4, 325: 4})
    assert tiff(bytes(70), _FakeImage(tag_v2=tiles)) is None
    assert tiff(bytes(69), _FakeImage(tag_v2=tiles)) == (
        "TIFF image data extends to byte 70 (strip/tile offsets plus byte counts), found 69 bytes: the file is truncated")
    assert tiff(bytes(10), _FakeImage(tag_v2=_Tags({273: (8,)}, {273: 4}))) is None  # offsets without counts
    with pytest.raises(imageinfo_module._BadField) as caught:
        tiff(bytes(10), _FakeImage(tag_v2=_Tags({273: (8, 9), 279: (1,)}, {273: 4, 279: 4})))
    assert str(caught.value) == ("StripOffsets: 2 values, but StripByteCounts has 1; expected one byte count per "
                                 "offset")


# --- imageinfo: the WEBP truncation check counts the 8-byte RIFF header ---------------------------


def _webp() -> bytes:
    buffer = io.BytesIO()
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 256, (32, 40, 3), dtype=np.uint8)).save(buffer, "WEBP", quality=80)
    return buffer.getvalue()


@pytest.mark.parametrize("cut", [1, 4, 7, 8])
def test_webp_cut_by_a_few_bytes_is_truncated(cut: int) -> None:
    """Mutant: RIFF end = size field (the 8 bytes of 'RIFF' + size forgotten): cuts < 8 bytes pass."""
    data = _webp()
    assert int.from_bytes(data[4:8], "little") + 8 == len(data)
    assert probe_image(data, name="ok.webp").image_format == ImageFormat.WEBP
    with pytest.raises(RejectedImageError) as caught:
        probe_image(data[:-cut], name="cut.webp")
    assert caught.value.reason == "truncated"
    assert f"says the file is {len(data)} bytes, found {len(data) - cut}" in caught.value.message
