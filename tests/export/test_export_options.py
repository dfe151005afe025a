"""packer export's options and refusals: it refuses what it cannot write verbatim or safely before
writing anything (a build whose payloads are not the source files: a re-encoding codec or
--normalize-formats; a bad target or shard size; an unreadable keys file), refuses keys that would
leave OUT (or, with skip_unsafe, skips and counts them), writes tar members as the docstring says, cuts WebDataset shards of
samples_per_shard, names side files by the key up to the first dot, and the CLI splits --classes
(issue 31: the promise inventory's export sites and the hand-written round's survivors)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer.errors import OptionError, UnsafeExportError
from packer.export import export, read_keys_file
from packer.writer import build
from packer.writer.plan import BuildOptions

from helpers import png_folder, rewrite_index


@pytest.fixture(scope="module")
def passthrough(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("export-refusals")
    build(png_folder(tmp / "src", 4), tmp / "ds", BuildOptions(shard_size=16 << 10), workers=1, progress=False)
    return tmp / "ds"


@pytest.mark.parametrize("to, per_shard, message", [
    ("zip", 10, "--to must be one of folder, tar, webdataset, got 'zip'"),
    ("webdataset", 0, "--samples-per-shard must be a positive integer, got 0"),
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
    assert caught.value.message.startswith(f"--keys: {keys} is not UTF-8 (invalid start byte at byte 12); ")
    assert not (tmp_path / "out").exists()
    with pytest.raises(OptionError, match="--keys: cannot open .*missing.txt: No such file"):
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


def set_keys(folder: Path, keys: list[str]) -> None:
    """Give the dataset's samples these keys (a crafted index: a build never stores such keys)."""
    def change(columns: dict[str, np.ndarray]) -> None:
        blob = [k.encode() for k in keys]
        columns["keys"] = np.frombuffer(b"".join(blob), dtype=np.uint8).copy()
        columns["key_offsets"] = np.cumsum([0] + [len(b) for b in blob]).astype(columns["key_offsets"].dtype)
    rewrite_index(folder, change)


UNSAFE = ["../escaped.png", "cat/../../escaped2.png", "/etc/escaped3.png"]


@pytest.mark.parametrize("to", ["folder", "tar", "webdataset"])
def test_keys_that_would_leave_the_output_refuse_the_export_or_are_skipped_and_counted(
        passthrough: Path, tmp_path: Path, to: str) -> None:
    """Refused before anything is written by default; with skip_unsafe the others are exported."""
    import shutil

    ds = Path(shutil.copytree(passthrough, tmp_path / "ds"))
    set_keys(ds, UNSAFE + ["cat/safe.png"])
    out = tmp_path / "out"
    with pytest.raises(UnsafeExportError) as caught:
        export(ds, out, to=to)
    assert caught.value.message.startswith(f"3 of the 4 selected samples cannot be exported safely to {to} "
                                           f"(3 unsafe-name); first: '../escaped.png' (unsafe-name: its key: '..' path "
                                           f"component). Nothing was written")
    assert not out.exists()
    result = export(ds, out, to=to, skip_unsafe=True)
    assert (result.samples, result.skipped_unsafe) == (1, 3) and result.skipped == {"unsafe-name": 3}
    assert sorted(p.name for p in tmp_path.rglob("escaped*")) == []
    if to == "folder":
        written = [p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()]
        assert len(written) == 1 and written[0].endswith("cat/safe.png")
    else:
        archive = out if to == "tar" else out / "shard-000000.tar"
        with tarfile.open(archive) as tar:
            names = tar.getnames()
        assert all(".." not in n.split("/") and not n.startswith("/") for n in names) and names


def test_tar_members_are_reproducible_and_readable_by_everyone(passthrough: Path, tmp_path: Path) -> None:
    for to, archive in (("tar", tmp_path / "a.tar"), ("webdataset", tmp_path / "wds" / "shard-000000.tar")):
        export(passthrough, archive if to == "tar" else tmp_path / "wds", to=to)
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
        assert members and all((m.mode, m.uid, m.gid, m.mtime, m.uname, m.gname) == (0o644, 0, 0, 0, "", "")
                               for m in members)


def test_webdataset_shards_hold_samples_per_shard_samples(tmp_path: Path) -> None:
    build(png_folder(tmp_path / "src", 5), tmp_path / "ds", BuildOptions(), workers=1, progress=False)
    result = export(tmp_path / "ds", tmp_path / "wds", to="webdataset", samples_per_shard=2)
    shards = sorted((tmp_path / "wds").glob("shard-*.tar"))
    assert [s.name for s in shards] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    counts = []
    for shard in shards:
        with tarfile.open(shard) as tar:
            counts.append(sum(name.endswith(".cls") for name in tar.getnames()))
    assert counts == [2, 2, 1] and result.files == 3 and result.samples == 5


def test_side_files_are_named_by_the_key_up_to_its_first_dot(tmp_path: Path) -> None:
    """A key with two dots (cat/1.x.png) has its fields in cat/1.json: what a rebuild pairs with it."""
    src = tmp_path / "src"
    (src / "cat").mkdir(parents=True)
    for name in ("1.x.png", "2.png"):
        Image.new("RGB", (4, 3), (9, 9, 9)).save(src / "cat" / name)
    (src / "rows.jsonl").write_text('{"path": "cat/1.x.png", "label": "cat", "score": 1.5}\n'
                                    '{"path": "cat/2.png", "label": "cat", "score": 2.5}\n')
    build(src / "rows.jsonl", tmp_path / "ds", BuildOptions(fields=("score=float32",)), workers=1, progress=False)
    export(tmp_path / "ds", tmp_path / "out")
    files = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert files == ["cat/1.json", "cat/1.x.png", "cat/2.json", "cat/2.png"]
    assert json.loads((tmp_path / "out" / "cat" / "1.json").read_text()) == {"score": 1.5}


def test_the_cli_splits_classes_at_commas(passthrough: Path, tmp_path: Path) -> None:
    from packer.cli import _register, cli

    _register()
    done = CliRunner().invoke(cli, ["export", str(passthrough), str(tmp_path / "out"), "--classes", "cat,dog",
                                    "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["samples"] == 4
    only_cat = CliRunner().invoke(cli, ["export", str(passthrough), str(tmp_path / "cats"), "--classes", "cat"])
    assert only_cat.exit_code == 0
    assert {p.parent.name for p in (tmp_path / "cats").rglob("*.png")} == {"cat"}


def test_a_keys_file_over_the_bound_unreadable_or_growing_is_an_option_error_naming_it(passthrough: Path,
                                                                                          tmp_path: Path) -> None:
    """The keys file is read bounded: over the bound by its size, past the bound while read (a /proc
    file says 0 bytes and holds more), or a read that fails (/proc/self/mem at address 0: EIO)."""
    keys = tmp_path / "keys.txt"
    keys.write_text("cat/0.png\ndog/1.png\n")  # 20 bytes
    with pytest.raises(OptionError) as caught:
        read_keys_file(keys, cap=8)
    assert caught.value.message == f"--keys: {keys} is 20 bytes, over the 8 bytes read"
    with pytest.raises(OptionError) as caught:
        read_keys_file("/proc/self/status", cap=16)
    assert caught.value.message == "--keys: /proc/self/status grew past the 16 bytes read"
    with pytest.raises(OptionError) as caught:
        export(passthrough, tmp_path / "out", keys="/proc/self/mem")
    assert caught.value.message == "--keys: cannot read /proc/self/mem: Input/output error"
    assert not (tmp_path / "out").exists()
    assert read_keys_file(keys, cap=20) == ["cat/0.png", "dog/1.png"]  # exactly the bound is read


def test_a_target_without_a_name_of_its_own_is_refused(passthrough: Path, tmp_path: Path) -> None:
    """OUT must name the new file or folder itself: ``x/..`` names its parent's parent."""
    (tmp_path / "x").mkdir()
    for to in ("folder", "tar"):
        with pytest.raises(OptionError) as caught:
            export(passthrough, tmp_path / "x" / "..", to=to)
        target = str(tmp_path / "x" / "..")
        assert caught.value.message == f"the export target {target!r} must name a new file or folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]
