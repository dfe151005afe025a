"""verify on datasets with declared fields (formats/SPEC.md §14): image fields' shards get the main
shards' checks, value fields the checks ``open_index`` leaves; every problem names the field."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packer.verify as verify_module
from packer import format as fmt
from packer.writer import BuildOptions, build
from packer.dataset import open_index
from packer.verify import PROBLEM_KINDS, verify
from helpers import FIELDS, make_field_source
from helpers import rewrite_index

FLAGGED = (*FIELDS, "flag=bool", "flags=bool[N]")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 samples in 2+ shards with every field kind, two bool fields among them."""
    root = tmp_path_factory.mktemp("verify-fields")
    manifest = make_field_source(root / "src")
    rows = [json.loads(line) for line in manifest.read_text("utf-8").splitlines()]
    for i, row in enumerate(rows):
        row["flag"], row["flags"] = bool(i % 2), [True, False][: i % 3]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    build(manifest, root / "ds", BuildOptions(fields=FLAGGED, shard_size=3 * 8192, seed=3), workers=1,
          progress=False)
    return root / "ds"


@pytest.fixture
def dataset(base: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(base, tmp_path / "ds"))


def field_shard(folder: Path, name: str, shard: int) -> Path:
    with open_index(folder) as index:
        return folder / index.field_spec(name).shards[shard].path


def field_payload(folder: Path, name: str, sample: int) -> tuple[Path, int, int]:
    """(field shard file, offset, size) of ``sample``'s payload of image field ``name``."""
    with open_index(folder) as index:
        spec = index.field_spec(name)
        columns = index.index.field_columns
        return (folder / spec.shards[index.shard_of(sample)].path, int(columns[spec.image_column("offset")][sample]),
                int(columns[spec.image_column("size")][sample]))


def xor_byte(path: Path, offset: int, mask: int = 0xFF) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ mask]))




def kinds(report: Any) -> list[tuple[str, str | None]]:
    return [(p.kind, p.field) for p in report.problems]


# --- intact -----------------------------------------------------------------------------------

@pytest.mark.parametrize("decode", [False, True])
def test_intact_dataset_with_fields_verifies(base: Path, decode: bool) -> None:
    report = verify(base, decode=decode, progress=False, workers=1)
    assert report.ok, report.problems
    with open_index(base) as index:
        mask_shards = index.field_spec("mask").shards
        main_bytes = sum(s.size for s in index.manifest.shards)
    assert report.samples_checked == report.samples == 8 and report.shards_checked == report.shards
    assert set(report.fields) == {"boxes", "tags", "caption", "depth", "mask", "flag", "flags"}
    mask = report.fields["mask"]
    assert mask == {"kind": "image", "samples_checked": 8, "problems": 0, "shards": len(mask_shards),
                    "shards_checked": len(mask_shards), "bytes_read": sum(s.size for s in mask_shards)}
    assert report.bytes_read == main_bytes + mask["bytes_read"]  # every byte of both kinds of shard, once
    assert report.fields["caption"] == {"kind": "text", "samples_checked": 8, "problems": 0}
    assert json.loads(json.dumps(report.to_json()))["fields"]["tags"]["kind"] == "classes"


def test_workers_check_field_shards_in_parallel_with_the_same_report(dataset: Path) -> None:
    path, offset, _ = field_payload(dataset, "mask", 5)
    xor_byte(path, offset + 7)
    one = verify(dataset, progress=False, workers=1)
    two = verify(dataset, progress=False, workers=3)
    assert [p.to_json() for p in one.problems] == [p.to_json() for p in two.problems]
    assert one.fields == two.fields and one.bytes_read == two.bytes_read


# --- image field shards ---------------------------------------------------------------------------

def test_a_damaged_field_payload_names_the_sample_field_and_file(dataset: Path) -> None:
    path, offset, size = field_payload(dataset, "mask", 3)
    xor_byte(path, offset + size // 2)
    report = verify(dataset, progress=False, workers=1)
    assert not report.ok and kinds(report) == [("checksum", "mask"), ("shard-checksum", "mask")]
    problem = report.problems[0]
    with open_index(dataset) as index:
        key, shard = index.key(3), index.shard_of(3)
    assert (problem.sample, problem.key, problem.shard) == (3, key, shard)
    assert problem.path == str(path.relative_to(dataset)) and problem.path.startswith("shards/field-mask-")
    assert f"shard {shard}, field 'mask', sample 3 ({key})" in str(problem)
    assert report.damaged_samples == [3] and report.samples_checked == 8  # the main shards are intact
    assert report.fields["mask"]["problems"] == 2
    assert report.to_json()["problems"][0]["field"] == "mask"


def test_the_last_payload_byte_of_a_field_shard_is_checked(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small chunks cut field payloads too: the streaming hash covers them."""
    monkeypatch.setattr(verify_module, "CHUNK_SIZE", 1000)
    with open_index(dataset) as index:
        last = index.shard_range(0)[1] - 1
    path, offset, size = field_payload(dataset, "mask", last)
    xor_byte(path, offset + size - 1)
    report = verify(dataset, progress=False, workers=1)
    assert report.damaged_samples == [last] and ("checksum", "mask") in kinds(report)


def test_nonzero_padding_after_the_last_field_payload(dataset: Path) -> None:
    with open_index(dataset) as index:
        last = index.shard_range(0)[1] - 1
    path, offset, size = field_payload(dataset, "mask", last)
    assert (offset + size) % 4096, "the last mask needs padding after it"
    assert path.stat().st_size == fmt.align_up(offset + size, 4096)
    xor_byte(path, path.stat().st_size - 1, 0x01)  # the file's very last byte
    report = verify(dataset, progress=False, workers=1)
    assert kinds(report) == [("padding", "mask"), ("shard-checksum", "mask")]
    assert report.problems[0].sample == last and "padding" in report.problems[0].message


def test_truncated_field_shard(dataset: Path) -> None:
    path = field_shard(dataset, "mask", 1)
    with open_index(dataset) as index:
        first, end = index.shard_range(1)
    _, offset, _ = field_payload(dataset, "mask", first + 1)
    os.truncate(path, offset + 5)  # inside the shard's second mask
    report = verify(dataset, progress=False, workers=1)
    assert kinds(report) == [("size", "mask"), ("truncated", "mask")]
    assert "truncated" in report.problems[0].message
    assert report.problems[1].sample_range == (first + 1, end) and report.problems[1].shard == 1
    assert report.damaged_samples == list(range(first + 1, end))
    assert report.fields["mask"]["samples_checked"] == 8 - (end - first - 1)


def test_missing_field_shard(dataset: Path) -> None:
    path = field_shard(dataset, "mask", 0)
    path.unlink()
    with open_index(dataset) as index:
        first, end = index.shard_range(0)
    report = verify(dataset, progress=False, workers=1)
    [problem] = report.problems
    assert (problem.kind, problem.field, problem.sample_range) == ("missing", "mask", (first, end))
    assert problem.path == str(path.relative_to(dataset)) and "missing" in problem.message


@pytest.mark.parametrize("position, message", [(24, "sample_count"), (50, "reserved header bytes")])
def test_field_shard_header_is_checked_against_the_manifest(dataset: Path, position: int, message: str) -> None:
    xor_byte(field_shard(dataset, "mask", 1), position, 0x07)
    report = verify(dataset, progress=False, workers=1)
    assert kinds(report) == [("header", "mask"), ("shard-checksum", "mask")]
    assert report.problems[0].shard == 1 and message in report.problems[0].message


def test_decode_checks_field_images_as_stored(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With --decode a mask whose bytes hash right but whose size disagrees with the index is named.

    The payload and its checksum are both what was written; only the index's width is wrong, so
    the checksum passes and only decoding can tell."""
    def change(columns: dict[str, np.ndarray]) -> None:
        columns["f_mask__width"][2] += 1

    rewrite_index(dataset, change)
    assert verify(dataset, progress=False, workers=1).ok  # the bytes are what was packed
    report = verify(dataset, decode=True, progress=False, workers=1)
    [problem] = report.problems
    assert (problem.kind, problem.field, problem.sample) == ("decode", "mask", 2)
    assert "the index says" in problem.message and problem.path.startswith("shards/field-mask-")


# --- value fields in the index ----------------------------------------------------------------------

def _caption_span(columns: dict[str, np.ndarray], sample: int) -> tuple[int, int]:
    offsets = columns["f_caption__offsets"]
    return int(offsets[sample]), int(offsets[sample + 1])


def test_a_caption_that_is_not_utf8_is_named(dataset: Path) -> None:
    def change(columns: dict[str, np.ndarray]) -> None:
        start, _ = _caption_span(columns, 4)
        columns["f_caption"][start + 2] = 0xFF

    rewrite_index(dataset, change)
    report = verify(dataset, progress=False, workers=1)
    assert not report.ok
    [problem] = report.problems
    with open_index(dataset) as index:
        key, shard, where = index.key(4), index.shard_of(4), index.manifest.index.path
    assert (problem.kind, problem.field, problem.sample, problem.key) == ("field", "caption", 4, key)
    assert problem.shard == shard and problem.path == where
    assert "field 'caption': text is not UTF-8 (invalid start byte at byte 2" in problem.message
    assert report.fields["caption"]["problems"] == 1 and report.damaged_samples == [4]


def test_a_character_cut_by_a_sample_boundary_is_found(dataset: Path) -> None:
    """The blob as a whole stays valid UTF-8: only the per-sample boundaries are wrong."""
    def change(columns: dict[str, np.ndarray]) -> None:
        _, end = _caption_span(columns, 2)
        assert bytes(columns["f_caption"][end - 3:end]) == "✓".encode()
        columns["f_caption__offsets"][3] -= 1  # sample 2 loses the ✓'s last byte, sample 3 starts with it

    rewrite_index(dataset, change)
    with open_index(dataset) as index:
        blob = index.index.field_columns["f_caption"].tobytes()
    blob.decode("utf-8")  # still valid as a whole
    report = verify(dataset, progress=False, workers=1)
    assert [(p.kind, p.field, p.sample) for p in report.problems] == [("field", "caption", 2), ("field", "caption", 3)]
    assert "unexpected end of data" in report.problems[0].message
    assert "invalid start byte at byte 0" in report.problems[1].message


def test_value_checks_work_in_bounded_groups(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups of one or two samples (every boundary a group boundary) find the same damage."""
    def change(columns: dict[str, np.ndarray]) -> None:
        columns["f_caption"][_caption_span(columns, 6)[0]] = 0xC3  # a lead byte, then ASCII
        offsets = columns["f_tags__offsets"]
        sample = next(i for i in range(8) if offsets[i + 1] - offsets[i] >= 16)
        ids = columns["f_tags"][int(offsets[sample]):int(offsets[sample + 1])].view("<i8")
        ids[:] = ids[::-1].copy()

    rewrite_index(dataset, change)
    expected = [(p.kind, p.field, p.sample) for p in verify(dataset, progress=False, workers=1).problems]
    monkeypatch.setattr(verify_module, "VALUE_CHUNK_BYTES", 1)
    report = verify(dataset, progress=False, workers=1)
    assert [(p.kind, p.field, p.sample) for p in report.problems] == expected
    assert [field for _, field, _ in expected] == ["tags", "caption"]  # in declaration order


def test_unsorted_or_repeated_class_ids_are_named(dataset: Path) -> None:
    chosen: list[int] = []

    def change(columns: dict[str, np.ndarray]) -> None:
        offsets = columns["f_tags__offsets"]
        ids = columns["f_tags"].view("<i8")
        sizes = np.diff(offsets.astype(np.int64)) // 8
        repeated, reversed_ = [int(i) for i in np.flatnonzero(sizes >= 2)[:2]]
        chosen.extend([repeated, reversed_])
        start = int(offsets[repeated]) // 8
        ids[start + 1] = ids[start]
        start = int(offsets[reversed_]) // 8
        ids[start:start + 2] = ids[start:start + 2][::-1].copy()

    rewrite_index(dataset, change)
    report = verify(dataset, progress=False, workers=1)
    assert [(p.kind, p.field, p.sample) for p in report.problems] == [("field", "tags", s) for s in sorted(chosen)]
    assert "not sorted ascending without repeats" in report.problems[0].message


def test_empty_class_sets_next_to_full_ones_are_fine(base: Path) -> None:
    """A sample's last id and the next sample's first may go down: only pairs inside a sample count."""
    with open_index(base) as index:
        sizes = np.diff(index.index.field_columns["f_tags__offsets"].astype(np.int64)) // 8
    assert 0 in sizes and sizes.max() >= 2
    assert verify(base, progress=False, workers=1).ok


@pytest.mark.parametrize("column", ["f_flag", "f_flags"])
def test_a_bool_byte_other_than_0_or_1(dataset: Path, column: str) -> None:
    target: list[int] = []

    def change(columns: dict[str, np.ndarray]) -> None:
        if column == "f_flag":
            target.append(5)
            columns["f_flag"][5] = 2
        else:
            offsets = columns["f_flags__offsets"]
            sample = next(i for i in range(8) if offsets[i + 1] > offsets[i])
            target.append(sample)
            columns["f_flags"][int(offsets[sample])] = 0x80

    rewrite_index(dataset, change)
    report = verify(dataset, progress=False, workers=1)
    [problem] = report.problems
    assert (problem.kind, problem.field, problem.sample) == ("field", column[2:], target[0])
    assert "other than 0 or 1" in problem.message


def test_many_bad_values_are_capped_but_counted(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def change(columns: dict[str, np.ndarray]) -> None:
        for sample in range(8):
            columns["f_caption"][_caption_span(columns, sample)[0]] = 0xFF

    rewrite_index(dataset, change)
    monkeypatch.setattr(verify_module, "MAX_VALUE_PROBLEMS", 3)
    report = verify(dataset, progress=False, workers=1)
    assert [p.sample for p in report.problems] == [0, 1, 2, None]
    assert "5 more sample(s)" in report.problems[-1].message and report.problems[-1].field == "caption"
    assert report.unlisted == 5 and report.damaged_sample_count == 8
    assert report.fields["caption"]["problems"] == 8
    assert all(p.kind in PROBLEM_KINDS for p in report.problems)


def test_class_ids_out_of_range_are_a_structure_problem(dataset: Path) -> None:
    """R49 is an open check: the index cannot be trusted, nothing else is read."""
    def change(columns: dict[str, np.ndarray]) -> None:
        columns["f_tags"].view("<i8")[0] = 99

    rewrite_index(dataset, change)
    report = verify(dataset, progress=False, workers=1)
    [problem] = report.problems
    assert problem.kind == "structure" and "class id 99" in problem.message and report.samples_checked == 0


# --- the command ------------------------------------------------------------------------------------

def _cli(*args: str) -> Any:
    from packer.cli import _register, cli

    _register()
    return CliRunner().invoke(cli, list(args))


def test_cli_names_field_damage_and_exits_1(dataset: Path) -> None:
    path, offset, _ = field_payload(dataset, "mask", 1)
    xor_byte(path, offset + 3)

    def change(columns: dict[str, np.ndarray]) -> None:
        columns["f_caption"][_caption_span(columns, 6)[0]] = 0xFF

    rewrite_index(dataset, change)
    result = _cli("verify", str(dataset), "-q", "--workers", "1")
    assert result.exit_code == 1, result.output
    assert "[checksum] shard" in result.output and "field 'mask', sample 1" in result.output
    assert "[field]" in result.output and "field 'caption', sample 6" in result.output
    as_json = _cli("verify", str(dataset), "--json", "-q", "--workers", "1")
    assert as_json.exit_code == 1
    document = json.loads(as_json.stdout)
    assert {(p["kind"], p["field"], p["sample"]) for p in document["problems"]} >= {
        ("checksum", "mask", 1), ("field", "caption", 6)}
    assert document["fields"]["mask"]["problems"] == 2 and document["fields"]["caption"]["problems"] == 1


def test_cli_ok_line_lists_the_fields(base: Path) -> None:
    result = _cli("verify", str(base), "-q", "--workers", "1")
    assert result.exit_code == 0, result.output
    assert "; fields boxes, tags, caption, depth, mask (8 images in" in result.output


# --- every byte of a field shard is covered -----------------------------------------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(position=st.floats(min_value=0, max_value=1, exclude_max=True), mask=st.integers(1, 255))
def test_any_flipped_field_shard_byte_is_found(base: Path, tmp_path_factory: pytest.TempPathFactory,
                                               position: float, mask: int) -> None:
    """A flip anywhere in an image field's shards fails verify, names the field, and a flip inside
    a payload names exactly that sample."""
    with open_index(base) as index:
        spec = index.field_spec("mask")
        sizes = [s.size for s in spec.shards]
        target = int(position * sum(sizes))
        shard = int(np.searchsorted(np.cumsum(sizes), target, side="right"))
        offset = target - sum(sizes[:shard])
        path = base / spec.shards[shard].path
        first, end = index.shard_range(shard)
        columns = index.index.field_columns
        starts = columns[spec.image_column("offset")][first:end].astype(np.int64)
        stops = starts + columns[spec.image_column("size")][first:end].astype(np.int64)
        inside = np.flatnonzero((starts <= offset) & (offset < stops))
    xor_byte(path, offset, mask)
    try:
        report = verify(base, progress=False, workers=1)
    finally:
        xor_byte(path, offset, mask)  # restore the shared dataset
    assert not report.ok and all(p.field == "mask" for p in report.problems)
    assert ("shard-checksum", "mask") in kinds(report)
    if len(inside):
        assert report.damaged_samples == [first + int(inside[0])]
