"""Every door refuses an unusable source with a typed error that names it and says what was expected:
missing or unreadable manifests and folders, manifests that are not UTF-8 or not CSV, brace patterns
and WebDataset shards that do not exist, a source kind that is not the archive given, a COCO file
or root that cannot be read, a compressed tar without a spool folder, and class lists that cannot
be one (reached through ``packer.build_dataset``, the CLI or the class-list loader; issue 31)."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

import packer
from packer.classes import MAX_CLASS_FILE_BYTES, MAX_CLASSES, classes_of, load_class_list
from packer.errors import OptionError, SourceError
from packer.sources.tar import list_tar
from packer import BuildSettings, RunOptions, SourceSettings

from helpers import png_bytes, png_folder


def refused(source: Path | str, tmp_path: Path, error: type, *, source_kind: str = "auto", **door: object) -> str:
    settings = BuildSettings(source=SourceSettings(kind=source_kind, **door))
    with pytest.raises(error) as caught:
        packer.build_dataset(source, tmp_path / "out", settings, RunOptions(workers=1))
    assert type(caught.value) is error
    assert not (tmp_path / "out" / "manifest.json").exists()
    return caught.value.message


def test_a_manifest_that_does_not_exist_or_whose_root_is_not_a_folder(tmp_path: Path) -> None:
    from packer.sources.manifest import list_manifest

    with pytest.raises(SourceError) as caught:
        list_manifest(tmp_path / "rows.csv")
    assert caught.value.message == "manifest file does not exist" and caught.value.path == str(tmp_path / "rows.csv")
    manifest = tmp_path / "rows.csv"
    manifest.write_text("path,label\na.png,0\n")
    assert refused(manifest, tmp_path, SourceError, root=tmp_path / "nowhere") == "manifest root is not a folder"


@pytest.mark.parametrize("name, data, message", [
    ("rows.csv", b"path,label\n\xff\xfe.png,0\n", "manifest is not UTF-8 text (invalid start byte)"),
    ("rows.csv", b"", "CSV manifest is empty (it needs a header row: path,label)"),
    ("rows.csv", b"path,label\n" + b"a" * 200_000 + b".png,0\n",
     "manifest is not valid CSV: field larger than field limit (131072)"),
])
def test_a_manifest_that_is_not_text_or_not_csv_is_a_source_error(tmp_path: Path, name: str, data: bytes,
                                                                  message: str) -> None:
    (tmp_path / name).write_bytes(data)
    assert refused(tmp_path / name, tmp_path, SourceError) == message


def test_an_unreadable_manifest_names_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An open that fails (detection opens the source first, with ``files.open_user_file``) and a read that
    fails after it (a failing disk) each name the reason; both are injected (root reads anything)."""
    import errno
    import os

    import packer.sources.manifest as manifest_door
    from packer.sources import list_source

    manifest = tmp_path / "rows.jsonl"
    manifest.write_text('{"path": "a.png", "label": 0}\n')
    real_open = os.open

    def deny(path, *args, **kwargs):
        if os.fspath(path) == str(manifest):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(os, "open", deny)
        with pytest.raises(SourceError) as caught:
            list_source(manifest)
    assert caught.value.message == "the source: cannot open it (Permission denied)"
    assert caught.value.path == str(manifest)

    class FailingDisk(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, buffer) -> int:
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(manifest_door, "open_user_file", lambda path, **_: (io.BufferedReader(FailingDisk()), None))
    with pytest.raises(SourceError) as caught:
        list_source(manifest)
    assert caught.value.message == "cannot read the manifest: Input/output error"
    assert caught.value.path == str(manifest)


def test_a_missing_source_folder(tmp_path: Path) -> None:
    from packer.sources.folder import list_image_folder

    with pytest.raises(SourceError) as caught:
        list_image_folder(tmp_path / "gone")
    assert caught.value.message == "source folder does not exist"
    assert refused(tmp_path / "gone", tmp_path, SourceError) == "source does not exist"


def test_brace_patterns_and_webdataset_shards_that_do_not_exist(tmp_path: Path) -> None:
    pattern = str(tmp_path / "train-{3..1}.tar")
    assert refused(pattern, tmp_path, SourceError) == "brace range {3..1} must go up"
    huge = str(tmp_path / "train-{0..9999}-{0..9999}.tar")  # counted before anything is expanded
    assert refused(huge, tmp_path, SourceError) == (
        "the brace pattern names more than 1000000 files (its groups multiply); give fewer shards, or a folder of them")
    with tarfile.open(tmp_path / "train-0.tar", "w") as archive:
        info = tarfile.TarInfo("000.png")
        data = png_bytes(0)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    message = refused(str(tmp_path / "train-{0..2}.tar"), tmp_path, SourceError)
    assert message == f"2 of 3 WebDataset shards do not exist (first: {tmp_path / 'train-1.tar'})"


def _zip_of_classes(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("cat/0.png", png_bytes(0))
    return path


def _tar_of_classes(path: Path) -> Path:
    with tarfile.open(path, "w") as archive:
        data = png_bytes(1)
        info = tarfile.TarInfo("cat/0.png")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return path


def test_a_source_kind_that_is_not_the_archive_given(tmp_path: Path) -> None:
    assert refused(png_folder(tmp_path / "src", 2), tmp_path, OptionError, source_kind="rar") == (
        "--source-kind must be one of auto, folder, manifest, tar, zip, webdataset, parquet, coco, hf, got 'rar'")
    assert refused(_zip_of_classes(tmp_path / "a.zip"), tmp_path, SourceError, source_kind="tar") == (
        "--source-kind tar: the source is a zip archive")
    assert refused(_tar_of_classes(tmp_path / "a.tar"), tmp_path, SourceError, source_kind="zip") == (
        "--source-kind zip: the source is a tar archive")


def test_a_tar_door_given_something_else_or_a_compressed_tar_without_a_spool(tmp_path: Path) -> None:
    (tmp_path / "notes.tar").write_bytes(b"plain text, not an archive" * 40)
    with pytest.raises(SourceError) as caught:
        list_tar(tmp_path / "notes.tar")
    assert caught.value.message == "not a tar archive (nor a compressed one)"
    with tarfile.open(tmp_path / "classes.tar.gz", "w:gz") as archive:
        data = png_bytes(2)
        info = tarfile.TarInfo("cat/0.png")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    with pytest.raises(SourceError) as caught:
        list_tar(tmp_path / "classes.tar.gz")
    assert caught.value.message.startswith("a compressed tar needs a spool folder to decompress into")


def test_the_kind_detected_once_refuses_a_kind_no_door_has(tmp_path: Path) -> None:
    """``detect_kind`` is the one place a kind is decided (a build asks it once, then records the
    kind); a kind no door reads is refused there by its option's name."""
    from packer.sources import detect_kind

    folder = png_folder(tmp_path / "src", 2)
    with pytest.raises(OptionError) as caught:
        detect_kind(folder, "rar")
    assert caught.value.message == ("--source-kind must be one of auto, folder, manifest, tar, zip, webdataset, "
                                    "parquet, coco, hf, got 'rar'")
    assert detect_kind(folder) == "folder" and detect_kind(folder, "manifest") == "folder"
    assert detect_kind(_zip_of_classes(tmp_path / "a.zip")) == "zip"
    assert detect_kind(_tar_of_classes(tmp_path / "a.tar")) == "tar"


def test_a_coco_file_whose_root_is_not_a_folder_or_that_cannot_be_read(tmp_path: Path) -> None:
    from packer.sources.coco import list_coco

    annotations = tmp_path / "instances.json"
    annotations.write_text('{"images": [], "annotations": [], "categories": []}')
    message = refused(annotations, tmp_path, SourceError, source_kind="coco", root=tmp_path / "nowhere")
    assert message == "the image folder (--root) is not a folder"
    with pytest.raises(SourceError) as caught:
        list_coco(tmp_path / "missing.json")
    assert caught.value.message == "the annotation file: no such file"
    assert caught.value.path == str(tmp_path / "missing.json")


# --- class lists (--classes, --classes-from, classes=) ------------------------------------------------

def test_class_lists_that_cannot_be_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(OptionError) as caught:
        load_class_list(["cat", "do\ng"])
    assert caught.value.message == "classes: class name 'do\\ng' holds a newline or NUL"
    monkeypatch.setattr("packer.classes.MAX_CLASSES", 3)
    with pytest.raises(OptionError) as caught:
        load_class_list(["a", "b", "c", "d"])
    assert caught.value.message == "classes: 4 classes is over the limit of 3"
    monkeypatch.setattr("packer.classes.MAX_CLASSES", MAX_CLASSES)
    big = tmp_path / "classes.txt"
    monkeypatch.setattr("packer.classes.MAX_CLASS_FILE_BYTES", 16)
    big.write_text("cat\ndog\nowl\nemu\nelk\n")
    with pytest.raises(OptionError) as caught:
        load_class_list(str(big))
    assert caught.value.message == "--classes: 20 bytes, over the 16 bytes such a file may hold"
    assert caught.value.path == str(big)
    monkeypatch.setattr("packer.classes.MAX_CLASS_FILE_BYTES", MAX_CLASS_FILE_BYTES)
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"caf\xe9\n")
    with pytest.raises(OptionError) as caught:
        load_class_list(str(latin))
    assert caught.value.message == f"--classes {latin}: cannot read the class list (not UTF-8: invalid continuation byte)"
    with pytest.raises(OptionError) as caught:
        classes_of(42)
    assert caught.value.message == "expected a dataset, a dataset path or a list of class names, got int"


def test_the_cli_refuses_two_class_lists_and_a_list_from_a_dataset_without_names(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from packer.cli import _register, cli

    _register()
    src = png_folder(tmp_path / "src", 4)
    manifest = tmp_path / "rows.csv"
    manifest.write_text("path,label\n" + "".join(f"{p.relative_to(src).as_posix()},{i % 2}\n"
                                                 for i, p in enumerate(sorted(src.rglob("*.png")))))
    packer.build_dataset(manifest, tmp_path / "ints", BuildSettings(source=SourceSettings(root=src)), RunOptions(workers=1))
    runner = CliRunner()
    both = runner.invoke(cli, ["build", str(src), str(tmp_path / "a"), "--classes", "cat,dog",
                               "--classes-from", str(tmp_path / "ints")])
    assert both.exit_code == 2 and "error: give --classes or --classes-from, not both" in both.output
    from_ints = runner.invoke(cli, ["build", str(src), str(tmp_path / "b"), "--classes-from", str(tmp_path / "ints")])
    assert from_ints.exit_code == 2
    assert f"--classes-from {tmp_path / 'ints'}: that dataset has integer labels and no class names" in from_ints.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# --- sources that are not what they look like ----------------------------------------------------------

def test_brace_ranges_too_long_or_braces_that_nest_are_refused(tmp_path: Path) -> None:
    long_range = str(tmp_path / ("train-{0.." + "9" * 19 + "}.tar"))
    assert refused(long_range, tmp_path, SourceError) == "brace range {0..9999999999999999999}: numbers of at most 18 digits"
    for pattern in ("train-{0..{1..2}}.tar", "train-{0..2.tar"):
        message = refused(str(tmp_path / pattern), tmp_path, SourceError)
        assert message.startswith("the brace pattern has nested or unbalanced braces"), pattern


def test_a_parquet_file_given_another_source_kind_says_what_it_is(tmp_path: Path) -> None:
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pyarrow.table({"image": [png_bytes(0)], "label": [0]}), tmp_path / "rows.parquet")
    assert refused(tmp_path / "rows.parquet", tmp_path, SourceError, source_kind="tar") == (
        "--source-kind tar: the source is a Parquet file")


def test_an_empty_tar_or_an_unreadable_compressed_stream_is_named_for_what_it_is(tmp_path: Path) -> None:
    empty = tmp_path / "empty.tar"
    with tarfile.open(empty, "w"):
        pass  # only the end-of-archive blocks
    assert refused(empty, tmp_path, SourceError) == (
        "the source is an empty tar archive (only its end-of-archive blocks): nothing to pack")
    not_a_tar = tmp_path / "notes.gz"
    import gzip

    not_a_tar.write_bytes(gzip.compress(b"plain text, neither a tar nor a manifest\n" * 50))
    assert refused(not_a_tar, tmp_path, SourceError) == (
        "the source is a compressed stream, but not a tar packer can read (nor a manifest)")


def test_a_manifest_line_longer_than_the_row_bound_is_refused_unread(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import packer.sources.manifest as manifest_module

    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_ROW_BYTES", 64)
    manifest = tmp_path / "rows.csv"
    manifest.write_text("path,label\n" + "a" * 200)  # one line without its newline, over the bound
    assert refused(manifest, tmp_path, SourceError) == "manifest line is longer than 64 characters (is it a CSV manifest?)"


def test_source_options_no_rule_knows_are_option_errors() -> None:
    from packer.sources import SourceOptions

    with pytest.raises(OptionError, match=r"^--on-error must be 'skip' or 'fail', got 'ignore'$"):
        SourceOptions(on_error="ignore").check()
    with pytest.raises(OptionError, match=r"^new_classes must be one of .*, got 'maybe'$"):
        SourceOptions(new_classes="maybe").check()
    for bad in (0, -5, 1.5, "1M"):
        with pytest.raises(OptionError, match=r"^max_member_size must be a positive number of bytes, got "):
            SourceOptions(max_member_size=bad).check()
