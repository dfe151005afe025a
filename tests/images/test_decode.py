"""Tests for packer.decode: the decoding rule for every mode, input types, and typed errors."""

from __future__ import annotations

import io
import mmap
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

import packer.decode
from packer.dataset import open_dataset
from packer.decode import decode_image, decode_jpeg_rgb
from packer.errors import DecodeError, RejectedImageError
from packer.format import ImageFormat
from packer._internal.imageinfo import probe_image
from packer.writer import build
from packer.writer.plan import BuildOptions


def encode(img: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, fmt, **options)
    return buffer.getvalue()


def pillow_open(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data))


def photo(height: int = 375, width: int = 500, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus noise: JPEG-friendly, like a photo rather than pure noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 255 / width, yy * 255 / height, (xx + yy) * 127 / (width + height)], -1)
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def noise(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=shape, dtype=np.uint8)


def gray3(gray: np.ndarray) -> np.ndarray:
    return np.repeat(gray[:, :, None], 3, axis=2)


def check_output(pixels: np.ndarray, height: int, width: int) -> None:
    assert pixels.dtype == np.uint8
    assert pixels.shape == (height, width, 3)
    assert pixels.flags.c_contiguous and pixels.flags.writeable


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return (struct.pack(">I", len(payload)) + kind + payload
            + struct.pack(">I", zlib.crc32(kind + payload)))


def png_rgb16(samples: np.ndarray) -> bytes:
    """A 16-bit-per-channel RGB PNG (Pillow cannot write one), rows unfiltered."""
    height, width, _ = samples.shape
    rows = b"".join(b"\x00" + samples[y].astype(">u2").tobytes() for y in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
            + png_chunk(b"IDAT", zlib.compress(rows)) + png_chunk(b"IEND", b""))


# --- JPEG -------------------------------------------------------------------------------------

def test_rgb_jpeg_simplejpeg_agrees_with_pillow() -> None:
    data = encode(Image.fromarray(photo()), "JPEG", quality=90)
    ours = decode_image(data)
    check_output(ours, 375, 500)
    reference = np.asarray(pillow_open(data).convert("RGB"))
    difference = np.abs(ours.astype(np.int16) - reference.astype(np.int16))
    assert difference.mean() < 2
    assert difference.max() <= 8


def test_jpeg_fast_path_is_simplejpeg() -> None:
    data = encode(Image.fromarray(photo(60, 80)), "JPEG")
    expected = simplejpeg.decode_jpeg(data, colorspace="RGB")
    assert np.array_equal(decode_image(data), expected)
    assert np.array_equal(decode_image(data, ImageFormat.JPEG), expected)
    assert np.array_equal(decode_jpeg_rgb(data), expected)


def test_grayscale_jpeg_is_replicated_to_three_channels() -> None:
    data = encode(Image.fromarray(photo(60, 80)).convert("L"), "JPEG")
    pixels = decode_image(data)
    check_output(pixels, 60, 80)
    assert np.array_equal(pixels[:, :, 0], pixels[:, :, 1])
    assert np.array_equal(pixels[:, :, 0], pixels[:, :, 2])
    reference = np.asarray(pillow_open(data))
    assert np.abs(pixels[:, :, 0].astype(int) - reference).max() <= 1


def test_cmyk_jpeg_goes_through_pillow() -> None:
    cmyk = np.dstack([noise(40, 50, 3, seed=1), noise(40, 50, seed=2) // 2])
    data = encode(Image.fromarray(cmyk, "CMYK"), "JPEG", quality=95)
    pixels = decode_image(data)
    check_output(pixels, 40, 50)
    stored = pillow_open(data)
    assert stored.mode == "CMYK"
    assert np.array_equal(pixels, np.asarray(stored.convert("RGB")))
    # The documented formula, R = (255 - C) * (255 - K) / 255, within rounding.
    c = np.asarray(stored).astype(np.int32)
    formula = (255 - c[:, :, :3]) * (255 - c[:, :, 3:]) / 255
    assert np.abs(pixels - formula).max() <= 1
    assert np.array_equal(decode_jpeg_rgb(data), pixels)


def test_mpo_decodes_its_first_image() -> None:
    first, second = Image.new("RGB", (16, 8), (250, 0, 0)), Image.new("RGB", (16, 8), (0, 0, 250))
    data = encode(first, "MPO", save_all=True, append_images=[second])
    pixels = decode_image(data)
    check_output(pixels, 8, 16)
    assert pixels[:, :, 0].min() > 200 and pixels[:, :, 2].max() < 50


def test_exif_orientation_is_not_applied() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    pixels = photo(40, 64)
    data = encode(Image.fromarray(pixels), "JPEG", quality=95, exif=exif.tobytes())
    assert pillow_open(data).getexif()[0x0112] == 6
    decoded = decode_image(data)
    check_output(decoded, 40, 64)  # as stored, not 64 x 40
    as_stored = np.asarray(pillow_open(data).convert("RGB")).astype(int)
    assert np.abs(decoded.astype(int) - as_stored).max() <= 8
    assert ImageOps.exif_transpose(pillow_open(data)).size == (40, 64)  # what we did not do


def test_jpeg_refused_by_simplejpeg_falls_back_to_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    data = encode(Image.fromarray(photo(30, 40)), "JPEG")

    def refuse(*args: object, **kwargs: object) -> np.ndarray:
        raise ValueError("Corrupt JPEG data: 3 extraneous bytes before marker 0xd9")

    monkeypatch.setattr(packer.decode.simplejpeg, "decode_jpeg", refuse)
    pixels = decode_image(data)
    assert np.array_equal(pixels, np.asarray(pillow_open(data).convert("RGB")))


def test_damaged_jpeg_that_pillow_tolerates_still_decodes() -> None:
    data = bytearray(encode(Image.fromarray(photo(64, 64)), "JPEG", quality=90))
    scan = data.index(b"\xff\xda")
    data[scan + 300] ^= 0xA5  # bad entropy data: libjpeg-turbo warns, strict simplejpeg refuses
    pixels = decode_image(bytes(data))
    check_output(pixels, 64, 64)


# --- Pillow formats and modes ---------------------------------------------------------------------

@pytest.mark.parametrize("fmt, options", [
    ("PNG", {}), ("BMP", {}), ("TIFF", {}), ("TIFF", {"compression": "tiff_deflate"}),
    ("WEBP", {"lossless": True}),
])
def test_lossless_rgb_formats_round_trip_exactly(fmt: str, options: dict) -> None:
    pixels = noise(23, 31, 3)
    decoded = decode_image(encode(Image.fromarray(pixels), fmt, **options))
    check_output(decoded, 23, 31)
    assert np.array_equal(decoded, pixels)


def test_lossy_webp_matches_pillow() -> None:
    pixels = photo(48, 64)
    data = encode(Image.fromarray(pixels), "WEBP", quality=95)
    decoded = decode_image(data)
    check_output(decoded, 48, 64)
    assert np.array_equal(decoded, np.asarray(pillow_open(data).convert("RGB")))


def test_rgba_drops_alpha_without_compositing() -> None:
    rgba = np.dstack([noise(10, 12, 3), np.zeros((10, 12), np.uint8)])  # fully transparent
    rgba[0, 0] = (200, 10, 30, 0)
    for data in (encode(Image.fromarray(rgba), "PNG"),
                 encode(Image.fromarray(rgba), "WEBP", lossless=True, exact=True)):
        decoded = decode_image(data)
        check_output(decoded, 10, 12)
        assert np.array_equal(decoded, rgba[:, :, :3])


def test_la_drops_alpha_and_replicates_gray() -> None:
    la = np.dstack([noise(9, 7), noise(9, 7, seed=5)])
    decoded = decode_image(encode(Image.fromarray(la, "LA"), "PNG"))
    check_output(decoded, 9, 7)
    assert np.array_equal(decoded, gray3(la[:, :, 0]))


def test_gray_is_replicated() -> None:
    gray = noise(11, 13)
    decoded = decode_image(encode(Image.fromarray(gray), "PNG"))
    assert np.array_equal(decoded, gray3(gray))


def palette_image(transparent_index: int | None) -> tuple[Image.Image, np.ndarray]:
    palette = np.array([[0, 0, 0], [200, 10, 30], [5, 250, 5], [17, 34, 51]], np.uint8)
    indices = np.array([[0, 1, 2, 3], [3, 2, 1, 0]], np.uint8)
    img = Image.new("P", (4, 2))
    img.putpalette(palette.ravel().tolist() + [0] * (768 - palette.size))
    img.putdata(indices.ravel().tolist())
    if transparent_index is not None:
        img.info["transparency"] = transparent_index
    return img, palette[indices]


@pytest.mark.parametrize("fmt", ["PNG", "GIF", "BMP", "TIFF"])
def test_palette_without_transparency_gives_palette_colours(fmt: str) -> None:
    img, expected = palette_image(None)
    data = encode(img, fmt)
    assert pillow_open(data).mode == "P"
    assert np.array_equal(decode_image(data), expected)


@pytest.mark.filterwarnings("error")  # the RGBA route avoids Pillow's "transparency" warning
@pytest.mark.parametrize("fmt", ["PNG", "GIF"])
def test_palette_with_transparency_keeps_the_stored_colour(fmt: str) -> None:
    img, expected = palette_image(1)
    data = encode(img, fmt, transparency=1)
    assert "transparency" in pillow_open(data).info
    decoded = decode_image(data)
    check_output(decoded, 2, 4)
    assert np.array_equal(decoded, expected)  # index 1 stays (200, 10, 30), not composited


def test_png16_gray_keeps_the_high_byte() -> None:
    high = noise(12, 10)
    low = noise(12, 10, seed=9) | 1  # never zero: a decoder keeping the low byte would show
    values = (high.astype(np.uint16) << 8) | low
    data = encode(Image.fromarray(values), "PNG")
    assert pillow_open(data).mode == "I;16"
    decoded = decode_image(data)
    check_output(decoded, 12, 10)
    assert np.array_equal(decoded, gray3(high))


def test_tiff16_big_endian_keeps_the_high_byte() -> None:
    values = np.array([[1, 2, 3], [256, 513, 65535]], dtype=">u2")
    data = encode(Image.fromarray(values), "TIFF")
    assert pillow_open(data).mode == "I;16B"
    assert np.array_equal(decode_image(data), gray3(np.array([[0, 0, 0], [1, 2, 255]], np.uint8)))


def test_png16_rgb_keeps_the_high_byte() -> None:
    samples = (noise(5, 6, 3).astype(np.uint16) << 8) | 0x7F
    decoded = decode_image(png_rgb16(samples))
    check_output(decoded, 5, 6)
    assert np.array_equal(decoded, (samples >> 8).astype(np.uint8))


def test_32bit_integer_gray_is_clipped_then_shifted() -> None:
    values = np.array([[-5, 70000, 300], [0, 65535, 256]], dtype=np.int32)
    data = encode(Image.fromarray(values), "TIFF")
    assert pillow_open(data).mode == "I"
    assert np.array_equal(decode_image(data), gray3(np.array([[0, 255, 1], [0, 255, 1]],
                                                             np.uint8)))


def test_float_gray_is_rounded_and_clipped() -> None:
    values = np.array([[-3.2, 12.6, 300.0], [np.nan, 0.4, 254.6]], dtype=np.float32)
    data = encode(Image.fromarray(values), "TIFF")
    assert pillow_open(data).mode == "F"
    assert np.array_equal(decode_image(data), gray3(np.array([[0, 13, 255], [0, 0, 255]],
                                                             np.uint8)))


def test_one_bit_becomes_0_and_255() -> None:
    bits = noise(8, 9) > 127
    data = encode(Image.fromarray(bits), "PNG")
    assert pillow_open(data).mode == "1"
    decoded = decode_image(data)
    assert set(np.unique(decoded)) <= {0, 255}
    assert np.array_equal(decoded, gray3(bits.astype(np.uint8) * 255))


def test_cmyk_tiff_uses_pillow_conversion() -> None:
    cmyk = noise(6, 7, 4)
    data = encode(Image.fromarray(cmyk, "CMYK"), "TIFF")
    assert np.array_equal(decode_image(data), np.asarray(pillow_open(data).convert("RGB")))


def test_animated_gif_gives_its_first_frame() -> None:
    colours = [(250, 0, 0), (0, 250, 0), (0, 0, 250)]
    frames = [Image.new("RGB", (12, 8), c) for c in colours]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50)
    assert pillow_open(data).n_frames == 3
    decoded = decode_image(data)
    check_output(decoded, 8, 12)
    assert (decoded == np.array(colours[0], np.uint8)).all()


@pytest.mark.parametrize("fmt, options", [("WEBP", {"lossless": True}), ("TIFF", {})])
def test_multi_frame_webp_and_tiff_give_the_first_frame(fmt: str, options: dict) -> None:
    frames = [Image.new("RGB", (12, 8), c) for c in [(250, 0, 0), (0, 0, 250)]]
    data = encode(frames[0], fmt, save_all=True, append_images=frames[1:], **options)
    assert pillow_open(data).n_frames == 2
    assert (decode_image(data) == np.array((250, 0, 0), np.uint8)).all()


def test_every_sample_format_decodes_to_probed_size(sample_folder: Path) -> None:
    for path in sorted(p for p in sample_folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        info = probe_image(data, validate="full")
        check_output(decode_image(data, info.image_format, name=path.name), info.height,
                     info.width)


# --- inputs -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_bytes_like_inputs_decode_identically(fmt: str, tmp_path: Path) -> None:
    data = encode(Image.fromarray(photo(20, 30)), fmt)
    expected = decode_image(data)
    assert np.array_equal(decode_image(bytearray(data)), expected)
    assert np.array_equal(decode_image(memoryview(data)), expected)
    assert np.array_equal(decode_image(np.frombuffer(data, dtype=np.uint8)), expected)

    # A zero-copy slice of a memory-mapped shard, the way the reader hands payloads over.
    shard = tmp_path / "shard.bin"
    shard.write_bytes(bytes(4096) + data + bytes(100))
    with open(shard, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as m:
        as_array = np.frombuffer(m, dtype=np.uint8)[4096:4096 + len(data)]
        assert np.array_equal(decode_image(as_array), expected)
        view = memoryview(m)[4096:4096 + len(data)]
        assert np.array_equal(decode_image(view), expected)
        del as_array
        view.release()


def test_format_hint_from_the_index_column() -> None:
    data = encode(Image.fromarray(noise(4, 5, 3)), "PNG")
    expected = decode_image(data)
    index_column = np.array([ImageFormat.UNKNOWN, ImageFormat.PNG], dtype=np.uint8)
    assert np.array_equal(decode_image(data, index_column[1]), expected)  # a numpy integer
    assert np.array_equal(decode_image(data, index_column[0]), expected)  # unknown: detected


def test_output_does_not_alias_the_input() -> None:
    data = encode(Image.fromarray(noise(4, 5, 3)), "PNG")
    first = decode_image(data)
    first[:] = 0
    assert decode_image(data).any()


# --- errors -------------------------------------------------------------------------------------

def decode_error(*args: object, **kwargs: object) -> DecodeError:
    with pytest.raises(DecodeError) as caught:
        decode_image(*args, **kwargs)  # type: ignore[arg-type]
    assert not isinstance(caught.value, RejectedImageError)
    return caught.value


def test_truncated_jpeg_is_a_decode_error_naming_the_sample() -> None:
    data = encode(Image.fromarray(photo(64, 64)), "JPEG")
    err = decode_error(data[: len(data) // 2], name="cats/0001.jpg")
    assert err.path == "cats/0001.jpg"
    assert str(err).startswith("cats/0001.jpg: ")
    assert "JPEG" in str(err)


@pytest.mark.parametrize("fmt", ["PNG", "GIF", "WEBP", "BMP", "TIFF"])
def test_truncated_pillow_formats_are_decode_errors(fmt: str) -> None:
    data = encode(Image.fromarray(noise(40, 50, 3)), fmt)
    err = decode_error(data[: len(data) // 2], name=f"sample.{fmt.lower()}")
    assert "sample." in str(err) and fmt in str(err)


def test_wrong_format_hint_is_a_decode_error() -> None:
    png = encode(Image.fromarray(noise(4, 5, 3)), "PNG")
    err = decode_error(png, ImageFormat.JPEG, name="k1")
    assert "simplejpeg" in str(err) and "Pillow" in str(err)
    jpeg = encode(Image.fromarray(noise(4, 5, 3)), "JPEG")
    assert "as PNG" in str(decode_error(jpeg, ImageFormat.PNG, name="k2"))


@pytest.mark.parametrize("data, image_format, fragment", [
    (b"", None, "0 bytes"),
    (b"hello, world", None, "expected a JPEG, PNG, WEBP, GIF, BMP or TIFF image"),
    (b"\x00" * 12, ImageFormat.RAW, "raw"),
    (b"\xff\xd8\xff\xd9", 300, "unknown image_format 300"),
])
def test_undecodable_inputs(data: bytes, image_format: int | None, fragment: str) -> None:
    err = decode_error(data, image_format, name="s")
    assert fragment in str(err)
    assert err.path == "s"


@pytest.mark.parametrize("reserved", [39, 200, 254])
def test_reserved_image_format_values_are_sniffed_like_unknown(reserved: int) -> None:
    """SPEC §5: a value a newer writer may use (39-254) is read like 0, not refused."""
    from packer.decode import decode_as_stored
    pixels = noise(4, 5, 3)
    png = encode(Image.fromarray(pixels), "PNG")
    assert np.array_equal(decode_image(png, reserved), pixels)
    mask = encode(Image.fromarray(noise(3, 2, 1)[:, :, 0], mode="L"), "PNG")
    assert np.array_equal(decode_as_stored(mask, reserved), noise(3, 2, 1)[:, :, 0])
    jpeg = encode(Image.fromarray(pixels), "JPEG")
    assert decode_image(jpeg, reserved).shape == (4, 5, 3)
    with pytest.raises(DecodeError, match="expected a JPEG, PNG, WEBP, GIF, BMP or TIFF image"):
        decode_image(b"hi", reserved, name="s")


def test_error_without_name_has_no_prefix() -> None:
    err = decode_error(b"nope")
    assert err.path is None and str(err) == err.message


def test_decode_jpeg_rgb_errors_are_decode_errors() -> None:
    with pytest.raises(DecodeError, match="k9"):
        decode_jpeg_rgb(b"not a jpeg", name="k9")
    with pytest.raises(DecodeError, match="0 bytes"):
        decode_jpeg_rgb(b"")


_SEEDS = [
    encode(Image.fromarray(photo(24, 32)), "JPEG"),
    encode(Image.fromarray(photo(24, 32)).convert("CMYK"), "JPEG"),
    encode(Image.fromarray(noise(24, 32, 3)), "PNG"),
    encode(Image.fromarray(noise(24, 32, 3)).quantize(16), "GIF"),
    encode(Image.fromarray(noise(24, 32, 4)), "WEBP"),
    encode(Image.fromarray(noise(24, 32, 3)), "TIFF"),
    encode(Image.fromarray(noise(24, 32, 3)), "BMP"),
]


@pytest.mark.filterwarnings("ignore::UserWarning")
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.sampled_from(range(len(_SEEDS))), data=st.data())
def test_mutated_bytes_decode_or_raise_decode_error(seed: int, data: st.DataObject) -> None:
    blob = bytearray(_SEEDS[seed])
    if data.draw(st.booleans()):
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    else:
        for _ in range(data.draw(st.integers(1, 6))):
            position = data.draw(st.integers(0, len(blob) - 1))
            blob[position] ^= data.draw(st.integers(1, 255))
    try:
        pixels = decode_image(bytes(blob))
    except DecodeError:
        return
    assert pixels.dtype == np.uint8 and pixels.ndim == 3 and pixels.shape[2] == 3
    assert pixels.flags.c_contiguous


# --- files that are not what the manifest says ----------------------------------------------------


def _animated_gif(path: Path) -> list[np.ndarray]:
    frames = [Image.new("RGB", (20, 10), color) for color in ("red", "green", "blue")]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=50, loop=0)
    return [np.asarray(f) for f in frames]


def test_animated_multiframe_and_exotic_modes_follow_the_rule(tmp_path):
    """The documented rule: animated and multi-frame images are packed whole (the stored bytes are
    the file) and described and decoded by their first frame; every Pillow mode decodes to HxWx3
    uint8 RGB."""
    from packer.decode import decode_image
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    _animated_gif(src / "anim.gif")
    first, second = Image.new("RGB", (30, 12), "yellow"), Image.new("RGB", (8, 8), "black")
    first.save(src / "pages.tiff", save_all=True, append_images=[second])
    first.save(src / "anim.webp", save_all=True, append_images=[Image.new("RGB", (30, 12), "black")],
               duration=40, lossless=True)
    first.save(src / "anim.png", save_all=True, append_images=[Image.new("RGB", (30, 12), "black")])  # APNG
    rng = np.random.default_rng(0)
    modes = {
        "cmyk.jpg": Image.fromarray(rng.integers(0, 256, (9, 11, 4), dtype=np.uint8), "CMYK"),
        "gray16.png": Image.fromarray(rng.integers(0, 65535, (9, 11), dtype=np.uint16)),
        "la.png": Image.fromarray(rng.integers(0, 256, (9, 11, 2), dtype=np.uint8), "LA"),
        "rgba.png": Image.fromarray(rng.integers(0, 256, (9, 11, 4), dtype=np.uint8), "RGBA"),
        "bilevel.png": Image.new("1", (11, 9), 1),
        "float.tiff": Image.fromarray(rng.random((9, 11), dtype=np.float32) * 300, "F"),
        "palette.png": Image.new("P", (11, 9), 3),
        "progressive.jpg": Image.fromarray(rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)),
    }
    for name, image in modes.items():
        image.save(src / name, **({"progressive": True} if name == "progressive.jpg" else {}))
    result = build(tmp_path / "src", tmp_path / "out", BuildOptions(validate="full"), workers=1, progress=False)
    assert result.rejected == [], result.rejected
    with open_dataset(tmp_path / "out", verify_checksums=True) as dataset:
        for i in range(len(dataset)):
            key = dataset.key(i)
            stored = dataset.read(i)
            assert stored == (src.parent / key).read_bytes()  # packed whole, every frame kept
            pixels = decode_image(stored, int(dataset.index.image_format[i]), name=key)
            with Image.open(src.parent / key) as reference:  # frame 0
                assert pixels.shape == (reference.height, reference.width, 3) and pixels.dtype == np.uint8, key
                assert (int(dataset.index.width[i]), int(dataset.index.height[i])) == reference.size, key
                if reference.mode in ("RGB", "L", "P", "RGBA", "CMYK"):
                    expected = np.asarray(reference.convert("RGBA" if reference.mode == "P" and
                                                            "transparency" in reference.info else "RGB"))[..., :3]
                    assert np.abs(pixels.astype(int) - expected.astype(int)).max() <= 2, key
