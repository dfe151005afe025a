"""A raw dataset whose manifest declares another channel count than 3 (issue 25): every raw reader,
the batched crop path included, refuses it with a typed ``ManifestError`` (formats/SPEC.md, codec
``raw``), never an untyped ValueError from deep inside the crop kernel."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.codecs import raw_sample_shape
from packer.dataset import open_dataset
from packer.errors import ManifestError
from packer.rawcrop import raw_shape_of, read_raw_batch
from packer.writer import build
from packer.writer.plan import BuildOptions


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("rawch")
    (base / "src" / "a").mkdir(parents=True)
    for i in range(6):
        Image.fromarray(np.full((8, 8, 3), 10 * i, np.uint8)).save(base / "src" / "a" / f"{i}.png")
    build(base / "src", base / "ds", BuildOptions(codec="raw:size=8x8"), workers=1, progress=False)
    return base / "ds"


def _declaring(raw: Path, tmp_path: Path, height: int, width: int, channels: int) -> Path:
    copy = tmp_path / f"ds{channels}"
    shutil.copytree(raw, copy)
    document = json.loads((raw / "manifest.json").read_text("utf-8"))
    document["codec"].update(height=height, width=width, channels=channels)
    (copy / "manifest.json").write_text(json.dumps(document), "utf-8")
    return copy


# The same 192-byte payloads declared as other shapes: 1, 4 and 6 channels.
SHAPES = [(8, 24, 1), (8, 6, 4), (4, 8, 6)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[2]}ch")
def test_raw_readers_refuse_a_channel_count_other_than_3_with_a_typed_error(raw: Path, tmp_path: Path,
                                                                            shape: tuple[int, int, int]) -> None:
    folder = _declaring(raw, tmp_path, *shape)
    with open_dataset(folder) as ds:
        with pytest.raises(ManifestError, match=f"declares {shape[2]} channels; raw payloads hold exactly 3"):
            raw_shape_of(ds)
        with pytest.raises(ManifestError):
            raw_sample_shape(ds.manifest.codec, path=ds.path)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[2]}ch")
def test_the_batched_crop_path_raises_manifest_error_not_value_error(raw: Path, tmp_path: Path,
                                                                     shape: tuple[int, int, int]) -> None:
    pytest.importorskip("torch")
    from packer.torch import PackedDataset
    from packer.transforms import CenterCrop, RandomResizedCrop

    folder = _declaring(raw, tmp_path, *shape)
    for decode in (RandomResizedCrop(4, seed=0), CenterCrop(4), True):
        dataset = PackedDataset(folder, decode=decode, layout="HWC")
        with pytest.raises(ManifestError, match="channels") as caught:
            dataset.load_batch([0, 1, 2])
        assert not isinstance(caught.value, ValueError)


def test_three_channels_still_read(raw: Path) -> None:
    with open_dataset(raw) as ds:
        shape = raw_shape_of(ds)
        assert shape == (8, 8, 3)
        pixels = read_raw_batch(ds, [0, 5], shape)
        assert pixels[1].tobytes() == ds.read(5)
