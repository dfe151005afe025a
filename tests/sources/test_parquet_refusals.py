"""The Parquet door (HuggingFace datasets on disk) refuses what it cannot read as images and labels,
naming the file and the columns: no image column, an --image-column that is not one, a file that is
not Parquet, files whose ClassLabel names disagree, and a call without a spool folder; a label past
the ClassLabel names is the source contract's unknown-class (issue 31's promise inventory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import packer
from packer.errors import SourceError
from packer.sources.parquet import list_parquet
from packer import BuildSettings, RunOptions

from helpers import png_bytes

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def write_parquet(path: Path, columns: dict[str, list], class_names: list[str] | None = None) -> Path:
    table = pa.table(columns)
    if class_names is not None:
        features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": class_names}}
        table = table.replace_schema_metadata({b"huggingface": json.dumps({"info": {"features": features}})})
    pq.write_table(table, path)
    return path


def refused(source: Path, tmp_path: Path, *, on_error: str = "skip", source_kind: str = "auto",
            **door: object) -> SourceError:
    settings = packer.BuildSettings(source=packer.SourceSettings(kind=source_kind, **door))
    with pytest.raises(SourceError) as caught:
        packer.build_dataset(source, tmp_path / "out", settings, packer.RunOptions(workers=1, on_error=on_error))
    assert type(caught.value) is SourceError
    assert not (tmp_path / "out" / "manifest.json").exists()
    return caught.value


def test_a_file_without_an_image_column(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "rows.parquet", {"label": [0, 1], "text": ["a", "b"]})
    error = refused(path, tmp_path)
    assert error.message == "no image column (binary, or a struct with 'bytes'); columns: label, text"
    assert error.path == str(path)


def test_an_image_column_that_is_not_one(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "rows.parquet", {"image": [png_bytes(0), png_bytes(1)], "label": [0, 1]})
    error = refused(path, tmp_path, image_column="label")
    assert error.message == "--image-column 'label': no binary or {bytes, path} column of that name (columns: image, label)"


def test_a_file_that_is_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    path.write_bytes(b"PAR1 but not really" * 10)
    error = refused(path, tmp_path, source_kind="parquet")
    assert error.message.startswith("not a readable Parquet file: ")


def test_files_that_name_their_classes_differently(tmp_path: Path) -> None:
    folder = tmp_path / "parts"
    folder.mkdir()
    write_parquet(folder / "a.parquet", {"image": [png_bytes(0)], "label": [0]}, ["cat", "dog"])
    write_parquet(folder / "b.parquet", {"image": [png_bytes(1)], "label": [1]}, ["dog", "cat"])
    error = refused(folder, tmp_path)
    assert error.message == "the Parquet files declare different ClassLabel names"
    assert error.path == str(folder / "b.parquet")


def test_a_label_past_the_class_label_names(tmp_path: Path) -> None:
    """The source contract's rule for a source that numbers its classes: the row is ``unknown-class``
    (in the build report), the rest is packed with the declared names; ``on_error="fail"`` refuses."""
    path = write_parquet(tmp_path / "rows.parquet", {"image": [png_bytes(0), png_bytes(1)], "label": [0, 2]},
                         ["cat", "dog"])
    packer.build_dataset(path, tmp_path / "ds", BuildSettings(), RunOptions(workers=1))
    with packer.open_dataset(tmp_path / "ds") as ds:
        assert (ds.classes, len(ds), ds.labels.tolist()) == (("cat", "dog"), 1, [0])
    report = [json.loads(line) for line in (tmp_path / "ds" / "build-report.jsonl").read_text().splitlines()[1:]]
    assert [(r["reason"], r["message"]) for r in report] == [
        ("unknown-class", "label 2 is outside the 2 class names the source declares (ClassLabel)")]
    error = refused(path, tmp_path, on_error="fail")
    assert error.message.startswith("1 sample(s) are not in the class list (--on-error fail), e.g. ")
    assert error.message.endswith(": label 2 is outside the 2 class names the source declares (ClassLabel)")


def test_listing_needs_a_spool_folder(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "rows.parquet", {"image": [png_bytes(0)], "label": [0]})
    with pytest.raises(SourceError) as caught:
        list_parquet([path])
    assert caught.value.message == "a Parquet source needs a spool folder (build it through packer build)"


def test_a_parquet_source_without_pyarrow_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The door is chosen from the bytes (PAR1), so a machine without pyarrow still learns what to
    install (simulated: a None in sys.modules makes the import fail)."""
    import sys

    from packer.errors import MissingDependencyError

    path = write_parquet(tmp_path / "rows.parquet", {"image": [png_bytes(0)], "label": [0]})
    for name in ("pyarrow", "pyarrow.parquet"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(MissingDependencyError) as caught:
        packer.build_dataset(path, tmp_path / "out", BuildSettings(), RunOptions(workers=1))
    assert caught.value.message == "reading Parquet needs pyarrow: pip install 'packer-shards[parquet]'"
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_class_label_names_that_are_not_names(tmp_path: Path) -> None:
    for names in (["cat", ""], ["cat", 3]):
        source = write_parquet(tmp_path / "rows.parquet", {"image": [png_bytes(0)], "label": [0]}, names)
        error = refused(source, tmp_path)
        assert error.message.startswith("the ClassLabel names of column 'label' must be non-empty strings, got ")
        assert error.path == str(source)


@pytest.mark.parametrize(("code", "expected"), [
    ("ENOSPC", "the disk is full while copying the Parquet images into the build's spool; free space and run again"),
    ("EIO", "cannot write the build's spool: Input/output error")])
def test_a_spool_that_cannot_be_written_is_a_build_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         code: str, expected: str) -> None:
    import errno
    import os

    import packer.sources.parquet as parquet_module
    from packer.errors import BuildError

    class FailingSpool:
        def __init__(self, handle) -> None:
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.handle.close()

        def write(self, data: bytes) -> int:
            raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))

    monkeypatch.setattr(parquet_module, "open", lambda *args, **kw: FailingSpool(open(*args, **kw)), raising=False)
    source = write_parquet(tmp_path / "rows.parquet", {"image": [png_bytes(0)], "label": [0]})
    with pytest.raises(BuildError) as caught:
        packer.build_dataset(source, tmp_path / "out", BuildSettings(), RunOptions(workers=1))
    assert caught.value.message == expected
    assert caught.value.path.endswith("spool-parquet.bin")
    assert not (tmp_path / "out" / "manifest.json").exists()
