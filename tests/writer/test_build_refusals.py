"""The build and append doors refuse bad options and contradicting sources before writing a dataset:
--on-error, --engine, a split build over a finished dataset, --resume over a dataset built from
another kind of source, and an append whose labels are of the other kind (issue 31)."""

from __future__ import annotations

from pathlib import Path

import pytest

import packer
from packer.errors import BuildError, OptionError, OutputExistsError, SourceError
from packer import BuildSettings, RunOptions, SourceSettings

from helpers import png_folder


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return png_folder(tmp_path / "src", 4)


def _manifest(src: Path, labels: list[object]) -> Path:
    rows = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.png"))
    manifest = src.parent / "rows.csv"
    manifest.write_text("path,label\n" + "".join(f"{r},{label}\n" for r, label in zip(rows, labels)))
    return manifest


def test_on_error_and_engine_are_checked_by_name(src: Path, tmp_path: Path) -> None:
    with pytest.raises(OptionError) as caught:
        packer.build_dataset(src, tmp_path / "out", BuildSettings(), RunOptions(on_error="ignore"))
    assert caught.value.message == "--on-error must be 'skip' or 'fail', got 'ignore'"
    assert not (tmp_path / "out").exists()
    with pytest.raises(OptionError) as caught:
        packer.build_dataset(src, tmp_path / "out", BuildSettings(), RunOptions(workers=1, engine="dask"))
    assert caught.value.message == "unknown engine 'dask' (use 'local' or 'ray')"
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_split_build_over_a_finished_dataset_needs_overwrite(src: Path, tmp_path: Path) -> None:
    packer.build_dataset(src, tmp_path / "out", BuildSettings(), RunOptions(workers=1))
    before = (tmp_path / "out" / "manifest.json").read_bytes()
    with pytest.raises(OutputExistsError) as caught:
        packer.build_dataset(src, tmp_path / "out", BuildSettings(), RunOptions(plan_only=True))
    assert caught.value.message == "a dataset already exists here; pass --overwrite to replace it"
    assert (tmp_path / "out" / "manifest.json").read_bytes() == before


def test_resume_over_a_dataset_built_from_another_kind_of_source(src: Path, tmp_path: Path) -> None:
    packer.build_dataset(src, tmp_path / "out", BuildSettings(), RunOptions(workers=1))
    manifest = _manifest(src, ["cat", "dog", "cat", "dog"])
    with pytest.raises(BuildError) as caught:
        packer.build_dataset(manifest, tmp_path / "out", BuildSettings(source=SourceSettings(root=src)), RunOptions(workers=1, resume=True))
    assert caught.value.message == ("--resume: the finished dataset here was built from a folder, not a manifest; "
                                    "pass --overwrite to rebuild it")


def test_append_refuses_labels_of_the_other_kind(src: Path, tmp_path: Path) -> None:
    """The source contract refuses the mix (SourceError, nothing appended): a CSV of integer labels
    appended to a dataset with class names would otherwise add a class named '1', and a folder of
    class names appended to a dataset of integer labels has no names to number."""
    from packer.dataset import open_dataset

    packer.build_dataset(src, tmp_path / "named", BuildSettings(), RunOptions(workers=1))  # class names from the folders
    ints = _manifest(src, [0, 1, 0, 1])
    more = png_folder(tmp_path / "more", 3, seed=5)
    manifest = more.parent / "more.csv"
    rows = sorted(p.relative_to(more).as_posix() for p in more.rglob("*.png"))
    manifest.write_text("path,label\n" + "".join(f"new/{row},1\n" for row in rows))
    (more / "new").mkdir()
    for row in rows:
        (more / "new" / row).parent.mkdir(parents=True, exist_ok=True)
        (more / "new" / row).write_bytes((more / row).read_bytes())
    with pytest.raises(SourceError) as caught:
        packer.append_dataset(tmp_path / "named", manifest, root=more, run=RunOptions(workers=1))
    assert caught.value.message == (f"the dataset has class names, but the source labels new/{rows[0]} with the integer "
                                    f"1: appending would add a class named '1'; label the new source by class name (a "
                                    f"dataset built with --label-type str reads every label as a name)")
    with open_dataset(tmp_path / "named") as ds:
        assert ds.classes == ("cat", "dog") and len(ds) == 4
    manifest.write_text("path,label\n" + "".join(f"new/{row},{row.split('/')[0]}\n" for row in rows))
    packer.append_dataset(tmp_path / "named", manifest, root=more, run=RunOptions(workers=1))  # by class name: appended
    with open_dataset(tmp_path / "named") as ds:
        assert ds.classes == ("cat", "dog") and len(ds) == 7
    packer.build_dataset(ints, tmp_path / "numbered", BuildSettings(source=SourceSettings(root=src)), RunOptions(workers=1))
    with pytest.raises(SourceError) as caught:
        packer.append_dataset(tmp_path / "numbered", more, run=RunOptions(workers=1))
    assert caught.value.message.startswith("the dataset has integer labels (no class names), but the source labels "
                                           "its samples by class name (first: ")


def test_on_error_fail_stops_the_build_at_the_first_rejection_and_names_it(tmp_path: Path) -> None:
    src = png_folder(tmp_path / "src", 4, bad=1)
    with pytest.raises(BuildError) as caught:
        packer.build_dataset(src, tmp_path / "out", BuildSettings(), RunOptions(workers=1, on_error="fail"))
    assert caught.value.message.startswith("not-an-image: ") and caught.value.message.endswith("(--on-error fail)")
    assert caught.value.path == str(src / "dog" / "bad0.png")
    assert not (tmp_path / "out" / "manifest.json").exists()
