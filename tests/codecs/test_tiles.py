"""The tiled codec: lossless re-tiling (packer.codecs._jpegtiles), tile windows, and their use by the
decode transform and the build."""

from __future__ import annotations

import dataclasses
import io
import io as _io
import json
import math
import struct
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
from PIL import Image

import packer
import packer.codecs
from packer.codecs import tiles
from packer.writer import build
from packer.codecs import TiledCodec, get_codec
from packer.errors import MissingDependencyError, OptionError
from packer.format import ImageFormat
from packer.writer.plan import BuildOptions
from packer.codecs import tiles as tiles_module
from packer.codecs.tiles import WINDOW_MARGIN, read_layout, transcode, window_jpeg, window_margin
from packer.transforms import CenterCrop, RandomResizedCrop
from packer.verify import verify

from helpers import count_trial, jpeg_bytes, noisy_jpeg

pytestmark = pytest.mark.skipif(not tiles.transcoder_available(),
                                reason="packer.codecs._jpegtiles was not built")

SUBSAMPLINGS = ("444", "422", "420", "440", "411")


def _exif() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: kept as is (packer does not apply it)
    exif[0x010F] = "packer test"
    return exif.tobytes()


EXIF = _exif()


def photo(height: int = 120, width: int = 168, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus noise and a few edges: every coefficient range gets used."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    image = np.stack([x * 255 / max(width, 1), y * 255 / max(height, 1),
                      128 + 100 * np.sin((x + y) / 7.0)], axis=-1)
    image[height // 3:height // 2, width // 4:width // 2] = rng.uniform(0, 255, 3)
    image += rng.normal(0, 20, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def jpeg(pixels: np.ndarray, quality: int = 90, subsampling: str = "420") -> bytes:
    if pixels.ndim == 2 or pixels.shape[2] == 1:
        return simplejpeg.encode_jpeg(np.ascontiguousarray(pixels.reshape(*pixels.shape[:2], 1)),
                                      quality=quality, colorspace="GRAY")
    return simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=quality,
                                  colorsubsampling=subsampling)


def pillow_jpeg(pixels: np.ndarray, mode: str = "RGB", **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, "JPEG", **options)
    return out.getvalue()


def pillow_pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image)


def tile(data: bytes) -> bytes:
    return transcode(data, max_pixels=1 << 40)


# --- the transcoder ------------------------------------------------------------------------------

@pytest.mark.parametrize("subsampling", SUBSAMPLINGS)
@pytest.mark.parametrize("shape", [(120, 168), (1, 1), (17, 33), (9, 301), (250, 7)])
def test_transcode_is_lossless(subsampling: str, shape: tuple[int, int]) -> None:
    source = jpeg(photo(*shape), subsampling=subsampling)
    tiled = tile(source)
    assert np.array_equal(simplejpeg.decode_jpeg(tiled), simplejpeg.decode_jpeg(source))
    assert np.array_equal(pillow_pixels(tiled), pillow_pixels(source))
    assert read_layout(tiled) is not None


@pytest.mark.parametrize("options", [
    {"quality": 100}, {"quality": 10}, {"optimize": True}, {"restart_marker_blocks": 3},
    {"restart_marker_rows": 2}, {"subsampling": 0}, {"subsampling": 1}, {"mode": "L"},
    {"mode": "CMYK"}, {"exif": EXIF},
    {"icc_profile": b"\x00" * 300}, {"icc_profile": b"\x01" * 20000}, {"comment": b"hello"},
], ids=lambda o: ",".join(f"{k}={str(v)[:8]}" for k, v in o.items()))
def test_transcode_is_lossless_for_pillow_variants(options: dict) -> None:
    options = dict(options)
    mode = options.pop("mode", "RGB")
    source = pillow_jpeg(photo(64, 80, seed=3), mode, **options)
    tiled = tile(source)
    assert np.array_equal(pillow_pixels(tiled), pillow_pixels(source))
    layout = read_layout(tiled)
    assert layout is not None and (layout.width, layout.height) == (80, 64)
    # metadata segments are kept byte for byte
    for key in ("exif", "icc_profile", "comment"):
        if key in options:
            with Image.open(io.BytesIO(tiled)) as image:
                kept = image.info.get(key)
            assert kept == options[key]


def test_transcode_keeps_size_close_and_is_idempotent() -> None:
    source = jpeg(photo(375, 500), quality=93)
    tiled = tile(source)
    assert 0.95 < len(tiled) / len(source) < 1.05
    assert tile(tiled) == tiled  # re-tiling drops the old tables and writes the same bytes
    assert tile(source) == tiled  # deterministic


def test_eight_pixel_mcus_are_grouped_into_wider_tiles() -> None:
    # 4:4:4 and gray have 8-pixel MCUs; a tile groups a divisor of the MCU columns of >= 16 px.
    for subsampling, width, tile_width in (("444", 160, 16), ("444", 168, 24), ("420", 168, 16)):
        layout = read_layout(tile(jpeg(photo(40, width), subsampling=subsampling)))
        assert layout.tile_width == tile_width
        assert layout.columns * layout.tile_width >= width > (layout.columns - 1) * layout.tile_width


@pytest.mark.parametrize("options, reason", [
    ({"progressive": True}, "unsupported: progressive JPEG"),
])
def test_transcode_refuses_what_it_cannot_tile(options: dict, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        tile(pillow_jpeg(photo(32, 32), **options))


def test_untiled_reason_reads_the_frame_marker() -> None:
    def frame(marker: int, precision: int = 8) -> bytes:
        body = bytes([precision, 0, 8, 0, 8, 1, 1, 0x11, 0])
        return b"\xff\xd8" + bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body

    assert tiles.untiled_reason(pillow_jpeg(photo(16, 16), progressive=True)) == "progressive"
    assert tiles.untiled_reason(frame(0xC2)) == "progressive"
    assert tiles.untiled_reason(frame(0xC3)) == "lossless"
    assert tiles.untiled_reason(frame(0xC9)) == "arithmetic"
    assert tiles.untiled_reason(frame(0xC1, precision=12)) == "12-bit"
    for data in (frame(0xC0), b"\xff\xd8", b"junk", jpeg(photo(16, 16))[:30]):
        assert tiles.untiled_reason(data) == "damaged or multi-scan"


def test_transcode_refuses_large_and_non_jpeg_inputs() -> None:
    with pytest.raises(ValueError, match="unsupported: 168x120 is more than 1000 pixels"):
        transcode(jpeg(photo()), max_pixels=1000)
    for data in (b"", b"\xff\xd8", b"not a jpeg at all", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64):
        with pytest.raises(ValueError, match="^corrupt: "):
            tile(data)


def test_transcode_survives_damaged_input() -> None:
    """Truncations and byte flips: bytes out or ValueError, never a crash or another error."""
    rng = np.random.default_rng(7)
    sources = [jpeg(photo(40, 56, seed=1)), tile(jpeg(photo(40, 56, seed=2), subsampling="444"))]
    outcomes = {"ok": 0, "refused": 0}
    for source in sources:
        for cut in range(0, len(source), 7):
            try:
                tile(source[:cut])
                outcomes["ok"] += 1
            except ValueError:
                outcomes["refused"] += 1
        for _ in range(400):
            damaged = bytearray(source)
            for position in rng.integers(2, len(source), size=int(rng.integers(1, 4))):
                damaged[position] = int(rng.integers(0, 256))
            try:
                out = tile(bytes(damaged))
            except ValueError as exc:
                assert str(exc).split(":")[0] in ("corrupt", "unsupported"), exc
                outcomes["refused"] += 1
                continue
            outcomes["ok"] += 1
            assert out[:2] == b"\xff\xd8" and out[-2:] == b"\xff\xd9"
    assert outcomes["refused"] > 100 and outcomes["ok"] > 100, outcomes


def test_transcode_releases_memory_and_accepts_buffers() -> None:
    source = jpeg(photo())
    assert tile(memoryview(source)) == tile(bytearray(source)) == tile(source)
    with pytest.raises(TypeError):
        transcode("text", max_pixels=10)  # type: ignore[arg-type]


# --- layouts and windows -------------------------------------------------------------------------

def test_read_layout_rejects_ordinary_and_inconsistent_files() -> None:
    source = jpeg(photo())
    assert read_layout(source) is None
    assert read_layout(b"") is None and read_layout(b"\x89PNG\r\n") is None
    tiled = tile(source)
    layout = read_layout(tiled)
    assert (layout.width, layout.height, layout.tile_width, layout.tile_height) == (168, 120, 16, 16)
    assert (layout.columns, layout.rows) == (11, 8) and len(layout.lengths) == 88
    assert read_layout(tiled[:-1]) is None  # no EOI right after the last tile
    assert read_layout(tiled + b"\x00") is None  # bytes after EOI
    # one tile length changed: the lengths no longer add up to the data
    damaged = bytearray(tiled)
    first_length = 2 + 4 + 18  # SOI, the APP9 marker and length, the table header
    damaged[first_length + 1] ^= 1
    assert read_layout(bytes(damaged)) is None


def test_window_refuses_a_table_that_does_not_match_the_markers() -> None:
    tiled = bytearray(tile(jpeg(photo())))
    layout = read_layout(bytes(tiled))
    # move one byte from tile 0 to tile 1: the total still adds up, the first marker is off
    offset = 2 + 4 + 18
    lengths = np.frombuffer(bytes(tiled[offset:offset + 4]), ">u2").copy()
    lengths += np.array([-1, 1], dtype=np.int64).astype(">u2")
    tiled[offset:offset + 4] = lengths.astype(">u2").tobytes()
    layout = read_layout(bytes(tiled))
    assert layout is not None
    with pytest.raises(ValueError, match="does not match"):
        window_jpeg(bytes(tiled), layout, 0, 3, 0, 2)
    # the transform decodes the whole image instead, with the right pixels
    transform = RandomResizedCrop(64, scale=(0.05, 0.1), resize_backend="torch")
    plain = jpeg(photo())
    for seed in range(5):
        assert np.array_equal(transform(bytes(tiled), 1, np.random.default_rng(seed)),
                              transform(plain, 1, np.random.default_rng(seed)))


def test_window_rejects_out_of_range_tiles() -> None:
    tiled = tile(jpeg(photo()))
    layout = read_layout(tiled)
    for window in ((0, 0, 0, 1), (0, 12, 0, 1), (-1, 2, 0, 1), (0, 1, 3, 3), (0, 1, 0, 9)):
        with pytest.raises(ValueError, match="is not inside"):
            window_jpeg(tiled, layout, *window)


@pytest.mark.parametrize("subsampling", SUBSAMPLINGS + ("gray",))
def test_window_pixels_equal_a_full_decode(subsampling: str) -> None:
    """A window widened by window_margin(m) decodes the crop's pixels (rounded as the transforms
    round them) exactly as a full decode does, at every DCT scale."""
    pixels = photo(203, 297, seed=4)
    source = jpeg(pixels[:, :, :1] if subsampling == "gray" else pixels,
                  subsampling="420" if subsampling == "gray" else subsampling)
    tiled = tile(source)
    layout = read_layout(tiled)
    rng = np.random.default_rng(11)
    for m in (8, 4, 2, 1):
        factor = m / 8
        scaled = {} if m == 8 else {"min_width": math.ceil(layout.width * factor),
                                    "min_height": math.ceil(layout.height * factor)}
        full = simplejpeg.decode_jpeg(source, colorspace="RGB", **scaled)
        for _ in range(25):
            w, h = int(rng.integers(1, 200)), int(rng.integers(1, 150))
            left, top = int(rng.integers(0, layout.width - w + 1)), int(rng.integers(0, layout.height - h + 1))
            window = layout.window(left, top, left + w, top + h, window_margin(m))
            data, x, y = window_jpeg(tiled, layout, *window)
            width = min(window[1] * layout.tile_width, layout.width) - x
            height = min(window[3] * layout.tile_height, layout.height) - y
            kwargs = {} if m == 8 else {"min_width": math.ceil(width * factor),
                                        "min_height": math.ceil(height * factor)}
            part = simplejpeg.decode_jpeg(data, colorspace="RGB", **kwargs)
            x0, y0 = int(left * factor + 0.5), int(top * factor + 0.5)
            x1, y1 = int((left + w) * factor + 0.5), int((top + h) * factor + 0.5)
            if x1 <= x0 or y1 <= y0:
                continue
            dx, dy = int(x * factor), int(y * factor)
            assert np.array_equal(part[y0 - dy:y1 - dy, x0 - dx:x1 - dx], full[y0:y1, x0:x1]), \
                (m, left, top, w, h)


def test_window_margin_is_needed() -> None:
    """Without the margin, smooth chroma upsampling changes edge pixels: the margin is not slack."""
    source = jpeg(photo(203, 297, seed=4), subsampling="420")
    tiled = tile(source)
    layout = read_layout(tiled)
    full = simplejpeg.decode_jpeg(source)
    differences = 0
    for left in range(16, 200, 16):  # a box edge exactly on a tile edge
        window = layout.window(left, 32, left + 50, 90, margin=0)
        part = simplejpeg.decode_jpeg(window_jpeg(tiled, layout, *window)[0])
        x, y = window[0] * 16, window[2] * 16
        differences += not np.array_equal(part[32 - y:90 - y, left - x:left + 50 - x],
                                          full[32:90, left:left + 50])
    assert differences > 0
    assert WINDOW_MARGIN >= 2 and window_margin(4) == 4 and window_margin(1) == 16


# --- the decode transforms ---------------------------------------------------------------------

@pytest.mark.parametrize("subsampling", ["420", "422", "444"])
def test_random_resized_crop_gives_the_same_pixels_from_tiles(subsampling: str) -> None:
    pytest.importorskip("torch")
    source = jpeg(photo(375, 500, seed=5), quality=92, subsampling=subsampling)
    tiled = tile(source)
    transform = RandomResizedCrop(96, resize_backend="torch")
    for seed in range(60):
        assert np.array_equal(transform(tiled, 1, np.random.default_rng(seed)),
                              transform(source, 1, np.random.default_rng(seed)))


def test_random_resized_crop_with_pillow_resize_is_within_one_level() -> None:
    # Pillow's fixed-point filter weights depend on the box's offset, so a window shifts them.
    source = jpeg(photo(375, 500, seed=5))
    tiled = tile(source)
    transform = RandomResizedCrop(96, resize_backend="pil")
    for seed in range(30):
        a = transform(tiled, 1, np.random.default_rng(seed)).astype(int)
        b = transform(source, 1, np.random.default_rng(seed)).astype(int)
        assert np.abs(a - b).max() <= 1


def test_random_resized_crop_decodes_only_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    source = jpeg(photo(375, 500, seed=5))
    tiled = tile(source)
    sizes = []
    real = simplejpeg.decode_jpeg

    def spy(data, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        sizes.append(len(data))
        return real(data, *args, **kwargs)

    monkeypatch.setattr("packer.transforms.fused.simplejpeg.decode_jpeg", spy)
    transform = RandomResizedCrop(64, scale=(0.08, 0.2))
    for seed in range(10):
        transform(tiled, 1, np.random.default_rng(seed))
    assert len(sizes) == 10 and max(sizes) < 0.5 * len(tiled)


def test_center_crop_is_unchanged_by_tiling() -> None:
    source = jpeg(photo(375, 500, seed=6))
    transform = CenterCrop(128, resize=146)
    assert np.array_equal(transform(tile(source), 1), transform(source, 1))


# --- the codec and the build ---------------------------------------------------------------------

def test_codec_options_and_missing_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    codec = get_codec("tiled")
    assert isinstance(codec, TiledCodec) and codec.manifest_entry() == {"name": "tiled", "version": 1}
    with pytest.raises(OptionError, match="has no option 'quality'"):
        get_codec("tiled:quality=90")
    monkeypatch.setattr(tiles, "transcoder_available", lambda: False)
    with pytest.raises(MissingDependencyError, match="needs packer's compiled extension"):
        get_codec("tiled")
    monkeypatch.setitem(sys.modules, "packer.codecs._jpegtiles", None)  # as if it was never built
    monkeypatch.delattr(packer.codecs, "_jpegtiles", raising=False)
    with pytest.raises(MissingDependencyError, match="needs packer's compiled extension"):
        transcode(b"", max_pixels=1)


def test_build_with_the_tiled_codec(tmp_path: Path, sample_folder: Path) -> None:
    progressive = sample_folder / "class_000" / "zz_progressive.jpg"
    progressive.write_bytes(pillow_jpeg(photo(48, 64), progressive=True))
    tiled_out, plain_out = tmp_path / "tiled", tmp_path / "plain"
    build(sample_folder, tiled_out, BuildOptions(codec="tiled"), workers=2, progress=False)
    build(sample_folder, plain_out, BuildOptions(), workers=1, progress=False)
    manifest = json.loads((tiled_out / "manifest.json").read_text())
    assert manifest["codec"] == {"name": "tiled", "version": 1}
    assert verify(tiled_out, decode=True, workers=1, progress=False).ok

    tiled_ds, plain_ds = packer.open_dataset(tiled_out), packer.open_dataset(plain_out)
    assert len(tiled_ds) == len(plain_ds) and len(tiled_ds) > 0
    counted = {"tiled": 0, "as_is": 0}
    for i in range(len(plain_ds)):
        key = plain_ds.key(i)
        j = tiled_ds.find(key)
        source = bytes(plain_ds.get(i))
        stored = bytes(tiled_ds.get(j))
        assert tiled_ds.index.image_format[j] == plain_ds.index.image_format[i]
        if read_layout(stored) is not None:
            counted["tiled"] += 1
            assert pillow_pixels(stored).tobytes() == pillow_pixels(source).tobytes(), key
        else:
            counted["as_is"] += 1
            assert stored == source, key  # not a JPEG, or one that cannot be tiled
    jpegs = sum(1 for i in range(len(plain_ds)) if plain_ds.index.image_format[i] == 1)
    assert counted["tiled"] >= 1 and counted["tiled"] < jpegs  # the progressive one is kept as is
    # the build summary counts what the codec did with every image, JPEG or not
    others = Counter(f"kept: not a JPEG ({ImageFormat.NAMES[int(v)]})" for v in plain_ds.index.image_format if v != 1)
    assert manifest["build"]["codec_notes"] == {"kept: progressive": jpegs - counted["tiled"],
                                                "tiled": counted["tiled"], **others}
    assert sum(manifest["build"]["codec_notes"].values()) == len(plain_ds)
    assert "codec_notes" not in json.loads((plain_out / "manifest.json").read_text())["build"]
    tiled_ds.close()
    plain_ds.close()

    again = tmp_path / "again"
    build(sample_folder, again, BuildOptions(codec="tiled"), workers=1, progress=False)
    assert (again / "manifest.json").read_bytes() == (tiled_out / "manifest.json").read_bytes()


def test_tiled_dataset_through_the_cli(tmp_path: Path, sample_folder: Path) -> None:
    from click.testing import CliRunner

    from packer.cli import _register, cli

    _register()
    out = tmp_path / "ds"
    runner = CliRunner()
    result = runner.invoke(cli, ["build", str(sample_folder), str(out), "--codec", "tiled",
                                  "--workers", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["verify", str(out), "--decode"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["inspect", str(out)])
    assert result.exit_code == 0 and "tiled" in result.output, result.output
    assert "codec did" in result.output and " tiled" in result.output.split("codec did")[1]


# --- the spec's vectors (formats/vectors/tiled, section 13) ----------------------------------------

VECTORS = Path(__file__).resolve().parents[2] / "formats" / "vectors" / "tiled"


def test_tiled_vectors() -> None:
    from packer.format import checksum, checksum_hex

    expected = json.loads((VECTORS / "expected.json").read_text())
    for name, image in expected["images"].items():
        source = (VECTORS / f"{name}.source.jpg").read_bytes()
        tiled = (VECTORS / f"{name}.tiled.jpg").read_bytes()
        assert checksum_hex(checksum(tiled)) == image["tiled_xxh3"]
        assert tile(source) == tiled  # the writer is byte-for-byte reproducible
        assert np.array_equal(pillow_pixels(tiled), pillow_pixels(source))
        layout = read_layout(tiled)
        assert (layout.width, layout.height, layout.tile_width, layout.tile_height,
                layout.columns, layout.rows) == tuple(image[k] for k in (
                    "width", "height", "tile_width", "tile_height", "columns", "rows"))
        assert layout.lengths.tolist() == image["lengths"]
        for window in image["windows"]:
            data, x, y = window_jpeg(tiled, layout, *window["tiles"])
            assert (x, y, len(data)) == (window["x"], window["y"], window["size"])
            assert checksum_hex(checksum(bytes(data))) == window["xxh3"]
            part = pillow_pixels(bytes(data))
            assert part.shape[:2] == (min(window["tiles"][3] * layout.tile_height, layout.height) - y,
                                      min(window["tiles"][1] * layout.tile_width, layout.width) - x)
    for name, damaged in expected["damaged"].items():
        data = (VECTORS / damaged["file"]).read_bytes()
        layout = read_layout(data)
        if damaged["outcome"] == "whole":
            assert layout is None, name
        else:
            assert layout is not None, name
            with pytest.raises(ValueError, match="does not match"):
                window_jpeg(data, layout, *damaged["window"])


# --- the compiled window cutter is the Python one's twin ---------------------------------------

def python_cut(data: bytes, box: tuple[float, float, float, float], margin: int):
    saved, tiles._window = tiles._window, None
    try:
        return tiles.cut_window(data, box, margin)
    finally:
        tiles._window = saved


def random_box(rng: np.random.Generator, width: int, height: int) -> tuple[float, ...]:
    w, h = rng.uniform(1, width * 1.1), rng.uniform(1, height * 1.1)
    left, top = rng.uniform(-10, width), rng.uniform(-10, height)
    return (float(left), float(top), float(left + w), float(top + h))


@pytest.mark.parametrize("subsampling", SUBSAMPLINGS + ("gray",))
def test_compiled_window_equals_the_python_reference(subsampling: str) -> None:
    assert tiles._window is not None
    pixels = photo(77, 131, seed=8)
    source = jpeg(pixels[:, :, :1] if subsampling == "gray" else pixels,
                  subsampling="420" if subsampling == "gray" else subsampling)
    tiled = tile(source)
    rng = np.random.default_rng(12)
    seen = {"window": 0, "none": 0}
    for _ in range(150):
        box, margin = random_box(rng, 131, 77), int(rng.integers(0, 20))
        compiled, reference = tiles.cut_window(tiled, box, margin), python_cut(tiled, box, margin)
        assert compiled == reference, (box, margin)
        seen["window" if compiled else "none"] += 1
    assert seen["window"] > 50, seen
    whole = (-1.0, -1.0, 140.0, 80.0)  # every tile: decode the image whole instead
    assert tiles.cut_window(tiled, whole, 0) is None and python_cut(tiled, whole, 0) is None
    assert tiles.cut_window(source, (0, 0, 5, 5), 1) is None  # an ordinary JPEG


def test_compiled_window_equals_the_python_reference_on_damaged_files() -> None:
    """Byte flips in the header, the tables and the data: both give None or the same bytes."""
    tiled = tile(jpeg(photo(40, 72, seed=9), subsampling="422"))
    header_end = tiled.index(b"\xff\xda")
    rng = np.random.default_rng(13)
    outcomes = {"same window": 0, "both none": 0}
    for trial in range(1500):
        damaged = bytearray(tiled)
        where = header_end + 20 if trial % 3 == 0 else len(tiled)
        for position in rng.integers(2, where, size=int(rng.integers(1, 3))):
            damaged[position] = int(rng.integers(0, 256))
        if trial % 10 == 0:
            damaged = damaged[:int(rng.integers(2, len(damaged)))]
        data = bytes(damaged)
        box, margin = random_box(rng, 72, 40), int(rng.integers(0, 8))
        compiled, reference = tiles.cut_window(data, box, margin), python_cut(data, box, margin)
        assert compiled == reference, (trial, box, margin)
        outcomes["same window" if compiled else "both none"] += 1
    assert min(outcomes.values()) > 100, outcomes


# --- codecs/tiles: the tiled window cutter and the reasons a JPEG stays untiled -------------------


def _with_comment(jpeg: bytes, size: int) -> bytes:
    """``jpeg`` with a COM segment of ``size`` payload bytes right after SOI (a length >= 256 spans two bytes)."""
    return jpeg[:2] + b"\xff\xfe" + struct.pack(">H", size + 2) + bytes(range(256)) * (size // 256) + bytes(size % 256) + jpeg[2:]


def _frame(marker: int, precision: int = 8) -> bytes:
    """SOI and a bare frame header: enough for the marker walk, not a decodable JPEG."""
    return b"\xff\xd8\xff" + bytes([marker]) + struct.pack(">HB", 11, precision) + bytes(8)


def _as_buffers(data: bytes) -> list[Any]:
    return [data, bytearray(data), memoryview(data), np.frombuffer(data, dtype=np.uint8)]


def test_untiled_reason_reads_every_frame_kind() -> None:
    expected = {0xC2: "progressive", 0xC6: "progressive", 0xC3: "lossless", 0xC7: "lossless",
                **{m: "arithmetic" for m in (0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF)}}
    for marker, reason in expected.items():
        assert tiles_module.untiled_reason(_frame(marker)) == reason, hex(marker)
    assert tiles_module.untiled_reason(_frame(0xC0, 12)) == "12-bit"
    assert tiles_module.untiled_reason(_frame(0xC1, 16)) == "16-bit"
    for marker in (0xCC, 0xD0, 0xC0, 0xC4):  # DAC, RST0, an 8-bit baseline frame, DHT: no verdict from the header
        assert tiles_module.untiled_reason(_frame(marker)) == "damaged or multi-scan", hex(marker)


def test_untiled_reason_at_the_end_of_the_bytes() -> None:
    assert tiles_module.untiled_reason(b"\xff\xd8\xff\xc2\x00\x02") == "progressive"  # a 4-byte segment at the end
    assert tiles_module.untiled_reason(b"\xff\xd8\xff\xc0\x00\x11") == "damaged or multi-scan"  # no precision byte
    assert tiles_module.untiled_reason(b"\xff\xd8\xff\xc0\x00\x11\x0c") == "12-bit"  # the precision is the last byte
    assert tiles_module.untiled_reason(b"\xff\xd8\xff\xc2\x00") == "damaged or multi-scan"


def test_untiled_reason_skips_long_segments_in_any_buffer() -> None:
    progressive = _with_comment(jpeg_bytes(16, 16, progressive=True), 300)
    for data in _as_buffers(progressive):
        assert tiles_module.untiled_reason(data) == "progressive", type(data)
    twelve_bit = _with_comment(_frame(0xC0, 12), 700)
    assert [tiles_module.untiled_reason(d) for d in _as_buffers(twelve_bit)] == ["12-bit"] * 4


def test_untiled_reason_asks_the_transcoder_after_the_header() -> None:
    baseline = jpeg_bytes(24, 40)
    for data in _as_buffers(baseline + b"trailing bytes"):
        assert tiles_module.untiled_reason(data) == "data after the image"
    assert tiles_module.untiled_reason(baseline[:200]) == "damaged or multi-scan"


def test_transcoder_available_is_false_without_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    import packer.codecs as codecs_package

    assert tiles_module.transcoder_available() is True  # the suite runs with the extension built
    monkeypatch.delattr(codecs_package, "_jpegtiles", raising=False)
    monkeypatch.setitem(sys.modules, "packer.codecs._jpegtiles", None)  # import now raises ImportError
    assert tiles_module.transcoder_available() is False


def _tiled(height: int, width: int) -> tuple[bytes, tiles_module.TileLayout]:
    data = tiles_module.transcode(jpeg_bytes(height, width, quality=90), max_pixels=10**8)
    layout = tiles_module.read_layout(data)
    assert layout is not None and layout.rows >= 2 and layout.columns >= 2
    return data, layout


def test_window_jpeg_reads_any_contiguous_buffer_by_bytes() -> None:
    data, layout = _tiled(96, 160)
    expected = tiles_module.window_jpeg(data, layout, 1, 2, 0, 2)
    as_matrix = np.frombuffer(data, dtype=np.uint8).reshape(1, -1)
    for buffer in _as_buffers(data)[1:] + [as_matrix]:
        assert tiles_module.window_jpeg(buffer, layout, 1, 2, 0, 2) == expected, type(buffer)


def test_window_jpeg_checks_the_marker_before_the_second_row() -> None:
    """A table whose second row starts one byte late, with its first tile one byte shorter: the tile
    still ends at a restart marker, only the marker before it can tell."""
    data, layout = _tiled(96, 160)
    starts, lengths = layout.starts.copy(), layout.lengths.copy()
    first = layout.columns  # tile (row 1, column 0)
    starts[first] += 1
    lengths[first] -= 1
    shifted = dataclasses.replace(layout, starts=starts, lengths=lengths)
    with pytest.raises(ValueError) as caught:
        tiles_module.window_jpeg(data, shifted, 0, layout.columns, 0, 2)
    assert str(caught.value) == "the tile table does not match the JPEG's restart markers"


def test_window_jpeg_of_a_window_wider_than_32767_pixels() -> None:
    """JPEG dimensions are unsigned 16-bit: a 40,000-pixel-wide window is valid."""
    x = np.arange(40_000)
    pixels = np.tile(((x // 50) % 256).astype(np.uint8), (16, 1))
    buffer = _io.BytesIO()
    Image.fromarray(pixels, "L").save(buffer, "JPEG", quality=80)
    data = tiles_module.transcode(buffer.getvalue(), max_pixels=10**9)
    layout = tiles_module.read_layout(data)
    assert layout is not None and layout.rows == 2
    window, left, top = tiles_module.window_jpeg(data, layout, 0, layout.columns, 1, 2)
    assert (left, top) == (0, layout.tile_height)
    with Image.open(_io.BytesIO(bytes(window))) as image:
        assert image.size == (40_000, 16 - layout.tile_height)
    with Image.open(_io.BytesIO(data)) as whole:
        assert np.array_equal(np.asarray(Image.open(_io.BytesIO(bytes(window)))), np.asarray(whole)[layout.tile_height:])


# --- class 11: the C extension --------------------------------------------------------------------


def test_window_refuses_nan_infinite_and_huge_boxes():
    from packer.codecs import _jpegtiles
    from packer.codecs.tiles import transcode

    tiled = transcode(noisy_jpeg(1, (64, 96)), max_pixels=10**8)
    assert _jpegtiles.window(tiled, 0.0, 0.0, 16.0, 16.0, 8) is not None
    for box in ((math.nan, 0.0, 8.0, 8.0), (0.0, 0.0, math.inf, 8.0), (-math.inf, 0.0, 8.0, 8.0),
                (0.0, 0.0, 8.0, 1e300), (-1e300, 0.0, 8.0, 8.0)):
        with pytest.raises(ValueError, match="finite"):
            _jpegtiles.window(tiled, *box, 8)
    with pytest.raises(ValueError):
        _jpegtiles.window(tiled, 0.0, 0.0, 8.0, 8.0, -1)
    count_trial("class11-window-box", 6)


def test_writable_buffers_give_the_same_bytes_as_read_only_ones():
    from packer.codecs import _jpegtiles
    from packer.codecs.tiles import transcode

    source = noisy_jpeg(2, (64, 96))
    tiled = transcode(source, max_pixels=10**8)
    assert transcode(bytearray(source), max_pixels=10**8) == tiled
    assert transcode(np.frombuffer(source, dtype=np.uint8).copy(), max_pixels=10**8) == tiled
    expected = _jpegtiles.window(tiled, 16.0, 8.0, 40.0, 30.0, 8)
    assert _jpegtiles.window(bytearray(tiled), 16.0, 8.0, 40.0, 30.0, 8) == expected
    count_trial("class11-writable-buffers", 3)


def test_huffman_table_with_an_all_ones_code_is_refused_like_libjpeg():
    from packer.codecs.tiles import transcode

    source = noisy_jpeg(3)
    position = source.index(b"\xff\xc4")
    length = struct.unpack(">H", source[position + 2:position + 4])[0]
    # One DC table (class 0, id 0) with two 1-bit codes: "0" and "1", the second all ones.
    table = bytes([0x00]) + bytes([2] + [0] * 15) + bytes([0, 1])
    bad = source[:position] + b"\xff\xc4" + struct.pack(">H", 2 + len(table)) + table + source[position + 2 + length:]
    with pytest.raises(ValueError, match="Huffman table has too many codes"):
        transcode(bad, max_pixels=10**8)
    # Pillow (libjpeg-turbo) refuses the table too.
    with pytest.raises(Exception):
        Image.open(io.BytesIO(bad)).load()
    count_trial("class11-all-ones-huffman", 1)
