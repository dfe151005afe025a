"""Decoding readers enforce SPEC §6 and what their decoders can take: PackedDataset and
PackedIterableDataset refuse an unknown codec and decode with the recorded pixel limit; DALI
sources refuse formats DALI cannot decode at construction, not inside a running pipeline."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from packer import format as fmt
from packer.dataset import open_index
from packer.errors import DecodeError, PackerError
from packer.writer import build
from packer.writer.plan import BuildOptions

from helpers import copy_dataset, count_trial, noisy_png_classes, run_main

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


# --- class 7: readers enforce the SPEC ------------------------------------------------------------


def _edit_manifest(ds: Path, edit: Any) -> None:
    manifest = json.loads((ds / fmt.MANIFEST_NAME).read_text())
    edit(manifest)
    (ds / fmt.MANIFEST_NAME).write_text(json.dumps(manifest))


def test_unknown_codec_is_refused_by_every_decoding_reader(small_dataset, tmp_path):
    from packer.codecs import check_decodable
    from packer.errors import DecodeError

    ds = copy_dataset(small_dataset, tmp_path / "ds")
    _edit_manifest(ds, lambda m: m.update(codec={"name": "zstd-future", "level": 3}))
    code, out, err = run_main(["verify", str(ds), "-q"])
    assert code == 0, out + err  # checksums only: the codec does not matter (SPEC 6 MAY)
    code, out, err = run_main(["verify", str(ds), "-q", "--decode"])
    assert code == 1 and "zstd-future" in out and "not one this packer can decode" in out, out + err
    code, out, err = run_main(["inspect", str(ds), "--grid", str(tmp_path / "g.png"), "--grid-count", "2"])
    assert code == 1 and "zstd-future" in err and not (tmp_path / "g.png").exists(), err
    code, out, err = run_main(["inspect", str(ds), "--sample", "0", "--extract", str(tmp_path / "x.bin")])
    assert code == 0, err  # stored bytes only: allowed
    for entry in ({"name": "zstd-future"}, {"name": 5}, {}, "raw",
                  {"name": "raw", "layout": "CHW", "dtype": "uint8"}, {"name": "raw", "layout": "HWC", "dtype": "f4"}):
        with pytest.raises(DecodeError):
            check_decodable(entry)
    check_decodable({"name": "raw", "layout": "HWC", "dtype": "uint8", "height": 2, "width": 2})
    count_trial("class7-unknown-codec", 10)


def test_max_pixels_is_recorded_and_honoured_by_readers(tmp_path, monkeypatch):
    from packer import decode as decode_module
    from packer.codecs import dataset_max_pixels
    from packer._internal.imageinfo import DEFAULT_MAX_PIXELS
    from packer.verify import verify

    src = noisy_png_classes(tmp_path / "src")
    build(src, tmp_path / "default", workers=1, progress=False)
    with open_index(tmp_path / "default") as index:
        assert index.manifest.max_pixels is None and "limits" not in index.manifest.raw
        assert dataset_max_pixels(index.manifest) == DEFAULT_MAX_PIXELS
    build(src, tmp_path / "big", BuildOptions(max_pixels=300_000_000), workers=1, progress=False)
    with open_index(tmp_path / "big") as index:
        assert index.manifest.raw["limits"] == {"max_pixels": 300_000_000}
        assert dataset_max_pixels(index.manifest) == 300_000_000
        assert dataset_max_pixels(index.manifest, 5) == 5
    seen: list[int] = []
    real = decode_module.decode_image

    def spy(data: Any, image_format: int, **kwargs: Any) -> Any:
        seen.append(kwargs["max_pixels"])
        return real(data, image_format, **kwargs)

    monkeypatch.setattr(decode_module, "decode_image", spy)
    assert verify(tmp_path / "big", decode=True, workers=1, progress=False).ok
    assert seen and set(seen) == {300_000_000}
    monkeypatch.setattr(decode_module, "decode_image", real)
    code, out, err = run_main(["verify", str(tmp_path / "big"), "--decode", "-q", "--workers", "1",
                               "--max-pixels", "10"])
    assert code == 1 and "max_pixels" in out, out  # the override is applied
    # append keeps the recorded limit
    new = noisy_png_classes(tmp_path / "new", classes=1, per_class=1)
    (new / "class0").rename(new / "class7")
    code, out, err = run_main(["append", str(tmp_path / "big"), str(new), "-q", "--workers", "1"])
    assert code == 0, err
    with open_index(tmp_path / "big") as index:
        assert index.manifest.max_pixels == 300_000_000
    count_trial("class7-max-pixels", 4)


def test_pillow_global_limit_never_decides(monkeypatch):
    """WEBP (checked by Pillow's own plugin at open) follows max_pixels like every format."""
    from PIL import Image as PILImage

    from packer.decode import decode_image
    from packer._internal.imageinfo import probe_image

    buffer = io.BytesIO()
    PILImage.fromarray(np.zeros((40, 50, 3), dtype=np.uint8)).save(buffer, "WEBP", lossless=True)
    data = buffer.getvalue()
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 100)  # Pillow refuses over 200 px now
    info = probe_image(data, max_pixels=10_000)
    assert (info.width, info.height) == (50, 40)
    assert decode_image(data, info.image_format, max_pixels=10_000).shape == (40, 50, 3)
    assert PILImage.MAX_IMAGE_PIXELS == 100  # restored
    with pytest.raises(PackerError):
        probe_image(data, max_pixels=1_000)
    count_trial("class7-pillow-limit", 3)
