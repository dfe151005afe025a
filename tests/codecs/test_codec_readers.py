"""The read half of the codecs: ``codec_for`` and what each codec's reader answers (issue 34)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import edit_manifest, png_folder
from packer.codecs import (CODECS, CodecReader, EncodedImageReader, JpegReader, PassthroughReader, RawReader,
                           TiledReader, UnknownCodecReader, check_decodable, codec_for, keeps_source_geometry)
from packer.dataset import open_dataset, open_index
from packer.decode import decode_image
from packer.errors import DecodeError, IndexMismatchError, ManifestError
from packer.writer import build
from packer.writer.plan import BuildOptions

RAW = {"name": "raw", "height": 6, "width": 5, "channels": 3, "layout": "HWC", "dtype": "uint8"}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One small dataset per codec, from the same 6 PNGs (16 wide, 12..17 high)."""
    base = tmp_path_factory.mktemp("readers")
    source = png_folder(base / "src", 6)
    specs = {"passthrough": "passthrough", "tiled": "tiled", "jpeg": "jpeg:max_size=8", "raw": "raw:size=6x5"}
    out = {}
    for name, spec in specs.items():
        build(source, base / name, BuildOptions(codec=spec, alignment=64, shuffle=False), workers=1, progress=False)
        out[name] = base / name
    return out


def test_every_codec_names_its_read_half() -> None:
    """A codec is one registry entry whose class carries both halves."""
    for name, codec in CODECS.items():
        assert issubclass(codec.reader, CodecReader), name
        assert type(codec_for({"name": name})) is codec.reader
    assert {name: codec.reader for name, codec in CODECS.items()} == {
        "passthrough": PassthroughReader, "tiled": TiledReader, "jpeg": JpegReader, "raw": RawReader}


def test_codec_for_takes_a_dataset_an_index_a_manifest_or_a_codec_entry(datasets: dict[str, Path]) -> None:
    with open_dataset(datasets["raw"]) as dataset, open_index(datasets["raw"]) as index:
        for source in (dataset, index):
            codec = codec_for(source)
            assert type(codec) is RawReader and codec.path == source.path and codec.sample_count == 6
            assert codec.entry is source.manifest.codec and codec.notes == {"resampled": 6}
        assert codec_for(index.manifest).path is None and codec_for(index.manifest).notes == {"resampled": 6}
        alone = codec_for(index.manifest.codec, path="here")
        assert alone.path == "here" and alone.notes is None and alone.sample_shape == (6, 5, 3)


@pytest.mark.parametrize("name, encoded, pixels, geometry", [
    ("passthrough", True, False, True), ("tiled", True, False, True), ("jpeg", True, False, False),
    ("raw", False, True, False)])
def test_what_each_codec_answers(datasets: dict[str, Path], name: str, encoded: bool, pixels: bool,
                                 geometry: bool) -> None:
    with open_dataset(datasets[name]) as dataset:
        codec = codec_for(dataset)
        assert codec.name == name and (codec.encoded, codec.stores_pixels) == (encoded, pixels)
        assert isinstance(codec, EncodedImageReader) is encoded
        assert codec.keeps_source_geometry is geometry is keeps_source_geometry(dataset.manifest)
        assert codec.crops_source is pixels  # raw centre-crops (these sources are not 6x5)
        assert codec.sample_shape == ((6, 5, 3) if pixels else None)
        codec.check_decodable()
        for i in range(len(dataset)):
            data = np.frombuffer(dataset.get(i), dtype=np.uint8)
            got = codec.pixels(dataset, i, data)
            stored = codec.stored_pixels(dataset, i, data)
            if pixels:
                assert stored is not None and np.shares_memory(stored, data) and got.shape == (6, 5, 3)
                assert got.tobytes() == dataset.read(i)
            else:
                assert stored is None
                np.testing.assert_array_equal(got, decode_image(dataset.get(i), int(dataset.index.image_format[i])))
        if not pixels:
            with pytest.raises(ManifestError) as caught:
                codec.pixel_shape()
            assert caught.value.message == (f"codec is {name!r}, not 'raw': payloads are encoded images, decode "
                                            f"them instead")


def test_jpeg_keeps_the_grid_without_max_size_and_raw_when_every_source_had_its_size() -> None:
    assert codec_for({"name": "jpeg", "quality": 90}).keeps_source_geometry
    assert not codec_for({"name": "jpeg", "max_size": 256}).keeps_source_geometry
    kept = RawReader(RAW, notes={"kept size": 4}, sample_count=4)
    assert kept.keeps_source_geometry and not kept.crops_source
    for notes, count in (({"kept size": 3, "resampled": 1}, 4), ({"kept size": 3}, 4), (None, 4), ("kept", 4)):
        reader = RawReader(RAW, notes=notes, sample_count=count)
        assert not reader.keeps_source_geometry and reader.crops_source


def test_an_unknown_codec_reads_bytes_but_refuses_to_decode_naming_it_and_the_known_ones() -> None:
    codec = codec_for({"name": "zstd-future", "level": 3}, path="ds")
    assert type(codec) is UnknownCodecReader and codec.name == "zstd-future"
    assert not codec.encoded and not codec.stores_pixels and codec.sample_shape is None
    assert not codec.keeps_source_geometry and not codec.crops_source
    message = ("the dataset's codec 'zstd-future' is not one this packer can decode (it knows jpeg, passthrough, "
               "raw, tiled); upgrade packer, or read the payload bytes without decoding")
    for refuse in (codec.check_decodable, lambda: codec.pixels(None, 0, np.zeros(3, np.uint8)),
                   lambda: check_decodable({"name": "zstd-future"}, path="ds")):
        with pytest.raises(DecodeError) as caught:
            refuse()
        assert (caught.value.message, caught.value.path) == (message, "ds")
    assert type(codec_for("raw")) is UnknownCodecReader and codec_for({"name": 5}).name == 5


def test_raw_refuses_what_it_cannot_read() -> None:
    with pytest.raises(DecodeError) as caught:
        codec_for({**RAW, "layout": "CHW"}).check_decodable()
    assert caught.value.message == ("raw codec with layout 'CHW' and dtype 'uint8': this packer decodes only "
                                    "layout 'HWC', dtype 'uint8'")
    with pytest.raises(ManifestError, match="declares 4 channels"):
        codec_for({**RAW, "channels": 4}).sample_shape
    assert codec_for(RAW).stride(64) == 128 and codec_for(RAW).stride(1) == 90


def test_raw_per_sample_pixels_follow_the_index_row(datasets: dict[str, Path], tmp_path: Path) -> None:
    """A payload that does not hold its index row's pixels is a DecodeError naming the sample."""
    from helpers import rewrite_index

    copy = Path(shutil.copytree(datasets["raw"], tmp_path / "raw"))
    rewrite_index(copy, lambda columns: columns["width"].__setitem__(2, 4))
    with open_dataset(copy) as dataset:
        codec = codec_for(dataset)
        with pytest.raises(DecodeError) as caught:
            codec.pixels(dataset, 2, np.frombuffer(dataset.get(2), dtype=np.uint8))
        assert (caught.value.message, caught.value.sample) == (
            "raw payload of 90 bytes does not hold the index's 6x4x3 pixels", 2)


def test_the_raw_layout_check_names_the_first_row_that_breaks_it(datasets: dict[str, Path], tmp_path: Path) -> None:
    from helpers import rewrite_index

    with open_dataset(datasets["raw"]) as dataset:
        runs = codec_for(dataset).check_rows(dataset, np.array([4, 1, 5], dtype=np.int64))
        assert len(runs) == 1 and runs[0].rows is None and runs[0].positions.tolist() == [4, 1, 5]
        assert runs[0].offsets.tolist() == [int(dataset.index.offset[i]) for i in (4, 1, 5)]
        codec_for(dataset).check_index(dataset.index)
    copy = Path(shutil.copytree(datasets["raw"], tmp_path / "raw"))
    rewrite_index(copy, lambda columns: columns["size"].__setitem__(3, 70))
    with open_dataset(copy) as dataset:
        with pytest.raises(IndexMismatchError) as caught:
            codec_for(dataset).check_rows(dataset, np.array([1, 3], dtype=np.int64))
        assert (caught.value.message, caught.value.sample) == ("raw sample of 70 bytes, expected 90 (6x5x3)", 3)
    edit_manifest(copy, lambda document: document["codec"].update(width=4))
    with open_dataset(copy) as dataset:
        with pytest.raises(IndexMismatchError) as caught:
            codec_for(dataset).check_index(dataset.index)
        assert caught.value.sample == 0 and "the raw codec says every sample is 72 bytes (6x4x3)" in caught.value.message
