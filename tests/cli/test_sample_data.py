"""``packer sample-data OUT``: real photographs in the folders the guides name, deterministic,
never written over, and small enough to ship (the licences beside them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
import packer.cli.sampledata_cmd  # noqa: F401  (registers the command)
from packer.cli import cli
from packer.errors import OptionError
from packer.sampledata import CLASSES, ENTRIES, write_sample_data

PHOTOS = Path(packer.__file__).parent / "sampledata" / "photos"


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_it_writes_every_folder_the_guides_name_and_builds(tmp_path: Path) -> None:
    done = CliRunner().invoke(cli, ["sample-data", str(tmp_path / "data"), "--json"])
    assert done.exit_code == 0, done.output
    document = json.loads(done.stdout)
    assert document["ok"] and document["counts"] == {"imagenet/train": 64, "imagenet/val": 6, "cifar/train": 80,
                                                     "more": 3, "coco/images": 5}
    data = tmp_path / "data"
    assert sorted(p.name for p in data.iterdir()) == sorted(ENTRIES)
    assert sorted(p.name for p in (data / "imagenet" / "train").iterdir()) == list(CLASSES)
    assert "cat" not in {p.name for p in (data / "imagenet" / "val").iterdir()}  # the splits guide's missing class
    assert (data / "imagenet" / "train" / "cat" / "001.jpg").is_file()          # the key the pages inspect
    from PIL import Image

    with Image.open(data / "cifar" / "train" / "cat" / "000.png") as small:
        assert small.size == (32, 32)
    packer.build_dataset(data / "imagenet" / "train", tmp_path / "train", packer.BuildSettings(),
                         packer.RunOptions(workers=1))
    packer.build_dataset(data / "list.csv", tmp_path / "csv", packer.BuildSettings(
        source=packer.SourceSettings(root=str(data / "imagenet" / "train"))), packer.RunOptions(workers=1))
    packer.build_dataset(data / "list.jsonl", tmp_path / "jsonl", packer.BuildSettings(), packer.RunOptions(workers=1))
    packer.build_dataset(data / "coco" / "instances.json", tmp_path / "coco", packer.BuildSettings(
        source=packer.SourceSettings(root=str(data / "coco" / "images"))), packer.RunOptions(workers=1))
    with packer.open_dataset(tmp_path / "train") as train, packer.open_dataset(tmp_path / "csv") as listed, \
            packer.open_dataset(tmp_path / "jsonl") as rows, packer.open_dataset(tmp_path / "coco") as coco:
        assert train.classes == listed.classes == rows.classes == CLASSES and len(train) == 64 == len(rows)
        assert sorted(len(coco.field_value("boxes", i)) for i in range(len(coco))) == [0, 1, 1, 1, 2]
        assert listed.metadata(0)["caption"].startswith("a photo of a ")  # a plain metadata column
    assert "CC0" in (data / "PHOTOS.md").read_text("utf-8")


def test_the_same_bytes_every_time_and_nothing_written_over(tmp_path: Path) -> None:
    first, second = write_sample_data(tmp_path / "a", per_class=3), write_sample_data(tmp_path / "b", per_class=3)
    assert first.counts["imagenet/train"] == 12 and _files(tmp_path / "a") == _files(tmp_path / "b")
    before = _files(tmp_path / "a")
    done = CliRunner().invoke(cli, ["sample-data", str(tmp_path / "a")])
    assert done.exit_code == 2 and "already holds imagenet, cifar, more, coco" in done.output
    assert _files(tmp_path / "a") == before and not list((tmp_path / "a").glob(".packer-sample-data-*"))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "list.csv").write_text("mine")
    with pytest.raises(OptionError, match="already holds list.csv"):
        write_sample_data(tmp_path / "c")
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["list.csv"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(OptionError, match="is not a folder"):
        write_sample_data(tmp_path / "file")
    with pytest.raises(OptionError, match="per_class must be an integer of at least 2"):
        write_sample_data(tmp_path / "d", per_class=1)


def test_the_shipped_photos_are_small_and_each_has_its_licence() -> None:
    photos = sorted(PHOTOS.glob("*.jpg"))
    assert [p.stem for p in photos] == ["astronaut", "cat", "coffee", "galaxy", "rocket"]
    assert sum(p.stat().st_size for p in photos) < 200_000  # well under 1 MB in the wheel
    licences = (PHOTOS / "PHOTOS.md").read_text("utf-8")
    for photo in photos:
        row = next(line for line in licences.splitlines() if line.startswith(f"| `{photo.name}`"))
        assert "CC0" in row or "public domain" in row, row
