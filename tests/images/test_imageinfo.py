"""Tests for packer.imageinfo: format detection, header facts, and every rejection reason."""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from dataclasses import FrozenInstanceError
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from packer.errors import DecodeError, PackerError, RejectedImageError
from packer.format import ImageFormat
from packer.imageinfo import DEFAULT_MAX_PIXELS, ImageInfo, detect_format, probe_image

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
    with pytest.raises(ValueError, match="validate"):
        probe_image(data, validate="pixels")
    with pytest.raises(ValueError, match="max_pixels"):
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
