"""Scale-out: split builds (--part K/N + --finish), the Ray engine, append, and planning at scale."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from click.testing import CliRunner

from packer.cli import _register, cli
from packer.dataset import open_dataset
from packer.errors import BuildError, OptionError
from packer.writer import build, finish
from packer.writer.append import append
from packer.writer.plan import make_plan
from packer import BuildSettings, CheckSettings, LabelSettings, LayoutSettings, RunOptions

from helpers import dataset_files, png_bytes, write_images

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

OPTIONS = BuildSettings(layout=LayoutSettings(shard_size=12 << 10, seed=5))


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    write_images(root, {"a": 8, "b": 8, "c": 6})
    (root / "b" / "broken.jpg").write_bytes(b"not an image")
    return root


def test_parts_then_finish_equal_a_single_build(source: Path, tmp_path: Path) -> None:
    build(source, tmp_path / "single", OPTIONS, RunOptions(workers=1))
    split = tmp_path / "split"
    for k in (2, 0, 1):  # any order, any machine
        assert build(source, split, OPTIONS, RunOptions(workers=1, part=(k, 3))) is None
        assert not (split / "manifest.json").exists()  # a part never makes a dataset
    result = finish(split, source)
    assert result.sample_count == 22
    assert dataset_files(split) == dataset_files(tmp_path / "single")


def test_finish_names_missing_parts(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "split"
    build(source, out, OPTIONS, RunOptions(workers=1, part=(0, 2)))
    with pytest.raises(BuildError, match="not packed yet"):
        finish(out, source)
    assert not (out / "manifest.json").exists()


def test_parts_with_different_options_or_inputs_are_refused(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "split"
    build(source, out, OPTIONS, RunOptions(workers=1, part=(0, 2)))
    with pytest.raises(OptionError, match="different options") as caught:
        build(source, out, BuildSettings(layout=LayoutSettings(shard_size=12 << 10, seed=6)), RunOptions(workers=1, part=(1, 2)))
    assert "seed: saved" in caught.value.message and "--resume" not in caught.value.message
    other = tmp_path / "other"
    write_images(other, {"a": 8, "b": 8, "c": 6}, size=40)
    with pytest.raises(BuildError, match="different source"):
        build(other, out, OPTIONS, RunOptions(workers=1, part=(1, 2)))


def test_cli_part_and_finish(source: Path, tmp_path: Path) -> None:
    _register()
    runner = CliRunner()
    out = tmp_path / "cli"
    for k in range(2):
        result = runner.invoke(cli, ["build", str(source), str(out), "--part", f"{k}/2", "-q",
                                     "--shard-size", "12K", "--seed", "5"])
        assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["build", str(source), str(out), "--finish", "-q"])
    assert result.exit_code == 0, result.output
    build(source, tmp_path / "single", OPTIONS, RunOptions(workers=1))
    assert dataset_files(out) == dataset_files(tmp_path / "single")
    bad = runner.invoke(cli, ["build", str(source), str(out), "--part", "3/2"])
    assert bad.exit_code == 2 and "0 <= K < N" in bad.output


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_ray_engine_equals_local_pool(source: Path, tmp_path: Path) -> None:
    import ray

    build(source, tmp_path / "local", OPTIONS, RunOptions(workers=2))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        build(source, tmp_path / "ray", OPTIONS, RunOptions(engine="ray"))
    finally:
        ray.shutdown()
    assert dataset_files(tmp_path / "ray") == dataset_files(tmp_path / "local")


def test_append_adds_shards_and_keeps_old_readers_working(source: Path, tmp_path: Path) -> None:
    ds_path = tmp_path / "ds"
    build(source, ds_path, OPTIONS, RunOptions(workers=1))
    before = {p.name: p.read_bytes() for p in (ds_path / "shards").iterdir()}
    old = open_dataset(ds_path)
    old_bytes = [old.read(i) for i in range(len(old))]
    new = tmp_path / "new"
    write_images(new, {"b": 3, "zebra": 4}, seed=9)
    for path in sorted((new / "b").iterdir()):
        path.rename(path.with_name("new-" + path.name))
    shutil.copy(source / "a" / "000.jpg", new / "b" / "000.jpg")  # same key as an existing sample
    result = append(ds_path, new, run=RunOptions(workers=1))
    assert result.sample_count == 22 + 7
    assert [r.reason for r in result.rejected] == ["duplicate-entry"]
    ds = open_dataset(ds_path, verify_checksums=True)
    assert ds.classes == ("a", "b", "c", "zebra")  # new class, next id; old ids unchanged
    assert np.array_equal(ds.labels[:22], old.labels)
    for i in range(22, len(ds)):
        assert ds.read(i) == (new / ds.key(i)).read_bytes()
        assert ds.classes[int(ds.labels[i])] == ds.key(i).split("/")[0]
    for name, data in before.items():  # existing shards never rewritten
        assert (ds_path / "shards" / name).read_bytes() == data
    assert [old.read(i) for i in range(len(old))] == old_bytes  # the old reader is unaffected
    history = ds.manifest.history
    assert [h["kind"] for h in history] == ["build", "append"] and history[1]["samples"] == 7
    numbers = [int(s.path.split("-")[1]) for s in ds.manifest.shards]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)


def test_plan_of_a_million_entries_is_fast_and_small() -> None:
    import bench_plan

    listing = bench_plan.synthetic_listing(1_000_000)
    tracemalloc.start()
    plan = make_plan(listing, BuildSettings())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert plan.shard_starts[-1] == 1_000_000 and np.all(np.diff(plan.shard_starts) > 0)
    assert sorted(plan.order[:1000].tolist()) != plan.order[:1000].tolist()
    # the planner's working memory: a few arrays of 8 bytes per entry, no per-entry objects
    assert peak < 64 * 1_000_000, f"planning 1M entries peaked at {peak / 1e6:.0f} MB"


def test_plan_only_then_parts(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "split"
    assert build(source, out, OPTIONS, RunOptions(plan_only=True)) is None
    assert (out / ".packer-build" / "plan.pkp").is_file() and not (out / "shards").exists()
    for k in range(2):
        build(source, out, OPTIONS, RunOptions(workers=1, part=(k, 2)))
    finish(out, source)
    build(source, tmp_path / "single", OPTIONS, RunOptions(workers=1))
    assert dataset_files(out) == dataset_files(tmp_path / "single")


def test_a_failed_append_cleans_up_and_can_never_be_finished_as_a_build(source: Path, tmp_path: Path,
                                                                        monkeypatch) -> None:
    import packer.writer.append as append_module
    from packer.writer.staging import STAGING_DIR
    from packer.errors import OutputExistsError

    ds_path = tmp_path / "ds"
    build(source, ds_path, OPTIONS, RunOptions(workers=1))
    before = {p.name for p in (ds_path / "shards").iterdir()}
    new = tmp_path / "new"
    write_images(new, {"zebra": 4}, seed=4)

    def broken_commit(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(append_module, "commit_dataset", broken_commit)
    with pytest.raises(OSError):
        append(ds_path, new, run=RunOptions(workers=1))
    assert not (ds_path / STAGING_DIR).exists()  # no plan left behind for --finish/--resume
    assert {p.name for p in (ds_path / "shards").iterdir()} == before  # its new shards are gone
    assert len(open_dataset(ds_path, verify_checksums=True)) == 22
    with pytest.raises(BuildError, match="no split build"):
        finish(ds_path, new)
    # a plan from an append that was killed (no chance to clean up) is refused too
    monkeypatch.undo()
    import packer.writer.plan as plan_module
    listing = __import__("packer.sources", fromlist=["list_source"]).list_source(new)
    plan = plan_module.make_plan(listing, OPTIONS, first_shard_number=9)
    (ds_path / STAGING_DIR / "done").mkdir(parents=True)
    plan_module.save_plan(plan, ds_path / STAGING_DIR / "plan.pkp")
    with pytest.raises(OutputExistsError):
        finish(ds_path, new)
    with pytest.raises(BuildError, match="interrupted `packer append`"):
        finish(ds_path, new, overwrite=True)
    with pytest.raises(BuildError, match="interrupted `packer append`"):
        build(new, ds_path, OPTIONS, RunOptions(workers=1, resume=True))
    assert len(open_dataset(ds_path, verify_checksums=True)) == 22


def test_generations_are_numbered_one_by_one(source: Path, tmp_path: Path) -> None:
    ds_path = tmp_path / "ds"
    build(source, ds_path, OPTIONS, RunOptions(workers=1))
    for n in range(2):
        new = tmp_path / f"new{n}"
        write_images(new, {f"extra{n}": 2}, seed=10 + n)
        append(ds_path, new, run=RunOptions(workers=1))
    history = open_dataset(ds_path).manifest.history
    assert [h["generation"] for h in history] == [0, 1, 2]
    assert [h["settings"]["layout"]["seed"] for h in history[1:]] == [OPTIONS.layout.seed + 1, OPTIONS.layout.seed + 2]
    assert history[0]["settings"] == open_dataset(ds_path).manifest.build["settings"]


# --- commit: the build report ---------------------------------------------------------------------


def test_append_refuses_a_source_with_declared_fields(tmp_path: Path) -> None:
    """A COCO source always declares fields; an append cannot store them (the dataset is left as it was)."""
    from packer.writer.append import append
    from packer.errors import BuildError

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "1.png").write_bytes(png_bytes(1))
    (tmp_path / "src" / "list.jsonl").write_text(json.dumps({"path": "1.png", "label": -1}) + "\n")
    out = tmp_path / "ds"
    build(tmp_path / "src" / "list.jsonl", out, BuildSettings(), RunOptions(workers=1))
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (tmp_path / "coco").mkdir()
    (tmp_path / "coco" / "x.png").write_bytes(png_bytes(2))
    (tmp_path / "coco" / "instances.json").write_text(json.dumps(
        {"images": [{"id": 1, "file_name": "x.png", "width": 14, "height": 10}], "annotations": [],
         "categories": [{"id": 1, "name": "c"}]}))
    with pytest.raises(BuildError) as caught:
        append(out, tmp_path / "coco" / "instances.json", run=RunOptions(workers=1))
    assert caught.value.message == "append does not support datasets with declared fields yet"
    assert {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_append_keeps_the_recorded_normalize_formats_and_label_type(tmp_path: Path) -> None:
    """settings_from_manifest (then options_from_manifest) read only the options to_json() wrote at
    their defaults' absence: an append to a --normalize-formats build stored a TIFF verbatim, and
    one to a --label-type str build read '0'/'1' labels as integers (found by
    tests/writer/test_options_crossed.py)."""
    from packer.dataset import open_dataset
    from packer.writer.append import settings_from_manifest

    def source(root: Path, seed: int) -> Path:
        (root / "img").mkdir(parents=True)
        Image.new("RGB", (5, 4), (seed, 0, 0)).save(root / "img" / f"{seed}.tif")
        (root / "rows.csv").write_text(f"path,label\nimg/{seed}.tif,{seed % 2}\n")
        return root / "rows.csv"

    build(source(tmp_path / "a", 0), tmp_path / "ds", BuildSettings(checks=CheckSettings(normalize_formats=True), labels=LabelSettings(label_type="str")), RunOptions(workers=1))
    with open_dataset(tmp_path / "ds") as ds:
        settings = settings_from_manifest(ds.manifest)
    assert settings.checks.normalize_formats is True and settings.labels.label_type == "str"
    append(tmp_path / "ds", source(tmp_path / "b", 1), run=RunOptions(workers=1))
    with open_dataset(tmp_path / "ds") as ds:
        assert ds.classes == ("0", "1") and ds.labels.tolist() == [0, 1]
        assert all(ds.read(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in range(len(ds)))
