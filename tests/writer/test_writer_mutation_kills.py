"""Mutation kill tests for packer/build/commit.py, records.py and plan.py: builds with declared fields.

Written after the declared fields (SPEC §14) landed: each pins down behaviour that a surviving
mutant of `scripts/mutate.py` changed. `tests/project/test_mutation_kills.py` holds the ones from before.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from packer import __version__
from packer import format as fmt
from packer.writer import BuildOptions, build
from packer.writer.commit import _report_lines, record_empty_build
from packer.sources.listing import Rejection
from packer.writer.staging import STAGING_DIR
from packer.dataset import open_dataset
from packer.errors import EmptySourceError

# Builds run with workers=1: packing then happens in this process, where mutmut sees it.


def png(seed: int, size: tuple[int, int] = (10, 14), grey: bool = False) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, size if grey else (*size, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def side_file_folder(root: Path, count: int) -> Path:
    """a/NNN.png with NNN.mask.png (a grey image of another size) and NNN.txt (a caption)."""
    (root / "a").mkdir(parents=True)
    for i in range(count):
        (root / "a" / f"{i:03d}.png").write_bytes(png(i))
        (root / "a" / f"{i:03d}.mask.png").write_bytes(png(100 + i, (6 + i, 5), grey=True))
        (root / "a" / f"{i:03d}.txt").write_text(f"caption {i}\n", "utf-8")
    return root


FIELDS = ("caption=text@txt", "mask=image@mask.png")


@pytest.fixture(scope="module")
def field_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 5-sample build with a text field and an image field, one sample per shard."""
    base = tmp_path_factory.mktemp("fields")
    src = side_file_folder(base / "src", 5)
    build(src, base / "ds", BuildOptions(fields=FIELDS, shuffle=False, shard_size=8192), workers=1)
    return src, base / "ds"


# --- commit: the manifest's field shard entries -----------------------------------------------------

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


# --- commit: the build report ------------------------------------------------------------------------

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
        build(annotations, out, BuildOptions(), root=root / "images", workers=1)
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
    record_empty_build(out, error, {"seed": 1}, source_kind="folder")
    report = out / fmt.REPORT_NAME
    assert error.args == (f"nothing to pack; every rejection is in {report}", "detail")
    assert not hasattr(error, "message")
    assert [json.loads(line) for line in report.read_text("utf-8").splitlines()] == [
        {"type": "summary", "packed": 0, "rejected": 0, "error": "('nothing to pack', 'detail')",
         "options": {"seed": 1}, "source_kind": "folder", "tool": f"packer {__version__}"}]
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


def test_append_refuses_a_source_with_declared_fields(tmp_path: Path) -> None:
    """A COCO source always declares fields; an append cannot store them (the dataset is left as it was)."""
    from packer.writer.append import append
    from packer.errors import BuildError

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "1.png").write_bytes(png(1))
    (tmp_path / "src" / "list.jsonl").write_text(json.dumps({"path": "1.png", "label": -1}) + "\n")
    out = tmp_path / "ds"
    build(tmp_path / "src" / "list.jsonl", out, BuildOptions(), workers=1)
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (tmp_path / "coco").mkdir()
    (tmp_path / "coco" / "x.png").write_bytes(png(2))
    (tmp_path / "coco" / "instances.json").write_text(json.dumps(
        {"images": [{"id": 1, "file_name": "x.png", "width": 14, "height": 10}], "annotations": [],
         "categories": [{"id": 1, "name": "c"}]}))
    with pytest.raises(BuildError) as caught:
        append(out, tmp_path / "coco" / "instances.json", workers=1)
    assert caught.value.message == "append does not support datasets with declared fields yet"
    assert {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_source_probes_are_16_listed_files_spread_evenly(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(20):
        (src / "a" / f"{i:02d}.png").write_bytes(png(i, (4 + i % 3, 4)))
    result = build(src, tmp_path / "ds", BuildOptions(), workers=1)
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
        (src / "a" / f"{i}.png").write_bytes(png(i))
    out = tmp_path / "ds"
    build(src, out, BuildOptions(shard_size=8192), workers=1, part=(0, 1))
    stray = out / fmt.shard_file_name(99, 0xAB)  # "shards/shard-00099-....pks"
    stray.write_bytes(b"x")
    plan = load_plan(out / STAGING_DIR / PLAN_NAME, src)
    result = finish_build(plan, out, cleanup=False)
    assert result.sample_count == 3 and result.shard_count == 3
    assert stray.exists() and all(record_path(out, shard).is_file() for shard in range(3))
    with open_dataset(out, verify_checksums=True) as ds:
        assert sorted(ds.keys()) == ["a/0.png", "a/1.png", "a/2.png"]


# --- records: what a shard record must hold to be trusted ---------------------------------------------

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


# --- plan: options, the saved plan ------------------------------------------------------------------

def test_option_refusals_name_the_option() -> None:
    from packer.errors import OptionError

    with pytest.raises(OptionError) as caught:
        BuildOptions(fields=(3,))
    assert caught.value.message == ("a field is declared by a --field string, a FieldSpec or a declaration "
                                    "object, got 3")
    with pytest.raises(OptionError) as caught:
        BuildOptions(normalize_formats="yes").check()
    assert caught.value.message == "normalize_formats must be True or False, got 'yes'"


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
    (root / "images" / "a.png").write_bytes(png(1))
    document = {"images": [{"id": 1, "file_name": "x\udcff.jpg", "width": 4, "height": 4},
                           {"id": 2, "file_name": "a.png", "width": 14, "height": 10}],
                "annotations": [{"id": 7, "image_id": 1, "category_id": 3, "bbox": [0, 0, -1, 1]}],
                "categories": [{"id": 3, "name": "caf\u00e9"}]}
    annotations = root / "instances.json"
    annotations.write_text(json.dumps(document), "utf-8")
    listing = list_source(annotations, SourceOptions(root=root / "images"))
    assert [r.key for r in listing.rejected] == ["x\udcff.jpg"]
    plan = make_plan(listing, BuildOptions())
    save_plan(plan, tmp_path / "plan.pkp")
    loaded = load_plan(tmp_path / "plan.pkp", root / "images")
    assert [r.to_json() for r in loaded.listing.rejected] == [r.to_json() for r in listing.rejected]
    assert loaded.listing.fields.specs == listing.fields.specs  # the category names, non-ASCII
    result = build(annotations, tmp_path / "ds", BuildOptions(), root=root / "images", workers=1)
    assert result.sample_count == 1 and [r.key for r in result.rejected] == ["x\udcff.jpg"]
    lines = (tmp_path / "ds" / fmt.REPORT_NAME).read_bytes().split(b"\n")
    assert len(lines) == 3 and lines[1].startswith(b'{"key": "x\xff.jpg", "message": "annotation 7: ')
