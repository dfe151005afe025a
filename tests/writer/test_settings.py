"""``packer.BuildSettings`` and ``packer.RunOptions`` (packer/writer/settings.py): one nested, frozen
value for what a build records, one for how a run goes.

The old flat spelling (``BuildOptions``, ``build()``'s keywords) is converted once, with a
``DeprecationWarning`` naming the new spelling; the record in the manifest (``build.settings``) is
read back by ``--resume`` and ``append``; and datasets written before the nested settings still
resume, append and finish: ``packer-0.1-builds/`` holds datasets, a split build and their source
written by the code before this change (``made_by.py.txt``, run on that code, wrote them).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from packer import BuildSettings, CheckSettings, LabelSettings, LayoutSettings, RunOptions, SourceSettings
from packer import format as fmt
from packer.dataset import open_dataset, open_index
from packer.errors import BuildError, OptionError
from packer.writer import BuildOptions, build, finish
from packer.writer.plan import load_plan
from packer.writer.settings import settings_from_record
from packer.writer.staging import PLAN_NAME, STAGING_DIR

from helpers import REPO, dataset_files, edit_manifest, png_bytes, write_images

OLD = Path(__file__).resolve().parent / "packer-0.1-builds"
#: The options the packer 0.1 datasets were built with (made_by.py.txt), in the new spelling.
OLD_SETTINGS = BuildSettings(layout=LayoutSettings(alignment=1, shard_size=2048, seed=3),
                             labels=LabelSettings(label_type="str"))
OLD_CLI = ["--alignment", "1", "--shard-size", "2048", "--seed", "3", "--label-type", "str"]
ONE = RunOptions(workers=1)


def _cli(*argv: object) -> tuple[int, dict, str]:
    from packer.cli import _register, cli

    _register()
    done = CliRunner().invoke(cli, [str(a) for a in argv] + ["--json", "-q", "--workers", "1"])
    return done.exit_code, json.loads(done.stdout), done.stderr


def _tar_of(folder: Path, path: Path) -> Path:
    with tarfile.open(path, "w") as archive:
        for file in sorted(p for p in folder.rglob("*") if p.is_file()):
            archive.add(file, arcname=file.relative_to(folder).as_posix())
    return path


@pytest.fixture
def src(tmp_path: Path) -> Path:
    write_images(tmp_path / "src", {"cat": 3, "dog": 2})
    return tmp_path / "src"


# --- the two values and the one conversion of the old spelling --------------------------------------


def test_the_settings_are_importable_from_packer_and_import_packer_stays_light() -> None:
    code = ("import sys, packer\n"
            "assert 'packer.writer' not in sys.modules and 'numpy' not in sys.modules\n"
            "names = ['BuildSettings', 'SourceSettings', 'LayoutSettings', 'CheckSettings', 'LabelSettings', 'RunOptions']\n"
            "assert all(name in packer.__all__ for name in names)\n"
            "print([getattr(packer, name).__module__ for name in names])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "packer.writer.settings" in done.stdout and "packer.sources.listing" in done.stdout


def test_the_settings_are_frozen_and_need_no_source_path() -> None:
    settings = BuildSettings(source=SourceSettings(kind="python"))  # packer.Writer / packer.pack (#35)
    assert settings.check() is settings
    with pytest.raises(AttributeError):
        settings.codec = "jpeg"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        settings.layout.seed = 1  # type: ignore[misc]
    assert BuildSettings.from_json(settings.to_json()) == settings


def test_the_old_spelling_builds_the_same_bytes_and_warns_with_the_new_one(src: Path, tmp_path: Path) -> None:
    new = build(src, tmp_path / "new", BuildSettings(layout=LayoutSettings(shard_size=8192, seed=2),
                                                     labels=LabelSettings(label_type="str")), ONE)
    with pytest.warns(DeprecationWarning) as caught:
        old = packer.build_dataset(src, tmp_path / "old", BuildOptions(shard_size=8192, seed=2, label_type="str"),
                                   workers=1, source_kind="auto", progress=False)
    assert [w.filename for w in caught] == [__file__]  # the caller's line, not packer's
    message = str(caught[0].message)
    assert message.startswith("packer.build_dataset: the old spelling is deprecated and will be removed")
    assert "BuildOptions(...) -> settings=packer.BuildSettings(" in message
    assert "source_kind= -> settings=packer.BuildSettings(source=packer.SourceSettings(kind=))" in message
    assert "workers=, progress= -> run=packer.RunOptions(workers=, progress=)" in message
    assert new.sample_count == old.sample_count == 5
    assert dataset_files(tmp_path / "new") == dataset_files(tmp_path / "old")
    with pytest.warns(DeprecationWarning, match=r"BuildOptions\(\.\.\.\) -> settings="):  # options= as a keyword
        build(src, tmp_path / "kw", options=BuildOptions(seed=2), workers=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spelling never warns
        build(src, tmp_path / "quiet", BuildSettings(), ONE)


@pytest.mark.parametrize("call, message", [
    (lambda s, o: build(s, o, BuildSettings(), ONE, jobs=2),
     "packer.build_dataset() got an unexpected keyword argument 'jobs' (settings go in "
     "settings=packer.BuildSettings(...), how the run goes in run=packer.RunOptions(...))"),
    (lambda s, o: build(s, o, BuildSettings(), options=BuildOptions()),
     "packer.build_dataset: give settings= or the deprecated BuildOptions, not both"),
    (lambda s, o: build(s, o, BuildOptions(), options=BuildOptions()),
     "packer.build_dataset: give the settings once (a BuildOptions positionally and options=)"),
    (lambda s, o: build(s, o, options={"seed": 1}),
     "packer.build_dataset: options= takes a BuildOptions, got dict"),
    (lambda s, o: build(s, o, BuildSettings(), root=s),
     "packer.build_dataset: root= belong to settings.source (packer.SourceSettings); give them there"),
    (lambda s, o: build(s, o, BuildSettings(), ONE, workers=2),
     "packer.build_dataset: workers= belong to run (packer.RunOptions); give them there"),
    (lambda s, o: build(s, o, {"layout": {}}),
     "packer.build_dataset: settings must be a packer.BuildSettings, got dict"),
    (lambda s, o: build(s, o, BuildSettings(), {"workers": 1}),
     "packer.build_dataset: run must be a packer.RunOptions, got dict"),
    (lambda s, o: packer.append_dataset(o, s, threads=2),
     "packer.append_dataset() got an unexpected keyword argument 'threads' (how the run goes is "
     "run=packer.RunOptions(...))"),
])
def test_the_old_spelling_mixed_with_the_new_is_refused_by_name(src: Path, tmp_path: Path, call, message) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(OptionError) as caught:
            call(src, tmp_path / "out")
    assert caught.value.message == message
    assert not (tmp_path / "out").exists()


def test_append_takes_run_options_and_warns_on_the_old_keywords(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    build(src, out, BuildSettings(), ONE)
    write_images(tmp_path / "more", {"emu": 2}, seed=4)
    write_images(tmp_path / "again", {"owl": 1}, seed=5)
    with pytest.warns(DeprecationWarning, match=r"workers=, progress= are deprecated .* "
                                                r"run=packer\.RunOptions\(workers=, progress=\)"):
        packer.append_dataset(out, tmp_path / "more", workers=1, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        packer.append_dataset(out, tmp_path / "again", run=ONE)
    with open_dataset(out) as ds:
        assert ds.classes == ("cat", "dog", "emu", "owl") and len(ds) == 8
        history = ds.manifest.history
    assert [h["settings"]["source"]["kind"] for h in history] == ["folder"] * 3
    assert [h["settings"]["layout"]["seed"] for h in history] == [0, 1, 2]


# --- the record: the detected kind and every setting, read back -------------------------------------


def test_the_manifest_records_every_setting_and_the_kind_detected_once(src: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import packer.writer.run as run_module

    calls = []
    real = run_module.detect_kind
    monkeypatch.setattr(run_module, "detect_kind", lambda *a: calls.append(a) or real(*a))
    tar = _tar_of(src, tmp_path / "photos.tar")
    settings = BuildSettings(layout=LayoutSettings(shard_size=8192, seed=4), codec="passthrough",
                             checks=CheckSettings(max_file_size=1 << 20),
                             labels=LabelSettings(classes=("dog", "cat"), classes_origin="--classes dog,cat"))
    build(tar, tmp_path / "ds", settings, ONE)
    assert calls == [(tar, "auto")]  # once, at the start of the build
    with open_index(tmp_path / "ds") as index:
        record = index.manifest.build
    assert record["settings"] == settings.detected("tar").to_json()
    assert record["settings"]["source"]["kind"] == "tar" and "options" not in record and "source_kind" not in record
    assert record["settings"]["labels"]["classes_origin"] == "--classes dog,cat"
    # the archive itself (its size, and a hash of its ends: a tar's size is in 10 KiB records), not its members
    assert list(record["source_probes"]) == ["photos.tar"]
    assert record["source_probes"]["photos.tar"]["size"] == tar.stat().st_size
    assert BuildSettings.from_json(record["settings"]) == settings.detected("tar")
    assert settings_from_record(record) == settings.detected("tar")
    build(tar, tmp_path / "ds", settings, RunOptions(resume=True))
    assert len(calls) == 2  # a --resume of the finished dataset detects it once too


@pytest.mark.parametrize("document, message", [
    ([1], "build settings must be an object, got list"),
    ({"layout": [4096]}, "build settings: 'layout' must be an object, got [4096]"),
    ({"layout": {"seed": "3"}}, "build settings: layout.seed is '3'"),
    ({"labels": {"classes": ["a", 1]}}, "build settings: labels.classes is ['a', 1]"),
    ({"source": {"root": 5}}, "build settings: source.root is 5"),
    ({"codec": 5}, "build settings: codec is 5"),
    ({"layout": {"alignment": 3}}, "--alignment must be a power of two between 1 and 16777216, got 3, or 'auto'"),
    ({"codec": "nope"}, "unknown codec 'nope'; available: jpeg, passthrough, raw, tiled"),
])
def test_a_record_read_strictly_refuses_what_no_setting_is(document, message) -> None:
    """A saved plan's settings are read strictly (a damaged plan is refused); a manifest's record
    member by member, a bad member falling back to its default."""
    with pytest.raises(OptionError) as caught:
        BuildSettings.from_json(document)
    assert caught.value.message == message
    assert BuildSettings.from_json(document, strict=False) == BuildSettings()


def test_resume_of_a_finished_dataset_without_a_record_is_refused(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    build(src, out, BuildSettings(), ONE)
    edit_manifest(out, lambda manifest: manifest.update(build={"tool": "another writer"}))
    with pytest.raises(BuildError) as caught:
        build(src, out, BuildSettings(), RunOptions(resume=True))
    assert caught.value.message == ("--resume: a finished dataset is here, but its build settings are not recorded; "
                                    "pass --overwrite to rebuild it")
    edit_manifest(out, lambda manifest: manifest.update(build={"settings": {"layout": {"seed": "x"}}}))
    with pytest.raises(BuildError, match="build settings are not recorded"):  # one that does not parse is none
        build(src, out, BuildSettings(), RunOptions(resume=True))


def test_nothing_guesses_the_kind_from_the_path() -> None:
    """The writer asks sources.detect_kind once and carries the kind; it used to guess it with
    ``source.is_file()`` in five places of writer/run.py (a tar was taken for a manifest)."""
    guesses = re.compile(r"\b(source\w*|Path\(source\w*\))\.is_(file|dir)\(\)")
    found = [f"{path.name}: {match.group(0)}" for path in sorted((REPO / "packer" / "writer").glob("*.py"))
             for match in guesses.finditer(path.read_text("utf-8"))]
    # check_output_outside_source asks whether SRC is a folder (OUT inside it), not what kind it is
    assert found == ["run.py: source.is_dir()"]


def test_an_old_flat_record_reads_as_nested_settings() -> None:
    record = json.loads((OLD / "folder-ds" / fmt.MANIFEST_NAME).read_text())["build"]
    assert "settings" not in record and record["options"]["label_type"] == "str"
    nested = fmt.recorded_build_settings(record)
    assert nested == {"source": {"kind": "folder"},
                      "layout": {"alignment": 1, "shard_size": 2048, "shuffle": True, "seed": 3},
                      "codec": "passthrough",
                      "checks": {"validate": "header", "max_pixels": 150_000_000, "max_file_size": 1 << 30},
                      "labels": {"label_type": "str"}}
    assert settings_from_record(record) == OLD_SETTINGS.detected("folder")
    assert fmt.recorded_build_settings({"options": [1]}) is None and fmt.recorded_build_settings(None) is None
    assert fmt.regroup_build_options({"seed": 1, "bogus": 2}) == {
        "source": {}, "layout": {"seed": 1}, "checks": {}, "labels": {}}


# --- datasets built before the nested settings --------------------------------------------------------


def _old(tmp_path: Path, *names: str) -> Path:
    """A copy of the packer 0.1 builds (their source files with the mtimes their plan listed)."""
    work = tmp_path / "old"
    for name in ("src", "photos.tar", *names):
        (shutil.copytree if (OLD / name).is_dir() else shutil.copy)(OLD / name, work / name)
    plan = load_plan(OLD / "split-ds" / STAGING_DIR / PLAN_NAME, work / "src")
    for i in range(len(plan.listing)):  # the split build's listing checks each file's mtime
        os.utime(work / "src" / plan.listing.key(i), ns=(int(plan.listing.stamps[i]),) * 2)
    return work


@pytest.mark.parametrize("name, source, verified", [("folder-ds", "src", True), ("tar-ds", "photos.tar", False)])
def test_a_dataset_built_before_resumes_as_a_no_op(tmp_path: Path, name: str, source: str, verified: bool) -> None:
    work = _old(tmp_path, name)
    before = dataset_files(work / name)
    code, document, errors = _cli("build", work / source, work / name, "--resume", *OLD_CLI)
    assert code == 0 and document["already_complete"], errors
    assert dataset_files(work / name) == before
    # packer 0.1 probed a tar's members by key: nothing to check them against, and it says so
    assert ("records no source probes" in errors) is not verified
    code, document, errors = _cli("build", work / source, work / name, "--resume", *OLD_CLI[:-1], "int")
    assert code == 3 and "--label-type: built 'str', asked 'int'" in document["message"], errors


def test_a_dataset_built_before_takes_an_append_with_its_recorded_settings(tmp_path: Path) -> None:
    work = _old(tmp_path, "folder-ds")
    write_images(work / "more", {"emu": 1, "1": 1}, seed=8)  # '1' is a class name: --label-type str was kept
    result = packer.append_dataset(work / "folder-ds", work / "more", run=ONE)
    assert result.sample_count == 7
    with open_dataset(work / "folder-ds") as ds:
        assert ds.classes == ("cat", "dog", "1", "emu")
        history = ds.manifest.history
    assert history[0]["settings"] == fmt.recorded_build_settings(
        json.loads((OLD / "folder-ds" / fmt.MANIFEST_NAME).read_text())["build"])
    assert history[1]["settings"]["labels"]["label_type"] == "str"
    assert history[1]["settings"]["layout"] == {"alignment": 1, "shard_size": 2048, "shuffle": True, "seed": 4}


@pytest.mark.parametrize("how", ["--part then --finish", "--resume"])
def test_a_split_build_planned_before_finishes(tmp_path: Path, how: str) -> None:
    """packer 0.1 planned it (flat options in the plan) and packed part 0/2; this code does the rest."""
    work = _old(tmp_path, "split-ds", "folder-ds")
    if how == "--resume":
        code, document, errors = _cli("build", work / "src", work / "split-ds", "--resume", *OLD_CLI)
    else:
        code, document, errors = _cli("build", work / "src", work / "split-ds", "--part", "1/2", *OLD_CLI)
        assert code == 0 and document["ok"] and document["part"] == "1/2", errors
        code, document, errors = _cli("build", work / "src", work / "split-ds", "--finish")
    assert code == 0 and document["samples"] == 5, errors
    old, new = dataset_files(work / "folder-ds"), dataset_files(work / "split-ds")
    assert {k: v for k, v in new.items() if k != fmt.MANIFEST_NAME and k != fmt.REPORT_NAME} == {
        k: v for k, v in old.items() if k != fmt.MANIFEST_NAME and k != fmt.REPORT_NAME}  # same shards, index
    with open_index(work / "split-ds") as index:
        assert settings_from_record(index.manifest.build) == OLD_SETTINGS.detected("folder")
    code, document, errors = _cli("build", work / "src", work / "split-ds", "--resume", *OLD_CLI)
    assert code == 0 and document["already_complete"], errors


def test_a_split_build_planned_before_refuses_other_settings_by_name(tmp_path: Path) -> None:
    work = _old(tmp_path, "split-ds")
    code, document, errors = _cli("build", work / "src", work / "split-ds", "--part", "1/2", *OLD_CLI, "--no-shuffle")
    assert code == 2, errors
    assert "--no-shuffle: saved not given, asked given" in document["message"]
    assert "give every --part/--plan-only/--finish step" in document["message"]


# --- --resume on a finished dataset: this source, another source, another kind -------------------------


def test_resume_tells_another_kind_or_another_source_from_this_one(src: Path, tmp_path: Path) -> None:
    tar = _tar_of(src, tmp_path / "photos.tar")
    out = tmp_path / "ds"
    build(tar, out, BuildSettings(), ONE)
    assert build(tar, out, BuildSettings(), RunOptions(resume=True)).already_complete
    with pytest.raises(BuildError) as caught:
        build(src, out, BuildSettings(), RunOptions(resume=True))
    assert caught.value.message == ("--resume: the finished dataset here was built from a tar, not a folder; pass "
                                    "--overwrite to rebuild it")
    (src / "cat" / "000.jpg").unlink()
    (tmp_path / "other").mkdir()
    other = _tar_of(src, tmp_path / "other" / "photos.tar")
    assert other.stat().st_size == tar.stat().st_size  # tar pads to 10 KiB records: the size alone cannot tell
    with pytest.raises(BuildError) as caught:
        build(other, out, BuildSettings(), RunOptions(resume=True))
    assert caught.value.message == (
        f"--resume: the finished dataset here was built from a different source: 'photos.tar' under "
        f"{tmp_path / 'other'} holds other bytes than it did (same size, {tar.stat().st_size} bytes); pass "
        f"--overwrite to rebuild")
    write_images(tmp_path / "big", {"cat": 40}, seed=3)
    bigger = _tar_of(tmp_path / "big", tmp_path / "other" / "photos.tar")
    with pytest.raises(BuildError) as caught:
        build(bigger, out, BuildSettings(), RunOptions(resume=True))
    assert caught.value.message.endswith(f"'photos.tar' is {bigger.stat().st_size} bytes under {tmp_path / 'other'}, "
                                         f"it was {tar.stat().st_size} bytes; pass --overwrite to rebuild")


def test_resume_of_a_folder_of_shards_finds_a_shard_gone(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    for n in range(2):  # WebDataset: a folder of tars of samples (key.png + key.cls)
        with tarfile.open(shards / f"train-{n}.tar", "w") as archive:
            for key, data in ((f"s{n}.png", png_bytes(n)), (f"s{n}.cls", b"1")):
                info = tarfile.TarInfo(key)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    out = tmp_path / "ds"
    build(shards, out, BuildSettings(), ONE)
    with open_index(out) as index:
        assert index.manifest.build["settings"]["source"]["kind"] == "webdataset"
        assert sorted(index.manifest.build["source_probes"]) == ["train-0.tar", "train-1.tar"]
    assert build(shards, out, BuildSettings(), RunOptions(resume=True)).already_complete
    (shards / "train-1.tar").unlink()
    with pytest.raises(BuildError) as caught:
        build(shards, out, BuildSettings(), RunOptions(resume=True))
    assert caught.value.message == ("--resume: the finished dataset here was built from a different source: "
                                    f"'train-1.tar' is missing under {shards}, it was "
                                    f"{10240} bytes; pass --overwrite to rebuild")


def test_the_differences_are_named_as_the_user_types_them() -> None:
    built = BuildSettings(source=SourceSettings(kind="parquet", image_column="img"),
                          labels=LabelSettings(classes=("a", "b"), classes_origin="--classes-from /data/train"))
    asked = BuildSettings(source=SourceSettings(kind="parquet", root="/elsewhere", label_field="y"),
                          layout=LayoutSettings(shuffle=False, alignment=512), codec="jpeg:quality=80",
                          checks=CheckSettings(normalize_formats=True, max_file_size=10, validate="full"),
                          labels=LabelSettings(classes=("a", "b", "c"), classes_origin="--classes-from /data/big",
                                               label_type="int", fields=("score=float32",)))
    assert built.differences(asked, then="built") == [
        "--label-field: built 'label', asked 'y'", "--image-column: built 'img', asked None",
        "--alignment: built 'auto', asked 512", "--no-shuffle: built not given, asked given",
        "--codec: built 'passthrough', asked 'jpeg:quality=80'", "--validate: built 'header', asked 'full'",
        "--max-file-size: built 1073741824, asked 10", "--normalize-formats: built not given, asked given",
        "--classes-from: built 2 names ['a', 'b'], asked 3 names ['a', 'b', 'c']",
        "--label-type: built 'auto', asked 'int'",
        "--field: built [], asked [{'name': 'score', 'kind': 'array', 'dtype': 'float32', 'shape': []}]"]
    # where the bytes are and how the class list was given are not differences
    assert built == replace_root_and_origin(built)


def replace_root_and_origin(settings: BuildSettings) -> BuildSettings:
    from dataclasses import replace

    return replace(settings, source=replace(settings.source, root="/moved"),
                   labels=replace(settings.labels, classes_origin="--classes a,b"))
