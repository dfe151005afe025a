"""Formats beyond the core six: packed when Pillow decodes them, decoded, and refused by readers that cannot."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.writer import build
from packer.writer.plan import BuildOptions
from packer.dataset import open_dataset
from packer.decode import decode_image
from packer.errors import DecodeError, OptionError, RejectedImageError
from packer.format import ImageFormat
from packer._internal.imageinfo import probe_image
from packer._internal.pillowformats import check_reader_formats, decodable_by

PIXELS = np.random.default_rng(3).integers(0, 255, (12, 17, 3), dtype=np.uint8)
# Formats Pillow writes losslessly (so decoded pixels can be compared with the source).
LOSSLESS = ["PPM", "TGA", "QOI", "SGI", "PCX"]


def encode(fmt: str, pixels: np.ndarray = PIXELS) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt)
    return out.getvalue()


@pytest.mark.parametrize("fmt", LOSSLESS)
def test_probe_and_decode_lossless_formats(fmt: str) -> None:
    data = encode(fmt)
    info = probe_image(data, name=f"x.{fmt}")
    assert info.image_format == ImageFormat.BY_PIL_NAME[fmt] and (info.width, info.height) == (17, 12)
    assert np.array_equal(decode_image(data, info.image_format), PIXELS)
    assert np.array_equal(decode_image(data), PIXELS)  # no hint: Pillow identifies the bytes


@pytest.mark.parametrize("fmt", ["PPM", "TGA", "SGI", "PCX"])
def test_truncated_other_formats_are_rejected(fmt: str) -> None:
    data = encode(fmt, np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8))
    with pytest.raises(RejectedImageError) as info:
        probe_image(data[: len(data) // 2])
    assert info.value.reason == "truncated"


def test_pixel_limit_applies_before_decoding() -> None:
    with pytest.raises(RejectedImageError) as info:
        probe_image(encode("PPM"), max_pixels=100)
    assert info.value.reason == "too-many-pixels"
    with pytest.raises(DecodeError, match="over the limit"):
        decode_image(encode("PPM"), ImageFormat.BY_PIL_NAME["PPM"], max_pixels=100)


def test_stub_format_is_unsupported() -> None:
    with pytest.raises(RejectedImageError) as info:
        probe_image(b"\x89HDF\r\n\x1a\n" + bytes(504))
    assert info.value.reason == "unsupported-format" and "HDF5" in info.value.message


def test_wrong_hint_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="TGA|cannot"):
        decode_image(encode("PPM"), ImageFormat.BY_PIL_NAME["TGA"], name="s")


def test_build_packs_and_readers_decode_or_refuse(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    files = {f"a/img.{fmt.lower()}": encode(fmt) for fmt in LOSSLESS}
    files["a/photo.jpg"] = encode("JPEG")
    for name, data in files.items():
        (src / name).write_bytes(data)
    result = build(src, tmp_path / "ds", BuildOptions(shard_size=1 << 16), workers=1, progress=False)
    assert result.sample_count == len(files) and not result.rejected
    with open_dataset(tmp_path / "ds") as ds:
        formats = ds.index.image_format
        for i in range(len(ds)):
            key = ds.key(i)
            assert ds.read(i) == files[key]
            assert ImageFormat.NAMES[int(formats[i])] == key.rsplit(".", 1)[1].replace("jpg", "jpeg")
            if not key.endswith(".jpg"):
                assert np.array_equal(decode_image(ds.read(i), int(formats[i])), PIXELS)
        check_reader_formats(formats, "cpu")
        with pytest.raises(DecodeError, match=r"DALI.*1 tga.*1 qoi|DALI.*1 qoi") as caught:
            check_reader_formats(formats, "dali")
        # the lossless fix (normalized formats become PNG, which DALI decodes), not a lossy re-encode
        assert "rebuild with --normalize-formats" in caught.value.message
        assert "--codec jpeg" not in caught.value.message
        with pytest.raises(DecodeError, match="nvJPEG"):
            check_reader_formats(formats, "nvjpeg")


def test_reader_table() -> None:
    assert ImageFormat.JPEG in decodable_by("nvjpeg") and ImageFormat.PNG not in decodable_by("nvjpeg")
    assert ImageFormat.BY_PIL_NAME["PPM"] in decodable_by("dali")
    assert ImageFormat.BY_PIL_NAME["TGA"] not in decodable_by("dali")
    assert ImageFormat.RAW not in decodable_by("cpu")
    with pytest.raises(OptionError, match=r"^reader must be one of \['cpu', 'dali', 'nvjpeg'\], got 'opencv'$"):
        decodable_by("opencv")


def test_dali_table_matches_dalis_own_decoder() -> None:
    """decodable_by("dali") is what DALI's image decoder (CPU backend here) really decodes."""
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def, types

    for fmt in ["JPEG", "PNG", "WEBP", "PPM", "JPEG2000", "GIF", "TGA", "QOI"]:
        out = io.BytesIO()
        Image.fromarray(PIXELS).save(out, fmt)
        data = np.frombuffer(out.getvalue(), dtype=np.uint8)

        @pipeline_def(batch_size=1, num_threads=1, device_id=None)
        def pipeline():  # type: ignore[no-untyped-def]
            encoded = fn.external_source(source=lambda: [data], batch=True)
            return fn.decoders.image(encoded, device="cpu", output_type=types.RGB)

        try:
            pipe = pipeline()
            pipe.build()
            decoded = pipe.run()[0].as_array().shape == (1, 12, 17, 3)
        except RuntimeError:
            decoded = False
        assert decoded == (ImageFormat.BY_PIL_NAME[fmt] in decodable_by("dali")), fmt


def test_normalize_formats_converts_rare_formats_to_png(tmp_path: Path) -> None:
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    gray16 = (np.arange(12 * 17, dtype=np.uint16).reshape(12, 17) * 300).astype(np.uint16)
    images = {"x.tga": encode("TGA"), "x.ppm": encode("PPM"), "x.bmp": encode("BMP"), "x.jpg": encode("JPEG"),
              "x.png": encode("PNG")}
    out = io.BytesIO()
    Image.fromarray(gray16).save(out, "TIFF")
    images["g.tiff"] = out.getvalue()
    out = io.BytesIO()
    Image.fromarray(PIXELS).convert("RGBA").save(out, "TGA")
    images["alpha.tga"] = out.getvalue()
    for name, data in images.items():
        (src / name).write_bytes(data)
    result = build(tmp_path / "src", tmp_path / "ds", BuildOptions(shard_size=1 << 16, normalize_formats=True),
                   workers=1, progress=False)
    assert result.summary["codec_notes"] == {"png from bmp": 1, "png from ppm": 1, "png from tga": 2,
                                             "png from tiff": 1}
    with open_dataset(tmp_path / "ds") as ds:
        for i in range(len(ds)):
            key, data = ds.key(i), ds.read(i)
            original = images[key.split("/", 1)[1]]
            if key.endswith((".jpg", ".png")):
                assert data == original
                continue
            assert int(ds.index.image_format[i]) == ImageFormat.PNG and data.startswith(b"\x89PNG")
            assert np.array_equal(decode_image(data), decode_image(original)), key
            with Image.open(io.BytesIO(data)) as png:
                if key.endswith("g.tiff"):
                    assert png.mode in ("I;16", "I") and np.array_equal(np.asarray(png), gray16)  # 16 bits kept
                if key.endswith("alpha.tga"):
                    assert png.mode == "RGBA"
    assert "normalize_formats" not in BuildOptions().to_json()  # default: earlier manifests unchanged
