"""packer export refuses what it cannot write verbatim or safely, before writing anything: a build
whose payloads are not the source files (a re-encoding codec, --normalize-formats), a bad target
or shard size, an unreadable keys file (the promise inventory's export sites, issue 31)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from packer.errors import OptionError
from packer.export import export
from packer.writer import build
from packer.writer.plan import BuildOptions

from helpers import png_folder


@pytest.fixture(scope="module")
def passthrough(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("export-refusals")
    build(png_folder(tmp / "src", 4), tmp / "ds", BuildOptions(shard_size=16 << 10), workers=1, progress=False)
    return tmp / "ds"


@pytest.mark.parametrize("to, per_shard, message", [
    ("zip", 10, "--to must be one of folder, tar, webdataset, got 'zip'"),
    ("webdataset", 0, "--samples-per-shard must be at least 1, got 0"),
])
def test_a_bad_target_or_shard_size_is_refused_by_name(passthrough: Path, tmp_path: Path, to: str, per_shard: int,
                                                        message: str) -> None:
    with pytest.raises(OptionError) as caught:
        export(passthrough, tmp_path / "out", to=to, samples_per_shard=per_shard)
    assert caught.value.message == message
    assert not (tmp_path / "out").exists()


def test_an_unreadable_keys_file_is_an_option_error(passthrough: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_bytes(b"cat/001.png\n\xff\xfe not text\n")
    with pytest.raises(OptionError) as caught:
        export(passthrough, tmp_path / "out", keys=keys)
    assert caught.value.message.startswith(f"--keys: cannot read {keys}: ")
    with pytest.raises(OptionError, match="--keys: cannot read .*missing.txt"):
        export(passthrough, tmp_path / "out2", keys=tmp_path / "missing.txt")


def test_a_normalized_build_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """--normalize-formats stores a PNG converted from a TIFF: not the source file, so not exportable."""
    src = png_folder(tmp_path / "src", 3)
    Image.new("RGB", (9, 7), (200, 10, 10)).save(src / "dog" / "scan.tif")
    build(src, tmp_path / "ds", BuildOptions(normalize_formats=True), workers=1, progress=False)
    for to in ("folder", "tar", "webdataset"):
        with pytest.raises(OptionError) as caught:
            export(tmp_path / "ds", tmp_path / f"out-{to}", to=to)
        assert caught.value.message == ("this dataset was built with --normalize-formats: some payloads are PNGs "
                                        "converted from the source files, so there is nothing to export verbatim")
        assert not (tmp_path / f"out-{to}").exists()


def test_a_re_encoded_build_is_refused_with_its_codec(tmp_path: Path) -> None:
    src = png_folder(tmp_path / "src", 3)
    build(src, tmp_path / "ds", BuildOptions(codec="raw:size=8x8"), workers=1, progress=False)
    with pytest.raises(OptionError) as caught:
        export(tmp_path / "ds", tmp_path / "out")
    assert caught.value.message.startswith("this dataset was built with codec 'raw': its payloads are not the source")
    assert not (tmp_path / "out").exists()
