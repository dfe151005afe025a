"""What a build commits (packer/writer/records.py, commit.py): shard records and when they are
trusted, the manifest's shard entries, the build report and summary, overwrite and finish.

Builds run with workers=1: packing then happens in this process, where mutmut sees it."""

from __future__ import annotations
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from packer import __version__
from packer import format as fmt
from packer.dataset import open_dataset, open_index
from packer.errors import BuildError, EmptySourceError, IndexMismatchError
from packer.sources.listing import Rejection
from packer.sources import SourceSettings
from packer.writer import BuildSettings, LayoutSettings, RunOptions, build, finish
from packer.writer.commit import _report_lines, record_empty_build
from packer.writer.plan import load_plan
from packer.writer.records import RECORD_COLUMNS, read_record, record_path, write_record
from packer.writer.staging import PLAN_NAME, STAGING_DIR
from packer import CheckSettings, LabelSettings

from helpers import TWO_SHARDS, index_columns, png_bytes, png_folder
from test_plan import _png_bytes


# --- build: atomic, records, commit, plan ---------------------------------------------------------


def test_records_round_trip_and_distrust(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    (out / STAGING_DIR / "done").mkdir(parents=True)
    assert record_path(out, 7) == out / STAGING_DIR / "done" / "shard-00007.pkr"
    rows = {"source": [3, 1], "offset": [4096, 8192], "size": [100, 200], "checksum": [2**64 - 1, 5],
            "width": [640, 2**32 - 1], "height": [480, 1], "channels": [3, 1], "image_format": [1, 2]}
    name = fmt.shard_file_name(7, 0x1234)  # records trust only paths that are shard names
    shard = out / name
    shard.parent.mkdir()
    shard.write_bytes(bytes(12288))
    header = {"plan": fmt.checksum_hex(42), "sample_count": 2, "path": name, "size": 12288, "rejected": []}
    path = record_path(out, 7)
    write_record(path, header, rows)
    found = read_record(path, 42, out)
    assert found is not None
    got_header, columns = found
    assert got_header == header
    assert set(columns) == set(RECORD_COLUMNS)
    for name in RECORD_COLUMNS:
        assert columns[name].tolist() == rows[name], name
    assert {name: columns[name].dtype.str for name in RECORD_COLUMNS} == {
        "source": "<u8", "offset": "<u8", "size": "<u8", "checksum": "<u8", "width": "<u4", "height": "<u4",
        "channels": "|u1", "image_format": "|u1"}
    assert read_record(path, 43, out) is None, "a record of another plan is not trusted"
    assert read_record(record_path(out, 8), 42, out) is None, "no record"
    shard.unlink()
    assert read_record(path, 42, out) is None, "its shard file is gone"
    empty = {"plan": fmt.checksum_hex(42), "sample_count": 0, "rejected": []}
    write_record(path, empty, {name: [] for name in RECORD_COLUMNS})
    assert read_record(path, 42, out)[0] == empty, "an all-rejected shard needs no file"
    path.write_bytes(path.read_bytes()[:-3])
    assert read_record(path, 42, out) is None, "a damaged record is redone"
    path.write_bytes(b"PKPLAN\0\0" + bytes(100))
    assert read_record(path, 42, out) is None


def test_finish_names_the_missing_shards(tmp_path: Path) -> None:
    src, out = png_folder(tmp_path / "src", 24), tmp_path / "ds"
    options = BuildSettings(layout=LayoutSettings(shard_size=8192, alignment=4096))  # one sample per shard: 24 planned shards
    build(src, out, options, RunOptions(workers=1, part=(0, 2)))
    plan = load_plan(out / STAGING_DIR / PLAN_NAME, src)
    assert plan.shard_count == 24
    with pytest.raises(BuildError) as caught:
        finish(out, src)
    odd = ", ".join(str(i) for i in range(1, 21, 2))
    assert caught.value.message == (f"12 of 24 planned shards are not packed yet (shards {odd} ...); "
                                    f"run the missing parts, or the build with --resume")
    build(src, out, options, RunOptions(workers=1, part=(1, 2)))
    for i in range(3, 24, 2):
        record_path(out, i).unlink()  # shard 1 alone is there: 11 missing, at most 10 shown
    with pytest.raises(BuildError) as caught:
        finish(out, src)
    assert caught.value.message == ("11 of 24 planned shards are not packed yet (shards 3, 5, 7, 9, 11, 13, 15, 17, "
                                    "19, 21 ...); run the missing parts, or the build with --resume")
    assert caught.value.path == str(out)
    build(src, out, options, RunOptions(workers=1, part=(1, 2)))
    for i in range(5, 24, 2):
        record_path(out, i).unlink()
    with pytest.raises(BuildError) as caught:
        finish(out, src)
    assert "(shards 5, 7, 9, 11, 13, 15, 17, 19, 21, 23);" in caught.value.message, "ten shown, no ..."


def test_a_build_where_everything_is_rejected_says_why(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(3):
        (src / "a" / f"{i}.png").write_bytes(b"text, not a png")
    (src / "a" / "empty.jpg").write_bytes(b"")
    with pytest.raises(EmptySourceError) as caught:
        build(src, tmp_path / "ds", BuildSettings(), RunOptions(workers=1))
    assert caught.value.message.startswith(
        "every one of the 4 listed source files was rejected; nothing to pack (4 rejected: 3 not-an-image (e.g. ")
    assert "1 empty-file (e.g. a/empty.jpg" in caught.value.message
    assert caught.value.message.endswith(f"every rejection is in {tmp_path / 'ds' / fmt.REPORT_NAME}")
    assert caught.value.path == str(tmp_path / "ds")
    assert not (tmp_path / "ds" / fmt.MANIFEST_NAME).exists()


def test_build_summary_report_and_result_are_exact(tmp_path: Path) -> None:
    src, out = png_folder(tmp_path / "src", 6, bad=2), tmp_path / "ds"
    (src / "stray.png").write_bytes(b"a file outside every class folder: rejected when listed")
    settings = BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=12288, seed=3))
    result = build(src, out, settings, RunOptions(workers=1))
    with open_index(out) as ds:
        manifest = ds.manifest
        sizes = ds.index.size
        assert result.sample_count == len(ds) == 6
        assert result.shard_count == len(manifest.shards)
        assert result.payload_bytes == int(sizes.sum())
        assert result.total_bytes == sum(s.size for s in manifest.shards) + manifest.index.size
        keys = [ds.key(i) for i in range(len(ds))]
    plan = load_plan(out / STAGING_DIR / PLAN_NAME, src) if (out / STAGING_DIR).exists() else None
    assert plan is None, "the staging folder is removed after the commit"
    from packer import __version__

    probes = {path.relative_to(src).as_posix(): path.stat().st_size  # every listed file (<= 16 of them)
              for path in sorted((src / "cat").iterdir()) + sorted((src / "dog").iterdir())}
    summary = {"settings": settings.detected("folder").to_json(), "source_files": 9, "packed": 6, "rejected": 3,
               "planned_shards": result.summary["planned_shards"], "tool": f"packer {__version__}",
               "label_type": "str", "source": "src", "source_probes": probes,
               "classes_checksum": fmt.class_list_checksum(("cat", "dog"))}
    assert result.summary == summary and manifest.build == summary
    assert summary["planned_shards"] >= result.shard_count >= 2
    lines = [json.loads(line) for line in (out / fmt.REPORT_NAME).read_text().splitlines()]
    assert lines[0] == {"type": "summary", **summary}
    assert [(r["type"], r["key"], r["reason"]) for r in lines[1:]] == [
        ("rejected", "dog/bad0.png", "not-an-image"), ("rejected", "dog/bad1.png", "not-an-image"),
        ("rejected", "stray.png", "not-in-class-folder")]
    assert sorted(r.key for r in result.rejected) == ["dog/bad0.png", "dog/bad1.png", "stray.png"]
    assert sorted(keys) == sorted(f"{'cat' if i % 2 else 'dog'}/{i:03d}.png" for i in range(6))
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [fmt.MANIFEST_NAME, fmt.REPORT_NAME, "shards", manifest.index.path, ".packer.lock"])


def test_overwrite_removes_what_no_manifest_names(tmp_path: Path) -> None:
    src, out = png_folder(tmp_path / "src", 6), tmp_path / "ds"
    build(src, out, BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=12288)), RunOptions(workers=1))
    stale = [out / ".manifest.json.999.tmp", out / ".build-report.jsonl.999.tmp",
             out / "shards" / "shard-00099-00000000000000ff.pks", out / "index-00000000000000ff.pki"]
    for path in stale:
        path.write_bytes(b"x")
    keep = out / "shards" / "notes.txt"
    keep.write_bytes(b"mine")
    build(src, out, BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=12288, seed=5)), RunOptions(workers=1, overwrite=True))
    assert not any(p.exists() for p in stale)
    assert keep.exists(), "only packer's own file names are removed"
    with open_index(out) as ds:
        listed = {s.path for s in ds.manifest.shards}
        assert {p.relative_to(out).as_posix() for p in (out / "shards").glob("*.pks")} == listed
        assert [p.name for p in out.glob("index-*.pki")] == [ds.manifest.index.path]


# --- format: the index table and the column-file writer -------------------------------------------


def test_report_lines_are_canonical_json(tmp_path: Path) -> None:
    src, out = png_folder(tmp_path / "src", 4), tmp_path / "ds"
    (src / "cat" / "café.png").write_bytes(b"not a png")
    result = build(src, out, BuildSettings(), RunOptions(workers=1))
    assert result.path == out
    lines = (out / fmt.REPORT_NAME).read_text(encoding="utf-8").splitlines()
    for line in lines:  # sorted keys, UTF-8 as is (no \\u escapes)
        assert line == json.dumps(json.loads(line), sort_keys=True, ensure_ascii=False)
    assert '"key": "cat/café.png"' in lines[1]


def test_commit_refuses_a_bad_index_and_writes_nothing(tmp_path: Path) -> None:
    from packer.writer.commit import commit_dataset

    out = tmp_path / "ds"
    out.mkdir()
    with pytest.raises(IndexMismatchError) as caught:
        commit_dataset(out, index_columns(), TWO_SHARDS[:1], classes=(), codec={"name": "passthrough"},
                       alignment=4096, build_info={}, rejected=[], history=[])
    assert caught.value.path == "(new index)"
    assert list(out.iterdir()) == []


def test_commit_io_errors_are_build_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    import packer.writer.commit as commit_module

    src, out = png_folder(tmp_path / "src", 4), tmp_path / "ds"
    real = commit_module.write_atomic

    def full_disk(path: Path, pieces: Any) -> int:
        if path.name == fmt.MANIFEST_NAME:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, pieces)

    monkeypatch.setattr(commit_module, "write_atomic", full_disk)
    with pytest.raises(BuildError) as caught:
        build(src, out, BuildSettings(), RunOptions(workers=1))
    assert caught.value.message == ("the disk is full while writing the index and manifest; free space and run "
                                    "again with --resume")
    assert caught.value.path == str(out)
    assert not (out / fmt.MANIFEST_NAME).exists()


def test_codec_notes_are_summed_over_shards(tmp_path: Path) -> None:
    src = tmp_path / "src"
    rng = np.random.default_rng(1)
    for i in range(5):
        (src / "a").mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (64, 48, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(src / "a" / f"{i}.jpg", quality=90, progressive=(i == 4))
    (src / "a" / "p.png").write_bytes((src / "a" / "0.jpg").read_bytes() and _png_bytes())
    result = build(src, tmp_path / "ds", BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=8192), codec="tiled"), RunOptions(workers=1))
    assert result.shard_count >= 3
    assert result.summary["codec_notes"] == {"kept: not a JPEG (png)": 1, "kept: progressive": 1, "tiled": 4}
    assert list(result.summary["codec_notes"]) == sorted(result.summary["codec_notes"])


# --- build/commit: the report of an empty build, the recorded pixel limit -------------------------


def test_an_empty_build_reports_every_rejection_and_leaves_no_staging(tmp_path: Path) -> None:
    import packer
    from packer._internal.imageinfo import DEFAULT_MAX_PIXELS

    bad = tmp_path / "bad" / "a"
    bad.mkdir(parents=True)
    for i in (1, 0):
        (bad / f"{i}.png").write_bytes(b"nope")
    out = tmp_path / "out"
    with pytest.raises(EmptySourceError) as caught:
        build(tmp_path / "bad", out, BuildSettings(), RunOptions(workers=1))
    suffix = f"; every rejection is in {out / fmt.REPORT_NAME}"
    assert caught.value.message.endswith(suffix) and str(caught.value).endswith(suffix)
    assert caught.value.args == (str(caught.value),)
    lines = [json.loads(line) for line in (out / fmt.REPORT_NAME).read_text().splitlines()]
    summary = lines[0]
    assert summary["error"] + suffix == str(caught.value)
    assert {k: v for k, v in summary.items() if k not in ("error", "settings")} == {
        "type": "summary", "packed": 0, "rejected": 2, "tool": f"packer {packer.__version__}"}
    assert summary["settings"]["source"]["kind"] == "folder"  # detected before the listing found nothing
    assert summary["settings"]["checks"]["max_pixels"] == DEFAULT_MAX_PIXELS
    assert summary["settings"]["checks"]["validate"] == "header"
    assert [(line["type"], line["key"], line["reason"]) for line in lines[1:]] == [
        ("rejected", "a/0.png", "not-an-image"), ("rejected", "a/1.png", "not-an-image")]
    assert sorted(p.name for p in out.iterdir()) == [fmt.REPORT_NAME]  # no staging folder left to --resume
    # over an existing dataset (--overwrite), the dataset keeps its own report
    good = tmp_path / "good"
    build(png_folder(tmp_path / "src", 2), good, BuildSettings(), RunOptions(workers=1))
    report = (good / fmt.REPORT_NAME).read_bytes()
    with pytest.raises(EmptySourceError) as caught:
        build(tmp_path / "bad", good, BuildSettings(), RunOptions(workers=1, overwrite=True))
    assert "every rejection is in" not in caught.value.message
    assert (good / fmt.REPORT_NAME).read_bytes() == report


def test_a_folder_in_place_of_the_report_is_refused_before_the_commit(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / fmt.REPORT_NAME).mkdir(parents=True)
    with pytest.raises(BuildError) as caught:
        build(png_folder(tmp_path / "src", 2), out, BuildSettings(), RunOptions(workers=1))
    assert (caught.value.message, caught.value.path) == (
        f"{fmt.REPORT_NAME} is a folder, not a regular file; remove it and run again", str(out / fmt.REPORT_NAME))
    assert not (out / fmt.MANIFEST_NAME).exists()


def test_the_recorded_pixel_limit_is_the_largest_above_the_default(tmp_path: Path) -> None:
    from packer.writer.commit import recorded_max_pixels
    from packer._internal.imageinfo import DEFAULT_MAX_PIXELS

    big = DEFAULT_MAX_PIXELS + 5
    assert recorded_max_pixels() is None and recorded_max_pixels(None) is None
    assert recorded_max_pixels(DEFAULT_MAX_PIXELS) is None and recorded_max_pixels(100, None) is None
    assert recorded_max_pixels(big) == big and recorded_max_pixels(100, big, None, 7) == big
    src = png_folder(tmp_path / "src", 2)
    for limit, recorded in [(big, big), (DEFAULT_MAX_PIXELS, None), (1000, None)]:
        out = tmp_path / f"ds-{limit}"
        build(src, out, BuildSettings(checks=CheckSettings(max_pixels=limit)), RunOptions(workers=1))
        with open_index(out) as index:
            assert index.manifest.max_pixels == recorded


def test_the_build_report_keeps_listing_warnings_and_non_ascii_keys(tmp_path: Path) -> None:
    from packer.classes import split_folder_warning

    src = tmp_path / "src"
    rng = np.random.default_rng(1)
    for split in ("train", "val"):
        (src / split).mkdir(parents=True)
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(src / split / "ok.png")
    (src / "val" / "ñandú.png").write_bytes(b"not an image")
    out = tmp_path / "ds"
    build(src, out, BuildSettings(), RunOptions(workers=1))
    text = (out / fmt.REPORT_NAME).read_text(encoding="utf-8")
    summary, rejected = (json.loads(line) for line in text.splitlines())
    assert summary["warnings"] == [split_folder_warning(["train", "val"])]
    assert rejected["key"] == "val/ñandú.png" and "val/ñandú.png" in text  # UTF-8 as is, not \\u escapes


# --- from test_writer_mutation_kills --------------------------------------------------------------


def side_file_folder(root: Path, count: int) -> Path:
    """a/NNN.png with NNN.mask.png (a grey image of another size) and NNN.txt (a caption)."""
    (root / "a").mkdir(parents=True)
    for i in range(count):
        (root / "a" / f"{i:03d}.png").write_bytes(png_bytes(i))
        (root / "a" / f"{i:03d}.mask.png").write_bytes(png_bytes(100 + i, (6 + i, 5), grey=True))
        (root / "a" / f"{i:03d}.txt").write_text(f"caption {i}\n", "utf-8")
    return root


FIELDS = ("caption=text@txt", "mask=image@mask.png")


@pytest.fixture(scope="module")
def field_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 5-sample build with a text field and an image field, one sample per shard."""
    base = tmp_path_factory.mktemp("fields")
    src = side_file_folder(base / "src", 5)
    build(src, base / "ds", BuildSettings(layout=LayoutSettings(alignment=4096, shuffle=False, shard_size=8192), labels=LabelSettings(fields=FIELDS)), RunOptions(workers=1))
    return src, base / "ds"


# --- commit: the manifest's field shard entries ---------------------------------------------------


def test_field_shard_entries_name_their_files_exactly(field_build: tuple[Path, Path]) -> None:
    src, out = field_build
    with open_dataset(out) as ds:
        spec = ds.field_spec("mask")
        assert len(ds) == 5 and len(ds.manifest.shards) == 5 and len(spec.shards) == 5
        for entries in (ds.manifest.shards, spec.shards):
            for number, entry in enumerate(entries):
                data = (out / entry.path).read_bytes()
                assert (entry.size, entry.checksum, entry.sample_count) == (len(data), fmt.checksum(data), 1)
                assert entry.number == number
        assert [s.path.startswith("shards/field-mask-") for s in spec.shards] == [True] * 5
        for i in range(5):
            stem = src / "a" / f"{i:03d}"
            assert ds.key(i) == f"a/{i:03d}.png"
            assert ds.field_bytes("mask", i).tobytes() == Path(f"{stem}.mask.png").read_bytes()
            with Image.open(f"{stem}.mask.png") as mask:
                assert (int(ds.index.field_columns[spec.image_column("width")][i]),
                        int(ds.index.field_columns[spec.image_column("height")][i])) == mask.size
            assert ds.field_value("caption", i) == f"caption {i}"


# --- commit: the build report ---------------------------------------------------------------------


def test_the_report_summary_is_strict_json() -> None:
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        _report_lines({"ratio": float("nan")}, [])
    assert _report_lines({"ratio": 0.5}, []) == b'{"ratio": 0.5, "type": "summary"}\n'


def test_report_keys_that_are_not_utf8_are_written_as_their_bytes() -> None:
    """A key holding a surrogate escape (a COCO ``file_name`` naming the file b"x\\xff.jpg") goes into
    the report as those bytes, sorted by them."""
    rejected = [Rejection("x\udcff.jpg", "bad-annotation", "m1"), Rejection("x\u00e9.jpg", "missing", "m2"),
                Rejection("a.jpg", "missing", "m3")]
    lines = _report_lines({"packed": 0}, rejected).split(b"\n")
    assert lines == [b'{"packed": 0, "type": "summary"}',
                     b'{"key": "a.jpg", "message": "m3", "reason": "missing", "type": "rejected"}',
                     '{"key": "x\u00e9.jpg", "message": "m2", "reason": "missing", "type": "rejected"}'.encode(),
                     b'{"key": "x\xff.jpg", "message": "m1", "reason": "bad-annotation", "type": "rejected"}', b""]


def test_an_empty_coco_build_reports_a_non_utf8_file_name(tmp_path: Path) -> None:
    root = tmp_path / "src"
    (root / "images").mkdir(parents=True)
    document = {"images": [{"id": 1, "file_name": "x\udcff.jpg", "width": 4, "height": 4},
                           {"id": 2, "file_name": "b.jpg", "width": 4, "height": 4}],
                "annotations": [{"id": 7, "image_id": 1, "category_id": 3, "bbox": [0, 0, -1, 1]},
                                {"id": 8, "image_id": 2, "category_id": 3, "bbox": [0, 0, 1, -1]}],
                "categories": [{"id": 3, "name": "cat"}]}
    annotations = root / "instances.json"
    annotations.write_text(json.dumps(document), "utf-8")  # "\udcff" stays a JSON escape
    out = tmp_path / "out"
    with pytest.raises(EmptySourceError):
        build(annotations, out, BuildSettings(source=SourceSettings(root=root / "images")), RunOptions(workers=1))
    lines = (out / fmt.REPORT_NAME).read_bytes().split(b"\n")
    assert len(lines) == 4 and lines[3] == b""
    keys = [json.loads(line.decode("utf-8", "surrogateescape"))["key"] for line in lines[1:3]]
    assert keys == ["b.jpg", "x\udcff.jpg"]
    assert b'"key": "x\xff.jpg"' in lines[2]


def test_an_empty_build_report_for_any_error(tmp_path: Path) -> None:
    """``record_empty_build`` takes any exception: no ``rejected`` means none, extra args are kept."""
    out = tmp_path / "out"
    out.mkdir()
    error = RuntimeError("nothing to pack", "detail")
    settings = BuildSettings(source=SourceSettings(kind="folder"), layout=LayoutSettings(seed=1))
    record_empty_build(out, error, settings)
    report = out / fmt.REPORT_NAME
    assert error.args == (f"nothing to pack; every rejection is in {report}", "detail")
    assert not hasattr(error, "message")
    assert [json.loads(line) for line in report.read_text("utf-8").splitlines()] == [
        {"type": "summary", "packed": 0, "rejected": 0, "error": "('nothing to pack', 'detail')",
         "settings": settings.to_json(), "tool": f"packer {__version__}"}]
    assert sorted(p.name for p in out.iterdir()) == [fmt.REPORT_NAME]


def test_commit_checks_the_declared_fields_columns(field_build: tuple[Path, Path], tmp_path: Path) -> None:
    from packer.writer.commit import commit_dataset
    from packer.errors import CorruptHeaderError

    _, out = field_build
    with open_dataset(out) as ds:
        manifest = ds.manifest
    rows, columns = fmt.parse_column_file((out / manifest.index.path).read_bytes(), fmt.INDEX_MAGIC)
    target = tmp_path / "copy"
    target.mkdir()
    options = dict(classes=manifest.classes, codec=manifest.codec, alignment=manifest.alignment, build_info={},
                   rejected=[], history=[], fields=manifest.fields)
    broken = {name: np.array(column) for name, column in columns.items() if name != "f_mask__width"}
    with pytest.raises(CorruptHeaderError) as caught:
        commit_dataset(target, broken, list(manifest.shards), **options)
    assert (caught.value.message, caught.value.path) == (
        "index (field 'mask') lacks required column 'f_mask__width'", "(new index)")
    assert list(target.iterdir()) == []
    (target / STAGING_DIR).mkdir()  # where a build stages the index
    result = commit_dataset(target, {name: np.array(column) for name, column in columns.items()},
                            list(manifest.shards), **options)
    assert result.sample_count == rows == 5
    assert sorted(p.name for p in target.iterdir()) == sorted([fmt.MANIFEST_NAME, fmt.REPORT_NAME, manifest.index.path])
    written = fmt.parse_manifest((target / fmt.MANIFEST_NAME).read_bytes())
    assert written.fields == manifest.fields and written.shards == manifest.shards


def test_source_probes_are_16_listed_files_spread_evenly(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(20):
        (src / "a" / f"{i:02d}.png").write_bytes(png_bytes(i, (4 + i % 3, 4)))
    result = build(src, tmp_path / "ds", BuildSettings(), RunOptions(workers=1))
    # np.linspace(0, 19, 16) truncated: i * 19 / 15 is a whole number only at i = 0 and 15
    rows = sorted({int(i * 19 / 15) for i in range(16)})
    assert len(rows) == 16
    assert result.summary["source_probes"] == {f"a/{r:02d}.png": (src / "a" / f"{r:02d}.png").stat().st_size
                                               for r in rows}


def test_finish_build_without_cleanup_keeps_staging_and_unreferenced_files(tmp_path: Path) -> None:
    from packer.writer.commit import finish_build
    from packer.writer.plan import load_plan
    from packer.writer.records import record_path
    from packer.writer.staging import PLAN_NAME

    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(3):
        (src / "a" / f"{i}.png").write_bytes(png_bytes(i))
    out = tmp_path / "ds"
    build(src, out, BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=8192)), RunOptions(workers=1, part=(0, 1)))
    stray = out / fmt.shard_file_name(99, 0xAB)  # "shards/shard-00099-....pks"
    stray.write_bytes(b"x")
    plan = load_plan(out / STAGING_DIR / PLAN_NAME, src)
    result = finish_build(plan, out, cleanup=False)
    assert result.sample_count == 3 and result.shard_count == 3
    assert stray.exists() and all(record_path(out, shard).is_file() for shard in range(3))
    with open_dataset(out, verify_checksums=True) as ds:
        assert sorted(ds.keys()) == ["a/0.png", "a/1.png", "a/2.png"]


# --- records: what a shard record must hold to be trusted -----------------------------------------


def test_a_record_is_trusted_only_with_a_well_formed_header(tmp_path: Path) -> None:
    from packer.writer.records import read_record, record_columns, record_path, write_record
    from packer.fields import FieldSpec

    out = tmp_path / "ds"
    (out / STAGING_DIR / "done").mkdir(parents=True)
    (out / fmt.SHARD_DIR).mkdir()
    shard, field_shard = fmt.shard_file_name(3, 0x12), fmt.field_shard_file_name("mask", 3, 0x34)
    (out / shard).write_bytes(bytes(8192))
    (out / field_shard).write_bytes(bytes(4096))
    mask = FieldSpec(name="mask", kind="image")
    columns = record_columns([mask])
    assert columns[8:] == tuple(f"mask__{part}" for part in ("offset", "size", "checksum", "format", "width",
                                                             "height", "channels"))
    rows = {name: [1] for name in columns}
    good = {"plan": fmt.checksum_hex(7), "sample_count": 1, "rejected": [], "path": shard, "size": 8192,
            "fields": {"mask": {"path": field_shard, "size": 4096, "checksum": fmt.checksum_hex(0x34)}}}
    path = record_path(out, 3)
    write_record(path, good, rows)
    found = read_record(path, 7, out)
    assert found is not None and found[0] == good
    assert {name: (found[1][name].tolist(), found[1][name].dtype.str) for name in columns[8:]} == {
        "mask__offset": ([1], "<u8"), "mask__size": ([1], "<u8"), "mask__checksum": ([1], "<u8"),
        "mask__format": ([1], "|u1"), "mask__width": ([1], "<u4"), "mask__height": ([1], "<u4"),
        "mask__channels": ([1], "|u1")}

    def field(**changes: Any) -> dict[str, Any]:
        return {"fields": {"mask": {**good["fields"]["mask"], **changes}}}

    for change in [{"rejected": "none"}, {"size": 8192.0}, {"path": "shards/other.pks"},
                   field(size=4096.0), field(size=4095), field(path="shards/x.pks"), {"fields": {"mask": ["x"]}},
                   {"fields": [good["fields"]["mask"]]}, field(path=fmt.field_shard_file_name("mask", 3, 0x35))]:
        write_record(path, {**good, **change}, rows)
        assert read_record(path, 7, out) is None, change
