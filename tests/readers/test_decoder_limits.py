"""Decoding readers enforce SPEC §6 and what their decoders can take: PackedDataset and
PackedIterableDataset refuse an unknown codec and decode with the recorded pixel limit; DALI
sources refuse formats DALI cannot decode at construction, not inside a running pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.writer import build
from packer.writer.plan import BuildOptions
from packer.errors import DecodeError, PackerError

torch = pytest.importorskip("torch")
from packer.torch import PackedDataset, PackedIterableDataset  # noqa: E402


def _folder(root: Path, fmt_name: str, suffix: str) -> Path:
    rng = np.random.default_rng(0)
    for k in range(3):
        (root / "a").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (9, 7, 3), dtype=np.uint8)).save(root / "a" / f"{k}.{suffix}", fmt_name)
    return root


def _with_codec(out: Path, codec: dict) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["codec"] = codec
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))


def test_torch_readers_refuse_an_unknown_codec(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    build(_folder(tmp_path / "src", "PNG", "png"), out, BuildOptions(), workers=1)
    _with_codec(out, {"name": "zstd-future"})
    for make in (lambda **kw: PackedDataset(out, **kw), lambda **kw: PackedIterableDataset(out, batch_size=2, **kw)):
        with pytest.raises(PackerError, match="zstd-future"):
            make()
        make(decode=False)  # the stored bytes are still readable: only decoding is refused


def test_torch_readers_decode_with_the_recorded_pixel_limit(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    Image.new("RGB", (300, 200)).save(src / "big.png")  # 60,000 pixels
    build(tmp_path / "src", out, BuildOptions(max_pixels=150_000_000), workers=1)
    image, _ = PackedDataset(out)[0]
    assert tuple(image.shape) == (3, 200, 300)
    dataset = PackedDataset(out)
    dataset._pipeline.max_pixels = 50_000  # what a reader ignoring the manifest's limit would do
    with pytest.raises(DecodeError):
        dataset[0]


def test_dali_sources_refuse_formats_dali_cannot_decode(tmp_path: Path) -> None:
    pytest.importorskip("nvidia.dali")
    from packer.dali import PackedBatchSource, PackedSampleSource

    out = tmp_path / "ds"
    build(_folder(tmp_path / "src", "TGA", "tga"), out, BuildOptions(), workers=1)
    for source in (PackedSampleSource, PackedBatchSource):
        with pytest.raises(DecodeError, match="cannot decode 3 tga sample"):
            source(out, 2)
        assert source(out, 2, check_formats=False).num_samples == 3  # a pipeline that decodes them itself
    png = tmp_path / "png"
    build(_folder(tmp_path / "src2", "PNG", "png"), png, BuildOptions(), workers=1)
    assert PackedSampleSource(png, 2).num_samples == 3
