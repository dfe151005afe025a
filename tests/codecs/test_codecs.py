"""Codecs: jpeg resizing and parameters, raw pixels and layout, per-mode rules, raw batch views."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from packer.writer import build
from packer.codecs import (JpegCodec, RawCodec, get_codec, merge_codec_options, parse_codec_spec,
                           raw_batch_view, raw_sample_shape, raw_sample_stride, raw_samples_view)
from packer.dataset import open_dataset, open_index
from packer.decode import decode_image
from packer.errors import BuildError, ManifestError, OptionError
from packer.format import ImageFormat, align_up
from packer._internal.imageinfo import probe_image
from packer.writer.plan import BuildOptions


def _smooth_rgb(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A smooth colour image (gradients, no noise), so resampled versions compare closely."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    phase = rng.uniform(0, 2 * np.pi, size=3)
    channels = [127.5 + 100 * np.sin(xx / max(width, 1) * 3 + yy / max(height, 1) * 2 + p) for p in phase]
    return np.clip(np.rint(np.dstack(channels)), 0, 255).astype(np.uint8)


def _encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _png(pixels: np.ndarray) -> bytes:
    return _encode(Image.fromarray(pixels), "PNG")


def _encode_with(spec: str, data: bytes) -> tuple[bytes, object]:
    return get_codec(spec).encode(data, probe_image(data), name="x")


# --- jpeg ------------------------------------------------------------------------------------

@pytest.mark.parametrize("side, expected", [("longer", (50, 25)), ("shorter", (100, 50))])
def test_jpeg_bounds_the_chosen_side(side: str, expected: tuple[int, int]) -> None:
    data = _png(_smooth_rgb(100, 200))
    payload, info = _encode_with(f"jpeg:max_size=50,side={side}", data)
    assert payload[:3] == b"\xff\xd8\xff"
    height, width = simplejpeg.decode_jpeg_header(payload)[:2]
    assert (width, height) == expected
    assert (info.width, info.height, info.channels, info.image_format) == (*expected, 3, ImageFormat.JPEG)


def test_jpeg_never_enlarges_and_keeps_size_without_max_size() -> None:
    data = _png(_smooth_rgb(30, 40))
    for spec in ("jpeg:max_size=256", "jpeg:max_size=256,side=shorter", "jpeg"):
        payload, info = _encode_with(spec, data)
        assert (info.width, info.height) == (40, 30)
        assert decode_image(payload).shape == (30, 40, 3)


def test_jpeg_resized_pixels_match_a_plain_resize() -> None:
    source = _smooth_rgb(120, 160)
    payload, _ = _encode_with("jpeg:max_size=80,quality=100,subsampling=444", _png(source))
    expected = np.asarray(Image.fromarray(source).resize((80, 60), Image.Resampling.LANCZOS), dtype=np.int32)
    got = decode_image(payload).astype(np.int32)
    assert np.abs(got - expected).mean() < 1.5


def test_jpeg_quality_changes_the_bytes() -> None:
    data = _png(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    low, _ = _encode_with("jpeg:quality=30", data)
    high, _ = _encode_with("jpeg:quality=95", data)
    assert len(low) < len(high)


def test_jpeg_large_source_uses_reduced_decode_with_small_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import packer.decode

    source = _smooth_rgb(768, 1024)
    data = simplejpeg.encode_jpeg(source, quality=95, colorsubsampling="444")
    with monkeypatch.context() as patch:  # the DCT-reduced path must not need a full decode
        patch.setattr(packer.decode, "decode_image", None)
        payload, info = _encode_with("jpeg:max_size=128,quality=100,subsampling=444", data)
    assert (info.width, info.height) == (128, 96)
    full = Image.fromarray(decode_image(data)).resize((128, 96), Image.Resampling.LANCZOS)
    diff = np.abs(decode_image(payload).astype(np.int32) - np.asarray(full, dtype=np.int32))
    assert diff.mean() < 2.0


def test_jpeg_is_deterministic() -> None:
    data = simplejpeg.encode_jpeg(_smooth_rgb(300, 400), quality=90)
    assert _encode_with("jpeg:max_size=64", data)[0] == _encode_with("jpeg:max_size=64", data)[0]


# --- raw -------------------------------------------------------------------------------------

def test_raw_centre_crop_without_scaling_is_exact() -> None:
    source = _smooth_rgb(20, 40)
    payload, info = _encode_with("raw:size=20x20", _png(source))
    assert len(payload) == 20 * 20 * 3
    pixels = np.frombuffer(payload, np.uint8).reshape(20, 20, 3)
    np.testing.assert_array_equal(pixels, source[:, 10:30])
    assert (info.width, info.height, info.channels, info.image_format) == (20, 20, 3, ImageFormat.RAW)


def test_raw_pixels_match_decode_resize_centre_crop() -> None:
    source = _smooth_rgb(90, 160)
    payload, _ = _encode_with("raw:size=48x64", _png(source))
    got = np.frombuffer(payload, np.uint8).reshape(48, 64, 3)
    # The codec's exact operation: the centred box with the target aspect, resampled once.
    box = RawCodec(48, 64).crop_box(160, 90)
    assert box == pytest.approx((20.0, 0.0, 140.0, 90.0))
    exact = Image.fromarray(source).resize((64, 48), Image.Resampling.LANCZOS, box=box, reducing_gap=2.0)
    np.testing.assert_array_equal(got, np.asarray(exact))
    # And what torchvision-style resize-then-crop gives, up to the crop's integer rounding.
    scaled = np.asarray(Image.fromarray(source).resize((85, 48), Image.Resampling.LANCZOS))
    left = (85 - 64) // 2
    assert np.abs(got.astype(np.int32) - scaled[:, left:left + 64].astype(np.int32)).mean() < 4


def test_raw_tall_source_crops_rows_and_small_source_is_enlarged() -> None:
    source = _smooth_rgb(40, 10)
    payload, _ = _encode_with("raw:size=10x10", _png(source))
    np.testing.assert_array_equal(np.frombuffer(payload, np.uint8).reshape(10, 10, 3), source[15:25])
    payload, _ = _encode_with("raw:size=64x64", _png(_smooth_rgb(8, 8)))
    assert len(payload) == 64 * 64 * 3


def test_raw_large_jpeg_close_to_full_decode() -> None:
    source = _smooth_rgb(600, 800)
    data = simplejpeg.encode_jpeg(source, quality=95, colorsubsampling="444")
    payload, _ = _encode_with("raw:size=64x64", data)
    codec = RawCodec(64, 64)
    reference = Image.fromarray(decode_image(data)).resize(
        (64, 64), Image.Resampling.LANCZOS, box=codec.crop_box(800, 600))
    diff = np.abs(np.frombuffer(payload, np.uint8).reshape(64, 64, 3).astype(np.int32)
                  - np.asarray(reference, dtype=np.int32))
    assert diff.mean() < 2.0


def _mode_sources() -> dict[str, bytes]:
    rgb = _smooth_rgb(24, 32, seed=3)
    gray = Image.fromarray(rgb).convert("L")
    rgba = Image.fromarray(np.dstack([rgb, np.linspace(0, 255, 32, dtype=np.uint8)[None, :].repeat(24, 0)]))
    palette = Image.fromarray(rgb).quantize(colors=8)
    palette_alpha = palette.copy()
    palette_alpha.info["transparency"] = 0
    sixteen = Image.fromarray((np.asarray(gray, dtype=np.uint16) * 257 + 7).astype(np.uint16))
    return {
        "L": _encode(gray, "PNG"),
        "LA": _encode(Image.merge("LA", (gray, gray)), "PNG"),
        "RGBA": _encode(rgba, "PNG"),
        "P": _encode(palette, "PNG"),
        "P+transparency": _encode(palette_alpha, "PNG", transparency=0),
        "I;16": _encode(sixteen, "PNG"),
        "1": _encode(gray.convert("1"), "PNG"),
        "jpeg-gray": _encode(gray, "JPEG", quality=95),
        "jpeg-cmyk": _encode(Image.fromarray(rgb).convert("CMYK"), "JPEG", quality=95),
        "gif": _encode(palette, "GIF"),
    }


@pytest.mark.parametrize("mode", list(_mode_sources()))
def test_raw_follows_the_decode_image_rule_per_mode(mode: str) -> None:
    data = _mode_sources()[mode]
    payload, info = _encode_with("raw:size=24x32", data)  # same size: no resampling at all
    assert info.channels == 3
    np.testing.assert_array_equal(np.frombuffer(payload, np.uint8).reshape(24, 32, 3), decode_image(data))


@pytest.mark.parametrize("mode", list(_mode_sources()))
def test_jpeg_follows_the_decode_image_rule_per_mode(mode: str) -> None:
    data = _mode_sources()[mode]
    payload, info = _encode_with("jpeg:quality=100,subsampling=444", data)
    assert (info.width, info.height, info.channels) == (32, 24, 3)
    got = decode_image(payload).astype(np.int32)
    assert np.abs(got - decode_image(data).astype(np.int32)).mean() < 2.5


# --- datasets ------------------------------------------------------------------------------------

def _folder(root: Path, count: int = 6) -> Path:
    for i in range(count):
        folder = root / f"class_{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = _smooth_rgb(30 + 7 * i, 50 - 3 * i, seed=i)
        (folder / f"img_{i}.png").write_bytes(_png(pixels))
    return root


def test_jpeg_dataset_records_codec_and_payload_info(tmp_path: Path) -> None:
    source = _folder(tmp_path / "src")
    build(source, tmp_path / "ds", BuildOptions(codec="jpeg:max_size=20,quality=75"), workers=1, progress=False)
    index = open_index(tmp_path / "ds")
    assert index.manifest.codec == {"name": "jpeg", "max_size": 20, "quality": 75, "side": "longer",
                                    "subsampling": "420", "resample": "lanczos", "channels": 3}
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest["codec"]["quality"] == 75
    ds = open_dataset(tmp_path / "ds")
    for i in range(len(ds)):
        pixels = decode_image(ds.get(i))
        assert max(pixels.shape[:2]) <= 20
        assert (int(ds.index.height[i]), int(ds.index.width[i]), int(ds.index.channels[i])) == pixels.shape
        assert int(ds.index.image_format[i]) == ImageFormat.JPEG
    ds.close()


@pytest.mark.parametrize("alignment", [1, 64, 4096])
def test_raw_dataset_sizes_strides_and_batch_views(tmp_path: Path, alignment: int) -> None:
    source = _folder(tmp_path / "src", count=8)
    build(source, tmp_path / "ds", BuildOptions(codec="raw:size=12x10", alignment=alignment, shuffle=False),
          workers=1, progress=False)
    ds = open_dataset(tmp_path / "ds")
    shape = raw_sample_shape(ds.manifest.codec)
    assert shape == (12, 10, 3)
    assert ds.manifest.codec == {"name": "raw", "height": 12, "width": 10, "channels": 3, "layout": "HWC",
                                 "dtype": "uint8", "fit": "center-crop", "resample": "lanczos"}
    stride = raw_sample_stride(shape, ds.manifest.alignment)
    assert stride == align_up(360, alignment)
    assert np.all(ds.index.size == 360)
    assert np.all(ds.index.image_format == ImageFormat.RAW)
    assert np.all((ds.index.height == 12) & (ds.index.width == 10) & (ds.index.channels == 3))
    for i in range(len(ds)):
        key = ds.key(i)
        expected, _ = _encode_with("raw:size=12x10", (source / key).read_bytes())
        assert ds.read(i) == expected
    first, last = ds.shard_range(0)
    batch = ds.read_batch(np.arange(first, last))
    view = raw_samples_view(batch.data, batch.starts, shape)
    assert np.shares_memory(view, batch.data)
    for j, i in enumerate(range(first, last)):
        np.testing.assert_array_equal(view[j], np.frombuffer(ds.read(i), np.uint8).reshape(shape))
    ds.close()


def test_raw_batch_view_strided_and_dense() -> None:
    shape = (2, 3, 3)
    samples = np.arange(4 * 18, dtype=np.uint8).reshape(4, 2, 3, 3)
    padded = np.zeros(4 * 32, dtype=np.uint8)
    for j in range(4):
        padded[j * 32:j * 32 + 18] = samples[j].ravel()
    view = raw_batch_view(padded[:3 * 32 + 18], 4, 32, shape)
    np.testing.assert_array_equal(view, samples)
    assert np.shares_memory(view, padded)
    dense = raw_batch_view(samples.tobytes(), 4, 18, shape)
    np.testing.assert_array_equal(dense, samples)
    assert raw_batch_view(b"", 0, 18, shape).shape == (0, 2, 3, 3)
    with pytest.raises(ValueError, match="need 114"):
        raw_batch_view(padded[:113], 4, 32, shape)
    with pytest.raises(ValueError, match="stride >= 18"):
        raw_batch_view(padded, 4, 17, shape)


def test_raw_samples_view_gathers_irregular_starts() -> None:
    shape = (1, 2, 3)
    data = np.arange(64, dtype=np.uint8)
    regular = raw_samples_view(data, [8, 16, 24], shape)
    assert np.shares_memory(regular, data)
    irregular = raw_samples_view(data, [40, 0, 9], shape)
    assert not np.shares_memory(irregular, data)
    for j, start in enumerate([40, 0, 9]):
        np.testing.assert_array_equal(irregular[j].ravel(), data[start:start + 6])
    with pytest.raises(ValueError, match="outside"):
        raw_samples_view(data, [60], shape)


def test_raw_sample_shape_refuses_other_codecs() -> None:
    with pytest.raises(ManifestError, match="not 'raw'"):
        raw_sample_shape({"name": "passthrough"})
    with pytest.raises(ManifestError, match="'height'"):
        raw_sample_shape({"name": "raw", "width": 3, "channels": 3})
    with pytest.raises(ManifestError, match="HWC"):
        raw_sample_shape({"name": "raw", "height": 2, "width": 3, "channels": 3, "layout": "CHW"})


# --- options -------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, fragment", [
    ("bogus", "unknown codec 'bogus'; available: jpeg, passthrough, raw"),
    ("passthrough:quality=5", "codec 'passthrough' has no option 'quality'; it takes no options"),
    ("jpeg:quality=0", "quality=0 is out of range 1..100"),
    ("jpeg:quality=abc", "quality='abc' is not an integer"),
    ("jpeg:max_size=-3", "max_size=-3 is out of range"),
    ("jpeg:side=left", "side='left' is not one of longer, shorter"),
    ("jpeg:subsampling=410", "subsampling='410' is not one of"),
    ("jpeg:resample=magic", "resample='magic' is not one of lanczos"),
    ("jpeg:foo=1", "has no option 'foo'; it takes max_size, quality, side, subsampling, resample"),
    ("jpeg:quality", "must look like key=value"),
    ("jpeg:quality=5,quality=6", "given twice"),
    ("raw", "codec 'raw' needs a size"),
    ("raw:size=0x5", "out of range 1..65500"),
    ("raw:size=axb", "is not an integer"),
    ("raw:size=1x2x3", "must look like HxW"),
])
def test_bad_codec_options_give_a_clear_build_error(spec: str, fragment: str) -> None:
    with pytest.raises(OptionError) as caught:
        get_codec(spec)
    assert fragment in str(caught.value)


def test_spec_parsing_and_merging() -> None:
    assert parse_codec_spec(" jpeg : quality = 80 , max_size=64 ") == ("jpeg", {"quality": "80", "max_size": "64"})
    assert merge_codec_options("jpeg", {"quality": "80", "max_size": None, "side": "shorter"}) == \
        "jpeg:quality=80,side=shorter"
    assert merge_codec_options("jpeg:quality=80", {"quality": 80}) == "jpeg:quality=80"
    with pytest.raises(OptionError, match="given twice with different values"):
        merge_codec_options("jpeg:quality=80", {"quality": 90})
    with pytest.raises(OptionError, match="has no option 'size'"):
        merge_codec_options("jpeg", {"size": "224x224"})
    assert get_codec("raw:size=224") == RawCodec(224, 224)
    assert get_codec("jpeg:max_size=256") == JpegCodec(max_size=256)


def test_estimate_sizes() -> None:
    sizes = np.array([10, 100_000, 1_000_000], dtype=np.uint64)
    np.testing.assert_array_equal(get_codec("passthrough").estimate_sizes(sizes), sizes)
    np.testing.assert_array_equal(get_codec("raw:size=4x5").estimate_sizes(sizes), [60, 60, 60])
    estimated = get_codec("jpeg:max_size=100").estimate_sizes(sizes)
    assert estimated[0] == 10 and estimated[2] <= 100 * 100


def test_cli_codec_options(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from packer.cli import _register, cli

    _register()
    source = _folder(tmp_path / "src")
    runner = CliRunner()
    result = runner.invoke(cli, ["build", str(source), str(tmp_path / "ds"), "--codec", "jpeg", "--max-size", "16",
                                 "--quality", "70", "--resize-side", "shorter", "-q"])
    assert result.exit_code == 0, result.output
    assert open_index(tmp_path / "ds").manifest.codec["side"] == "shorter"
    result = runner.invoke(cli, ["build", str(source), str(tmp_path / "raw"), "--codec", "raw", "--size", "8x6", "-q"])
    assert result.exit_code == 0, result.output
    assert raw_sample_shape(open_index(tmp_path / "raw").manifest.codec) == (8, 6, 3)
    result = runner.invoke(cli, ["build", str(source), str(tmp_path / "bad"), "--quality", "70", "-q"])
    assert result.exit_code == 2
    assert "has no option 'quality'" in result.output
    assert not (tmp_path / "bad" / "manifest.json").exists()


def test_the_tiled_codec_extension_is_built_where_required() -> None:
    """`make test` (CI) sets PACKER_REQUIRE_EXTENSION=1: there the compiled re-tiler must exist, so
    tests/codecs/test_tiles.py cannot be skipped silently by a failed optional build."""
    import os

    from packer.codecs.tiles import transcoder_available

    if os.environ.get("PACKER_REQUIRE_EXTENSION") == "1":
        assert transcoder_available(), "packer.codecs._jpegtiles was not built: is a C compiler installed?"
    else:
        pytest.skip("PACKER_REQUIRE_EXTENSION is not set")
