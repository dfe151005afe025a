"""The shard plan (packer/writer/plan.py): build settings and their refusals (packer/writer/settings.py),
order and cuts, shard capacity, and the saved plan a resumed build trusts.

Builds run with workers=1: packing then happens in this process, where mutmut sees it."""

from __future__ import annotations
import io
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from packer import format as fmt
from packer.dataset import open_index
from packer.errors import BuildError, OptionError
from packer.sources import list_source
from packer.writer import build
from packer.sources import LabelSettings, SourceSettings
from packer.writer.plan import (
    DEFAULT_MAX_FILE_SIZE,
    DEFAULT_SHARD_SIZE,
    BuildOptions,
    load_plan,
    make_plan,
    plan_shards,
    save_plan,
)
from packer.writer.settings import BuildSettings, CheckSettings, LayoutSettings, RunOptions


def layout(**changes: Any) -> BuildSettings:
    """Settings whose layout has ``changes`` (alignment, shard_size, shuffle, seed)."""
    return BuildSettings(layout=LayoutSettings(**changes))

from helpers import png_bytes, png_folder


# --- build: atomic, records, commit, plan ---------------------------------------------------------


@pytest.mark.parametrize("settings, message", [
    (layout(alignment=3), "--alignment must be a power of two between 1 and 16777216, got 3, or 'auto'"),
    (layout(alignment=0), "--alignment must be a power of two between 1 and 16777216, got 0, or 'auto'"),
    (layout(alignment=1 << 25), "--alignment must be a power of two between 1 and 16777216, got 33554432, or 'auto'"),
    (layout(alignment=4096, shard_size=4095),
     "--shard-size must be at least the alignment (4096 bytes) and below 2^62, got 4095"),
    (layout(shard_size=fmt.MAX_FILE_SIZE),
     f"--shard-size must be at least 1 byte and below 2^62, got {fmt.MAX_FILE_SIZE}"),
    (layout(shard_size=0), "--shard-size must be at least 1 byte and below 2^62, got 0"),
    (layout(seed=-1), "--seed must be an integer from 0 to 2^64-1, got -1"),
    (layout(seed=1 << 64), f"--seed must be an integer from 0 to 2^64-1, got {1 << 64}"),
    (layout(shuffle=1), "shuffle must be True or False (--no-shuffle turns it off), got 1"),
    (BuildSettings(checks=CheckSettings(max_pixels=0)), "--max-pixels must be a positive number of pixels, got 0"),
    (BuildSettings(checks=CheckSettings(validate="some")), "--validate must be 'header' or 'full', got 'some'"),
    (BuildSettings(checks=CheckSettings(normalize_formats="yes")),
     "--normalize-formats is a flag (True or False), got 'yes'"),
    (BuildSettings(codec=5), "--codec must be a codec spec like 'jpeg:quality=90', got 5"),
    (BuildSettings(labels=LabelSettings(label_type="float")), "--label-type must be one of auto, int, str, got 'float'"),
    (BuildSettings(source=SourceSettings(kind="rar")),
     "--source-kind must be one of auto, folder, manifest, tar, zip, webdataset, parquet, coco, hf, got 'rar'"),
    (BuildSettings(source=SourceSettings(label_field=None)), "--label-field must be a column or field name, got None"),
    (BuildSettings(source=SourceSettings(image_column=3)), "--image-column must be a column or field name, got 3"),
    (BuildSettings(layout=4096), "BuildSettings.layout must be a packer.LayoutSettings, got int"),
])
def test_build_settings_are_checked_by_the_option_name(settings: BuildSettings, message: str) -> None:
    with pytest.raises(OptionError) as caught:
        settings.check()
    assert caught.value.message == message


@pytest.mark.parametrize("run, message", [
    (RunOptions(workers=0), "--workers must be a positive number of processes, got 0"),
    (RunOptions(workers=True), "--workers must be a positive number of processes, got True"),
    (RunOptions(engine="dask"), "unknown engine 'dask' (use 'local' or 'ray')"),
    (RunOptions(on_error="ignore"), "--on-error must be 'skip' or 'fail', got 'ignore'"),
    (RunOptions(part=(2, 2)), "--part must be K/N with 0 <= K < N, got (2, 2)"),
    (RunOptions(resume="yes"), "--resume is a flag (True or False), got 'yes'"),
    (RunOptions(plan_only=1), "--plan-only is a flag (True or False), got 1"),
])
def test_run_options_are_checked_by_the_option_name(run: RunOptions, message: str) -> None:
    with pytest.raises(OptionError) as caught:
        run.check()
    assert caught.value.message == message


def test_run_options_take_a_part_as_text() -> None:
    assert RunOptions(part="1/4").part == (1, 4) and RunOptions(part=[0, 2]).part == (0, 2)
    assert RunOptions(part="1/4").split and RunOptions(plan_only=True).split and not RunOptions().split
    with pytest.raises(OptionError, match=r"^--part 4/4: need 0 <= K < N$"):
        RunOptions(part="4/4")


def test_build_settings_edges_are_accepted() -> None:
    layout(alignment=1, shard_size=1, seed=(1 << 64) - 1).check()
    BuildSettings(checks=CheckSettings(max_pixels=1, validate="full")).check()
    layout(alignment=fmt.MAX_ALIGNMENT, shard_size=fmt.MAX_ALIGNMENT).check()
    layout(shard_size=fmt.MAX_FILE_SIZE - 1).check()
    BuildSettings(source=SourceSettings(kind="python")).check()  # packer.Writer's samples: no door, no path
    assert BuildSettings().to_json() == {
        "source": {"kind": "auto", "root": None, "label_field": "label", "image_column": None},
        "layout": {"alignment": "auto", "shard_size": DEFAULT_SHARD_SIZE, "shuffle": True, "seed": 0},
        "codec": "passthrough",
        "checks": {"validate": "header", "max_pixels": CheckSettings().max_pixels, "max_file_size": DEFAULT_MAX_FILE_SIZE,
                   "normalize_formats": False},
        "labels": {"classes": None, "classes_origin": None, "label_type": "auto", "fields": []}}
    assert DEFAULT_SHARD_SIZE == 512 << 20
    with pytest.raises(OptionError, match="codec"):
        BuildSettings(codec="nope").check()


def test_the_flat_build_options_are_the_same_settings() -> None:
    """BuildOptions (deprecated) moves each flat name to its group, and writes the flat record it wrote."""
    flat = BuildOptions(alignment=512, shard_size=8192, shuffle=False, seed=3, codec="raw:size=8x8", validate="full",
                        max_pixels=99, classes=("b", "a"), label_type="str", max_file_size=77, normalize_formats=True,
                        fields=("score=float32",))
    assert flat.to_settings(SourceSettings(kind="zip")) == BuildSettings(
        source=SourceSettings(kind="zip"), layout=LayoutSettings(512, 8192, False, 3), codec="raw:size=8x8",
        checks=CheckSettings("full", 99, 77, True),
        labels=LabelSettings(classes=("b", "a"), label_type="str", fields=("score=float32",)))
    assert BuildOptions().to_json() == {"alignment": "auto", "shard_size": DEFAULT_SHARD_SIZE, "shuffle": True,
                                        "seed": 0, "codec": "passthrough", "validate": "header",
                                        "max_pixels": BuildOptions().max_pixels,
                                        "max_file_size": DEFAULT_MAX_FILE_SIZE}
    assert flat.field_specs == flat.to_settings().labels.field_specs
    with pytest.raises(OptionError, match="^--max-pixels"):
        BuildOptions(max_pixels=0).check()


def test_plan_order_and_cuts(tmp_path: Path) -> None:
    listing = list_source(png_folder(tmp_path / "src", 9))
    shuffled = make_plan(listing, layout(seed=4, shard_size=3 * 4096 + 4096, alignment=4096))
    assert shuffled.order.tolist() == np.random.Generator(np.random.PCG64(4)).permutation(9).tolist()
    assert shuffled.order.dtype == np.int64
    kept = make_plan(listing, layout(shuffle=False, shard_size=3 * 4096 + 4096, alignment=4096))
    assert kept.order.tolist() == list(range(9)) and kept.order.dtype == np.int64
    assert kept.shard_starts.tolist() == [0, 3, 6, 9] and kept.shard_count == 3
    assert kept.shard_members(1).tolist() == [3, 4, 5]
    assert plan_shards(np.zeros(0, dtype=np.uint64), 4096, 1 << 20).tolist() == [0]
    # an oversize sample gets a shard of its own; the greedy cut closes before the sample that overflows
    sizes = np.array([100, 9000, 100, 100, 5000], dtype=np.uint64)
    assert plan_shards(sizes, 4096, 16384).tolist() == [0, 1, 2, 4, 5]
    assert plan_shards(sizes, 1, 9000 + 64).tolist() == [0, 1, 2, 5]
    assert plan_shards(np.array([10, 10], dtype=np.uint64), 1, 64 + 20).tolist() == [0, 2]
    assert plan_shards(np.array([10, 10], dtype=np.uint64), 1, 64 + 19).tolist() == [0, 1, 2]
    assert plan_shards(np.array([10, 10], dtype=np.uint64), 1, 10).tolist() == [0, 1, 2]
    with pytest.raises(BuildError, match="^shard size 100 is smaller than the alignment 4096$"):
        make_plan(listing, layout(shard_size=100, alignment=4096))


def test_plan_saves_and_loads_exactly(tmp_path: Path) -> None:
    src = png_folder(tmp_path / "src", 7)
    (src / "stray.png").write_bytes(b"outside every class folder")
    listing = list_source(src)
    plan = make_plan(listing, layout(seed=2, shard_size=8192), source="src", first_shard_number=5)
    path = tmp_path / "plan.pkp"
    digest = save_plan(plan, path)
    assert digest == plan.fingerprint == fmt.checksum(path.read_bytes()) != 0
    loaded = load_plan(path, src)
    assert loaded.fingerprint == digest and loaded.source == "src" and loaded.first_shard_number == 5
    assert loaded.settings == plan.settings and loaded.listing.kind == "folder" == loaded.settings.source.kind
    assert loaded.order.tolist() == plan.order.tolist() and loaded.order.dtype == np.int64
    assert loaded.shard_starts.tolist() == plan.shard_starts.tolist() and loaded.shard_starts.dtype == np.int64
    assert loaded.listing.classes == listing.classes and loaded.listing.root == src
    assert [loaded.listing.key(i) for i in range(7)] == [listing.key(i) for i in range(7)]
    assert loaded.listing.sizes.tolist() == listing.sizes.tolist()
    assert loaded.listing.labels.tolist() == listing.labels.tolist()
    assert [r.to_json() for r in loaded.listing.rejected] == [r.to_json() for r in listing.rejected] != []
    data = path.read_bytes()
    path.write_bytes(data[:40])  # cut short (a column file has no checksum of its own: see SPEC)
    with pytest.raises(BuildError) as caught:
        load_plan(path, src)
    assert "the saved build plan is damaged" in caught.value.message and f"delete {tmp_path}" in caught.value.message
    assert caught.value.path == str(path)
    with pytest.raises(BuildError) as caught:
        load_plan(tmp_path / "missing.pkp", src)
    assert caught.value.message == "cannot read the build plan: No such file or directory"


# --- format: the index table and the column-file writer -------------------------------------------


def _png_bytes() -> bytes:
    import io

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _saved_plan(tmp_path: Path, **overrides: Any) -> tuple[Path, Path]:
    """A saved plan of a small JSONL source with metadata; ``overrides`` replace plan fields first."""
    from dataclasses import replace

    src = png_folder(tmp_path / "src", 6)
    lines = [json.dumps({"path": f"{'cat' if i % 2 else 'dog'}/{i:03d}.png", "label": i % 2, "metadata": {"i": i}})
             for i in range(6)]
    manifest = src / "list.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    plan = make_plan(list_source(manifest), layout(shard_size=8192))
    plan = replace(plan, **overrides)
    path = tmp_path / "plan.pkp"
    save_plan(plan, path)
    return path, src


def test_loaded_plan_keeps_the_metadata(tmp_path: Path) -> None:
    path, src = _saved_plan(tmp_path)
    loaded = load_plan(path, src)
    assert [json.loads(loaded.listing.metadata(i)) for i in range(6)] == [{"i": i} for i in range(6)]
    assert loaded.source == "" and loaded.first_shard_number == 0


@pytest.mark.parametrize("what", ["order-short", "order-high", "order-negative", "starts-not-at-0", "starts-short",
                                  "starts-decrease", "starts-empty"])
def test_an_inconsistent_plan_is_refused(tmp_path: Path, what: str) -> None:
    overrides: dict[str, Any] = {
        "order-short": {"order": np.arange(5)},
        "order-high": {"order": np.array([0, 1, 2, 3, 4, 6])},
        "order-negative": {"order": np.array([0, 1, 2, 3, 4, -1])},
        "starts-not-at-0": {"shard_starts": np.array([1, 3, 6])},
        "starts-short": {"shard_starts": np.array([0, 3, 5])},
        "starts-decrease": {"shard_starts": np.array([0, 4, 3, 6])},
        "starts-empty": {"shard_starts": np.zeros(0, dtype=np.int64)},
    }[what]
    path, src = _saved_plan(tmp_path, **overrides)
    with pytest.raises(BuildError) as caught:
        load_plan(path, src)
    assert caught.value.message == f"the saved build plan is inconsistent; delete {tmp_path} to start over"
    assert caught.value.path == str(path)


def test_plan_edges_that_are_accepted(tmp_path: Path) -> None:
    path, src = _saved_plan(tmp_path, order=np.array([5, 4, 3, 2, 1, 0]), shard_starts=np.array([0, 6]))
    assert load_plan(path, src).order.tolist() == [5, 4, 3, 2, 1, 0]


def _rewrite_header(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    rows, columns = fmt.parse_column_file(path.read_bytes(), fmt.PLAN_MAGIC)
    header = json.loads(columns["header"].tobytes())
    change(header)
    columns = {name: np.array(column) for name, column in columns.items()}
    columns["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    path.write_bytes(b"".join(bytes(p) for p in fmt.encode_column_file(fmt.PLAN_MAGIC, rows, columns)))


def test_plan_header_defaults_and_unusable_headers(tmp_path: Path) -> None:
    path, src = _saved_plan(tmp_path)
    _rewrite_header(path, lambda h: (h.pop("source"), h.pop("first_shard_number")))
    loaded = load_plan(path, src)  # a plan written before these fields existed
    assert loaded.source == "" and loaded.first_shard_number == 0
    _rewrite_header(path, lambda h: h["settings"]["layout"].update(seed="x"))
    with pytest.raises(BuildError) as caught:
        load_plan(path, src)
    assert caught.value.message.startswith("the saved build plan is unusable (OptionError(")
    assert "build settings: layout.seed is 'x'" in caught.value.message
    _rewrite_header(path, lambda h: (h["settings"]["layout"].update(seed=0), h.pop("kind")))
    with pytest.raises(BuildError) as caught:
        load_plan(path, src)
    assert caught.value.message == f"the saved build plan is unusable (KeyError('kind')); delete {tmp_path} to start over"
    _rewrite_header(path, lambda h: (h.pop("settings"), h.update(options={"seed": 1, "bogus": 1}, kind="manifest")))
    with pytest.raises(BuildError) as caught:
        load_plan(path, src)
    assert caught.value.message.startswith("the saved build plan is unusable (OptionError(")
    assert "unknown options ['bogus']" in caught.value.message
    assert caught.value.message.endswith(f"); delete {tmp_path} to start over") and caught.value.path == str(path)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(BuildError) as damaged:
        load_plan(path, src)
    assert damaged.value.message == (f"the saved build plan is damaged ({path}: plan file is 40 bytes, shorter than its "
                                     f"64-byte header); delete {tmp_path} to start over")
    with pytest.raises(BuildError) as unreadable:
        load_plan(tmp_path / "nope.pkp", src)
    assert unreadable.value.path == str(tmp_path / "nope.pkp")


def test_make_plan_edges(tmp_path: Path) -> None:
    listing = list_source(png_folder(tmp_path / "src", 3))
    plan = make_plan(listing, layout(shard_size=4096, alignment=4096))  # shard size == alignment is allowed
    assert plan.source == "" and plan.shard_count == 3 and plan.first_shard_number == 0
    empty = plan_shards(np.zeros(0, dtype=np.uint64), 1, 64)
    assert empty.dtype == np.int64
    assert plan_shards(np.ones(3, dtype=np.uint64), 1, 64).tolist() == [0, 1, 2, 3]  # no room after the header
    assert plan_shards(np.ones(3, dtype=np.uint64), 1, 65).tolist() == [0, 1, 2, 3]
    assert plan_shards(np.ones(3, dtype=np.uint64), 1, 66).tolist() == [0, 2, 3]
    with pytest.raises(OptionError) as caught:
        BuildSettings(codec="nope").check()
    assert caught.value.message == "unknown codec 'nope'; available: jpeg, passthrough, raw, tiled"


def test_plan_consistency_edges(tmp_path: Path) -> None:
    from dataclasses import replace

    from packer.sources.listing import select_rows

    path, src = _saved_plan(tmp_path, shard_starts=np.array([0, 3, 3, 6]))
    assert load_plan(path, src).shard_starts.tolist() == [0, 3, 3, 6]  # an empty planned shard is tolerated
    listing = list_source(png_folder(tmp_path / "src2", 2))
    empty = make_plan(select_rows(listing, np.zeros(2, dtype=bool)), BuildSettings())
    assert empty.shard_starts.tolist() == [0]
    save_plan(empty, tmp_path / "empty.pkp")
    assert load_plan(tmp_path / "empty.pkp", src).shard_count == 0
    plan = make_plan(listing, BuildSettings())
    short_labels = replace(plan, listing=replace(plan.listing, labels=plan.listing.labels[:-1]))
    save_plan(short_labels, tmp_path / "labels.pkp")
    with pytest.raises(BuildError, match="inconsistent"):
        load_plan(tmp_path / "labels.pkp", src)


# --- build/plan: class lists, the file-size option, what a saved plan keeps -----------------------


def test_label_settings_class_lists(tmp_path: Path) -> None:
    assert LabelSettings(classes=["b", "a"]).classes == ("b", "a")  # from JSON: a list becomes a tuple
    assert LabelSettings(classes="dog,cat").classes == ("dog", "cat")  # names separated by commas
    listed = tmp_path / "classes.txt"
    listed.write_text("zebra\n\n  ant \n")
    assert LabelSettings(classes=listed).classes == ("zebra", "ant") == LabelSettings(classes=str(listed)).classes
    assert LabelSettings(classes=("x",)).classes == ("x",) and LabelSettings().classes is None
    assert LabelSettings(classes=["b", "a"]).to_json()["classes"] == ["b", "a"]
    assert LabelSettings().to_json()["classes"] is None and LabelSettings().to_json()["classes_origin"] is None
    for classes, message in [([], "--classes: the class list is empty"),
                             (["a", "a"], "--classes: class 'a' is listed twice"),
                             (("a", 3), "--classes: class names must be non-empty strings, got 3")]:
        with pytest.raises(OptionError) as caught:
            LabelSettings(classes=classes).check()
        assert caught.value.message == message
    with pytest.raises(OptionError) as caught:  # the message names where the list came from
        LabelSettings(classes=("a", "a"), classes_origin="--classes-from /data/train").check()
    assert caught.value.message == "--classes-from /data/train: class 'a' is listed twice"


def test_the_max_file_size_bounds() -> None:
    for value in (0, -1, True, 1.5, fmt.MAX_FILE_SIZE):
        with pytest.raises(OptionError) as caught:
            CheckSettings(max_file_size=value).check()
        assert caught.value.message == f"--max-file-size must be between 1 byte and 2^62, got {value!r}"
    for value in (1, 2, fmt.MAX_FILE_SIZE - 1):
        CheckSettings(max_file_size=value).check()


def test_a_saved_plan_keeps_label_type_warnings_and_stamps(tmp_path: Path) -> None:
    from packer.classes import split_folder_warning

    src = tmp_path / "src"
    rng = np.random.default_rng(2)
    for split in ("train", "val"):
        (src / split).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)).save(src / split / f"{i}.png")
    listing = list_source(src)
    plan = make_plan(listing, layout(shard_size=8192))
    path = tmp_path / "plan.pkp"
    save_plan(plan, path)
    loaded = load_plan(path, src).listing
    assert loaded.warnings == [split_folder_warning(["train", "val"])] == listing.warnings
    assert loaded.label_type == listing.label_type
    assert loaded.class_order == listing.class_order == "sorted"  # folder names (the build's summary says)
    assert loaded.stamps.tolist() == listing.stamps.tolist() and len(loaded.stamps) == 4
    assert loaded.stamps.dtype == np.uint64
    _rewrite_header(path, lambda h: (h.pop("label_type"), h.pop("warnings"), h.pop("class_order")))  # before these
    older = load_plan(path, src).listing
    assert older.label_type == "str" and older.warnings == [] and older.class_order is None


def test_a_plan_without_stamps_loads_with_none(tmp_path: Path) -> None:
    path, src = _saved_plan(tmp_path)
    rows, columns = fmt.parse_column_file(path.read_bytes(), fmt.PLAN_MAGIC)
    assert "stamps" in columns
    kept = {name: np.array(column) for name, column in columns.items() if name != "stamps"}
    path.write_bytes(b"".join(bytes(p) for p in fmt.encode_column_file(fmt.PLAN_MAGIC, rows, kept)))
    stamps = load_plan(path, src).listing.stamps
    assert stamps.dtype == np.uint64 and stamps.shape == (0,)


def test_the_build_result_names_the_class_list(tmp_path: Path) -> None:
    result = build(png_folder(tmp_path / "src", 4), tmp_path / "ds", BuildSettings(), RunOptions(workers=1))
    assert result.classes == ("cat", "dog") and result.sample_count == 4


# --- plan: options, the saved plan ----------------------------------------------------------------


def test_option_refusals_name_the_option() -> None:
    from packer.errors import OptionError

    with pytest.raises(OptionError) as caught:
        LabelSettings(fields=(3,))
    assert caught.value.message == ("a field is declared by a --field string, a FieldSpec or a declaration "
                                    "object, got 3")
    with pytest.raises(OptionError) as caught:
        BuildOptions(fields=(3,))
    assert caught.value.message == ("a field is declared by a --field string, a FieldSpec or a declaration "
                                    "object, got 3")


def test_a_plan_that_is_not_a_regular_file_is_refused_by_name(tmp_path: Path) -> None:
    import os

    from packer.writer.plan import load_plan
    from packer.errors import BuildError

    (tmp_path / "plan.pkp").mkdir()
    os.mkfifo(tmp_path / "fifo.pkp")  # never opened for reading: it would hang
    for name in ("plan.pkp", "fifo.pkp"):
        with pytest.raises(BuildError) as caught:
            load_plan(tmp_path / name, tmp_path)
        assert (caught.value.message, caught.value.path) == (
            f"cannot read the build plan: {name} is not a regular file", str(tmp_path / name))


def test_a_rejected_key_that_is_not_utf8_survives_the_saved_plan(tmp_path: Path) -> None:
    """A COCO ``file_name`` "x\\udcff.jpg" (the file b"x\\xff.jpg") rejected while listing: the plan
    saves and loads it (it used to fail with UnicodeEncodeError), and the report holds its bytes."""
    from packer.sources import SourceOptions, list_source
    from packer.writer.plan import load_plan, make_plan, save_plan

    root = tmp_path / "src"
    (root / "images").mkdir(parents=True)
    (root / "images" / "a.png").write_bytes(png_bytes(1))
    document = {"images": [{"id": 1, "file_name": "x\udcff.jpg", "width": 4, "height": 4},
                           {"id": 2, "file_name": "a.png", "width": 14, "height": 10}],
                "annotations": [{"id": 7, "image_id": 1, "category_id": 3, "bbox": [0, 0, -1, 1]}],
                "categories": [{"id": 3, "name": "caf\u00e9"}]}
    annotations = root / "instances.json"
    annotations.write_text(json.dumps(document), "utf-8")
    listing = list_source(annotations, SourceOptions(source=SourceSettings(root=root / "images")))
    assert [r.key for r in listing.rejected] == ["x\udcff.jpg"]
    plan = make_plan(listing, BuildSettings())
    save_plan(plan, tmp_path / "plan.pkp")
    loaded = load_plan(tmp_path / "plan.pkp", root / "images")
    assert [r.to_json() for r in loaded.listing.rejected] == [r.to_json() for r in listing.rejected]
    assert loaded.listing.fields.specs == listing.fields.specs  # the category names, non-ASCII
    result = build(annotations, tmp_path / "ds", BuildSettings(source=SourceSettings(root=root / "images")),
                   RunOptions(workers=1))
    assert result.sample_count == 1 and [r.key for r in result.rejected] == ["x\udcff.jpg"]
    lines = (tmp_path / "ds" / fmt.REPORT_NAME).read_bytes().split(b"\n")
    assert len(lines) == 3 and lines[1].startswith(b'{"key": "x\xff.jpg", "message": "annotation 7: ')


# --- plan: shard capacity leaves room for the header's data offset --------------------------------


@pytest.mark.parametrize("alignment", [1, 512, 4096])
def test_planned_shards_never_exceed_the_shard_size(alignment: int) -> None:
    """Mutant: capacity = shard_size (the header's data offset forgotten): 20 KiB shards for 16 KiB."""
    shard_size = 16 << 10
    sizes = np.full(40, 4096, dtype=np.uint64)
    starts = plan_shards(sizes, alignment, shard_size)
    data_offset = fmt.shard_data_offset(alignment)
    for a, b in zip(starts[:-1], starts[1:]):
        padded = sum(fmt.align_up(int(s), alignment) for s in sizes[a:b])
        assert data_offset + padded <= shard_size, (alignment, a, b)
    # and greedily full: one more sample would not have fitted
    per_shard = (shard_size - data_offset) // fmt.align_up(4096, alignment)
    assert np.all(np.diff(starts)[:-1] == per_shard)


def test_built_shards_are_at_most_the_shard_size(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    for i in range(8):  # stored images of exactly 4 KiB: four of them fill 16 KiB of payload
        (src / "x" / f"{i}.png").write_bytes(_png_of_size(4096, seed=i))
    out = tmp_path / "ds"
    build(src, out, layout(shard_size=16 << 10), RunOptions(workers=1))
    with open_index(out) as index:
        sizes = [s.size for s in index.manifest.shards]
    assert sizes and max(sizes) <= 16 << 10, sizes
    assert len(sizes) == 3  # 3 + 3 + 2 samples after the 4 KiB header region


def _png_of_size(size: int, seed: int) -> bytes:
    """A valid PNG padded to exactly ``size`` bytes with an ancillary chunk before IEND."""
    buffer = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), seed, dtype=np.uint8)).save(buffer, "PNG")
    data = buffer.getvalue()
    body, iend = data[:-12], data[-12:]
    import zlib

    filler = size - len(data) - 12
    assert filler >= 0
    chunk = b"zzZz" + bytes(filler)
    crc = zlib.crc32(chunk).to_bytes(4, "big")
    result = body + filler.to_bytes(4, "big") + chunk + crc + iend
    assert len(result) == size
    return result


# --- plan: the capacity rule as a property, whatever the order (issue 41) ---------------------------


def _listing_of_sizes(sizes: list[int]) -> Any:
    """A listing of ``len(sizes)`` files of these sizes (no file behind them: planning reads none)."""
    from packer.sources import SourceListing

    count = len(sizes)
    return SourceListing(root=Path("."), kind="folder", classes=(), key_blob=np.zeros(0, dtype=np.uint8),
                         key_offsets=np.zeros(count + 1, dtype=np.uint64),
                         sizes=np.asarray(sizes, dtype=np.uint64), labels=np.full(count, -1, dtype=np.int64),
                         meta_blob=np.zeros(0, dtype=np.uint8), meta_offsets=np.zeros(count + 1, dtype=np.uint64),
                         label_type="none")


def _check_capacity_rule(sizes: list[int], alignment: int, shard_size: int, shuffle: bool, seed: int) -> None:
    """Every planned shard holds at most ``shard_size`` bytes (header region + aligned payloads)
    unless it holds one sample that alone is larger; each shard is greedily full (the next
    sample would not have fitted); every listed file is in exactly one shard, in pack order."""
    plan = make_plan(_listing_of_sizes(sizes), layout(alignment=alignment, shard_size=shard_size, shuffle=shuffle,
                                                      seed=seed))
    assert sorted(plan.order.tolist()) == list(range(len(sizes)))
    starts = plan.shard_starts.tolist()
    assert starts[0] == 0 and starts[-1] == len(sizes) and all(a < b for a, b in zip(starts, starts[1:]))
    data_offset = fmt.shard_data_offset(alignment)
    padded = [fmt.align_up(sizes[member], alignment) for member in plan.order.tolist()]
    for shard in range(plan.shard_count):
        first, end = starts[shard], starts[shard + 1]
        used = data_offset + sum(padded[first:end])
        assert used <= shard_size or end - first == 1, (shard, used, shard_size)
        if end < len(sizes):  # greedy: the sample that starts the next shard would not have fitted
            assert used + padded[end] > shard_size, (shard, used, padded[end], shard_size)


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 48 << 10), max_size=120), alignment=st.sampled_from([1, 64, 512, 4096]),
       shard_size=st.integers(4096, 96 << 10), shuffle=st.booleans(), seed=st.integers(0, (1 << 64) - 1))
def test_every_shard_is_within_the_target_unless_one_sample_is_larger(sizes: list[int], alignment: int,
                                                                      shard_size: int, shuffle: bool,
                                                                      seed: int) -> None:
    _check_capacity_rule(sizes, alignment, shard_size, shuffle, seed)


@pytest.mark.parametrize("broken", ["capacity-without-the-header", "close-one-early"])
def test_the_capacity_property_catches_a_broken_cut(broken: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the cut (the header region forgotten; a shard closed before it is full) and the
    property fails on a plain case: it can fail, so its passing means something."""
    import packer.writer.plan as plan_module

    honest = plan_module.plan_shards

    def forgets_the_header(sizes: np.ndarray, alignment: int, shard_size: int) -> np.ndarray:
        return honest(sizes, alignment, shard_size + fmt.shard_data_offset(alignment))

    def closes_early(sizes: np.ndarray, alignment: int, shard_size: int) -> np.ndarray:
        starts = honest(sizes, alignment, shard_size).tolist()
        cut = [0] + [max(b - 1, a + 1) if b - a > 1 else b for a, b in zip(starts, starts[1:])]
        return np.asarray(sorted(set(cut) | {len(sizes)}), dtype=np.int64)

    case = dict(sizes=[4096] * 10, alignment=4096, shard_size=16 << 10, shuffle=True, seed=3)
    _check_capacity_rule(**case)
    monkeypatch.setattr(plan_module, "plan_shards",
                        forgets_the_header if broken == "capacity-without-the-header" else closes_early)
    with pytest.raises(AssertionError):
        _check_capacity_rule(**case)


# --- the plan's rejection of duplicates (--reject-duplicates: every door plans through make_plan) -----


def test_make_plan_rejects_duplicate_content_only_when_asked(tmp_path: Path) -> None:
    import shutil

    src = png_folder(tmp_path / "src", 4)
    shutil.copyfile(src / "dog" / "000.png", src / "cat" / "copy.png")
    listing = list_source(src)
    assert len(listing) == 5
    plain = make_plan(listing, layout(shard_size=8192))
    assert len(plain.listing) == 5 and plain.listing.rejected == []
    checked = BuildSettings(layout=LayoutSettings(shard_size=8192), checks=CheckSettings(reject_duplicates=True))
    plan = make_plan(listing, checked)
    assert len(plan.listing) == 4
    assert sorted(plan.order.tolist()) == [0, 1, 2, 3]
    assert [(r.key, r.reason) for r in plan.listing.rejected] == [("dog/000.png", "duplicate-content")]
    assert plan.shard_starts[-1] == 4
    # files over --max-file-size are not read (packing rejects them): no duplicate is found among them
    small = BuildSettings(layout=LayoutSettings(shard_size=8192),
                          checks=CheckSettings(reject_duplicates=True, max_file_size=64))
    assert len(make_plan(listing, small).listing) == 5


def test_make_plan_rejects_what_the_dataset_appended_to_holds(tmp_path: Path) -> None:
    import shutil

    from packer.dataset import open_dataset

    old_src = png_folder(tmp_path / "old", 2)
    build(old_src, tmp_path / "ds", settings=BuildSettings(codec="passthrough"), run=RunOptions(workers=1))
    new_src = png_folder(tmp_path / "new", 3, seed=5)
    shutil.copyfile(old_src / "cat" / "001.png", new_src / "cat" / "again.png")
    checked = BuildSettings(layout=LayoutSettings(shard_size=8192), checks=CheckSettings(reject_duplicates=True))
    with open_dataset(tmp_path / "ds") as existing:
        plan = make_plan(list_source(new_src), checked, existing=existing)
    assert [(r.key, r.reason) for r in plan.listing.rejected] == [("cat/again.png", "duplicate-content")]
    assert len(plan.listing) == 3
    assert len(make_plan(list_source(new_src), checked).listing) == 4  # without the dataset: no duplicate


def test_a_plan_saved_with_flat_options_takes_the_source_settings_given(tmp_path: Path) -> None:
    path, src = _saved_plan(tmp_path)
    _rewrite_header(path, lambda h: (h.pop("settings"), h.update(options={"seed": 7, "shard_size": 8192},
                                                                  kind="manifest")))
    loaded = load_plan(path, src, source=SourceSettings(label_field="cls"))
    assert loaded.settings.layout.seed == 7 and loaded.settings.layout.shard_size == 8192
    assert loaded.settings.source.label_field == "cls" and loaded.settings.source.kind == "manifest"
    assert load_plan(path, src).settings.source.label_field == "label"


def test_a_saved_plan_keeps_class_order_and_probes_only_of_their_types(tmp_path: Path) -> None:
    path, src = _saved_plan(tmp_path, source_probes={"dog/000.png": 5})
    _rewrite_header(path, lambda h: h.update(class_order="sorted"))
    loaded = load_plan(path, src)
    assert loaded.listing.class_order == "sorted" and loaded.source_probes == {"dog/000.png": 5}
    _rewrite_header(path, lambda h: h.update(class_order=3, source_probes=["dog/000.png"]))
    loaded = load_plan(path, src)
    assert loaded.listing.class_order is None and loaded.source_probes is None


def test_an_unusable_plan_names_its_file(tmp_path: Path) -> None:
    path, src = _saved_plan(tmp_path)
    _rewrite_header(path, lambda h: h.update(rejected=[{"key": "k"}]))  # a TypeError building a Rejection
    with pytest.raises(BuildError) as caught:
        load_plan(path, src)
    assert caught.value.message.startswith("the saved build plan is unusable (TypeError(")
    assert caught.value.path == str(path)


def test_make_plan_keeps_the_source_probes_given(tmp_path: Path) -> None:
    listing = list_source(png_folder(tmp_path / "src", 2))
    assert make_plan(listing, layout()).source_probes is None
    assert make_plan(listing, layout(), source_probes={"dog/000.png": 9}).source_probes == {"dog/000.png": 9}
