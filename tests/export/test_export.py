"""packer export: folder -> packer -> folder (also through tar and WebDataset) reproduces every file byte for byte."""

from __future__ import annotations

import json
import os
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import packer
from packer.writer import build
from packer.writer.plan import BuildOptions
from packer.cli import _register, cli
from packer.errors import OptionError, OutputExistsError
from packer.export import export
from packer.fields import parse_field_option

OPTIONS = BuildOptions(shard_size=16 << 10, seed=1)


def tree(root: Path) -> dict[bytes, bytes]:
    base = os.fsencode(root)
    out = {}
    for folder, _, files in os.walk(base):
        for name in files:
            full = os.path.join(folder, name)
            out[os.path.relpath(full, base)] = open(full, "rb").read()
    return out


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    rng = np.random.default_rng(0)
    for cls, count in (("cat", 5), ("dog", 4)):
        (root / cls / "sub").mkdir(parents=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 255, (9, 11, 3), dtype=np.uint8)).save(root / cls / f"{i}.png")
        Image.fromarray(rng.integers(0, 255, (9, 11, 3), dtype=np.uint8)).save(root / cls / "sub" / "x y.jpg")
    Image.fromarray(rng.integers(0, 255, (5, 5, 3), dtype=np.uint8)).save(root / "dog" / "a.ppm")
    return root


def test_folder_round_trip(source: Path, tmp_path: Path) -> None:
    build(source, tmp_path / "ds", OPTIONS, workers=2, progress=False)
    result = export(tmp_path / "ds", tmp_path / "back")
    assert result.samples == 12 and tree(tmp_path / "back") == tree(source)


def test_round_trip_through_tar_and_webdataset(source: Path, tmp_path: Path) -> None:
    build(source, tmp_path / "ds", OPTIONS, workers=1, progress=False)
    export(tmp_path / "ds", tmp_path / "all.tar", to="tar")
    export(tmp_path / "ds", tmp_path / "again.tar", to="tar")
    assert (tmp_path / "all.tar").read_bytes() == (tmp_path / "again.tar").read_bytes()  # deterministic
    build(tmp_path / "all.tar", tmp_path / "ds-tar", OPTIONS, workers=2, progress=False)
    export(tmp_path / "ds-tar", tmp_path / "back-tar")
    assert tree(tmp_path / "back-tar") == tree(source)

    export(tmp_path / "ds", tmp_path / "wds", to="webdataset", samples_per_shard=5)
    assert sorted(p.name for p in (tmp_path / "wds").iterdir()) == ["shard-000000.tar", "shard-000001.tar",
                                                                    "shard-000002.tar"]
    with tarfile.open(tmp_path / "wds" / "shard-000000.tar") as archive:
        assert any(n.endswith(".cls") for n in archive.getnames())
    build(tmp_path / "wds", tmp_path / "ds-wds", OPTIONS, workers=2, progress=False)
    export(tmp_path / "ds-wds", tmp_path / "back-wds")
    # A .cls member holds the integer label only, so the WebDataset build has labels 0 (cat) and
    # 1 (dog) without names: each file goes back under its label's folder, and a folder build of
    # the export gives every file its label again.
    label_of = {b"cat": b"0", b"dog": b"1"}
    assert tree(tmp_path / "back-wds") == {label_of[path.split(b"/")[0]] + b"/" + path: data
                                           for path, data in tree(source).items()}


def test_a_manifest_key_whose_folder_is_not_its_label_goes_under_its_class(tmp_path: Path) -> None:
    """images/0.png labelled dog must come back as dog/images/0.png: a folder build of the export
    would otherwise take ``images`` as every sample's class."""
    (tmp_path / "images").mkdir()
    rows = []
    for i, label in enumerate(["dog", "cat", "dog"]):
        Image.new("RGB", (3, 3), (i, 0, 0)).save(tmp_path / "images" / f"{i}.png")
        rows.append({"path": f"images/{i}.png", "label": label})
    rows.append({"path": "cat/x.png", "label": "cat"})          # already under its class: kept
    (tmp_path / "cat").mkdir()
    Image.new("RGB", (3, 3), (0, 0, 200)).save(tmp_path / "cat" / "x.png")
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    build(tmp_path / "rows.jsonl", tmp_path / "ds", OPTIONS, workers=1, progress=False)
    export(tmp_path / "ds", tmp_path / "back")
    assert sorted(tree(tmp_path / "back")) == [b"cat/images/1.png", b"cat/x.png", b"dog/images/0.png",
                                               b"dog/images/2.png"]
    build(tmp_path / "back", tmp_path / "again", OPTIONS, workers=1, progress=False)
    first, again = packer.open_dataset(tmp_path / "ds"), packer.open_dataset(tmp_path / "again")
    labels = {first.get(i).tobytes(): first.classes[first.labels[i]] for i in range(len(first))}
    assert labels == {again.get(i).tobytes(): again.classes[again.labels[i]] for i in range(len(again))}


def test_an_unlabelled_key_keeps_its_folder(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    Image.new("RGB", (3, 3)).save(tmp_path / "images" / "0.png")
    Image.new("RGB", (3, 3), (9, 9, 9)).save(tmp_path / "1.png")
    (tmp_path / "rows.csv").write_text("path,caption\nimages/0.png,a\n1.png,b\n")
    build(tmp_path / "rows.csv", tmp_path / "ds", replace(OPTIONS, fields=(parse_field_option("caption=text"),)),
          workers=1, progress=False)
    export(tmp_path / "ds", tmp_path / "back")
    assert sorted(p for p in tree(tmp_path / "back") if p.endswith(b".png")) == [b"images/0.png", b"unlabeled/1.png"]


def test_non_utf8_name_goes_back_to_its_bytes(tmp_path: Path) -> None:
    src = tmp_path / "latin1.tar"
    png = tmp_path / "p.png"
    Image.new("RGB", (3, 3)).save(png)
    with tarfile.open(src, "w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape") as archive:
        archive.add(png, arcname=os.fsdecode(b"old/caf\xe9.png"))
    build(src, tmp_path / "ds", OPTIONS, workers=1, progress=False)
    export(tmp_path / "ds", tmp_path / "back")
    assert tree(tmp_path / "back") == {b"old/caf\xe9.png": png.read_bytes()}


def test_filters_and_cli(source: Path, tmp_path: Path) -> None:
    build(source, tmp_path / "ds", OPTIONS, workers=1, progress=False)
    assert export(tmp_path / "ds", tmp_path / "cats", classes=["cat"]).samples == 6
    assert export(tmp_path / "ds", tmp_path / "first", samples="0:3").samples == 3
    (tmp_path / "keys.txt").write_text("dog/0.png\ncat/sub/x y.jpg\n")
    assert export(tmp_path / "ds", tmp_path / "some", keys=tmp_path / "keys.txt").samples == 2
    assert set(tree(tmp_path / "some")) == {b"dog/0.png", b"cat/sub/x y.jpg"}
    with pytest.raises(OptionError, match="not a class"):
        export(tmp_path / "ds", tmp_path / "x", classes=["emu"])
    with pytest.raises(OutputExistsError):
        export(tmp_path / "ds", tmp_path / "cats")
    _register()
    runner = CliRunner()
    run = runner.invoke(cli, ["export", str(tmp_path / "ds"), str(tmp_path / "cli.tar"), "--to", "tar",
                              "--classes", "dog", "--json"])
    assert run.exit_code == 0, run.output
    assert '"samples": 6' in run.stdout
    bad = runner.invoke(cli, ["export", str(tmp_path / "ds"), str(tmp_path / "y"), "--samples", "a:b"])
    assert bad.exit_code == 2


def test_reencoded_dataset_is_refused(source: Path, tmp_path: Path) -> None:
    build(source, tmp_path / "ds", BuildOptions(shard_size=16 << 10, codec="jpeg"), workers=1, progress=False)
    with pytest.raises(OptionError, match="codec 'jpeg'"):
        export(tmp_path / "ds", tmp_path / "back")


def test_latin1_file_name_in_a_folder_is_packed_and_exported_back(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "old").mkdir(parents=True)
    png = tmp_path / "p.png"
    Image.new("RGB", (3, 3)).save(png)
    with open(os.fsencode(src / "old") + b"/caf\xe9 100%.png", "wb") as handle:
        handle.write(png.read_bytes())
    result = build(src, tmp_path / "ds", OPTIONS, workers=1, progress=False)
    assert result.sample_count == 1 and not result.rejected
    from packer.dataset import open_dataset

    with open_dataset(tmp_path / "ds") as ds:
        assert ds.key(0) == "old/caf%E9 100%25.png" and ds.metadata(0) == {"escaped_name": True}
    build(src, tmp_path / "ds", OPTIONS, workers=1, progress=False, resume=True, overwrite=True)
    export(tmp_path / "ds", tmp_path / "back")
    assert tree(tmp_path / "back") == tree(src)


def test_inspect_shows_the_original_name(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "old").mkdir(parents=True)
    Image.new("RGB", (3, 3)).save(tmp_path / "p.png")
    with open(os.fsencode(src / "old") + b"/caf\xe9.png", "wb") as handle:
        handle.write((tmp_path / "p.png").read_bytes())
    build(src, tmp_path / "ds", OPTIONS, workers=1, progress=False)
    _register()
    run = CliRunner().invoke(cli, ["inspect", str(tmp_path / "ds"), "--sample", "0"])
    assert run.exit_code == 0, run.output
    assert "old/caf%E9.png" in run.stdout and "old/caf\\xe9.png" in run.stdout
