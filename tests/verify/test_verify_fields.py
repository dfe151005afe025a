"""verify on datasets with declared fields (formats/SPEC.md §14): image fields' shards get the main
shards' checks, value fields the checks ``open_index`` leaves; every problem names the field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import packer.verify as verify_module
from packer import format as fmt
from packer.dataset import open_index
from packer.decode import decode_as_stored, decode_image
from packer.errors import DecodeError
from packer.verify import PROBLEM_KINDS, verify
from packer.writer import BuildOptions, build

from helpers import FIELDS, make_field_source, rewrite_index

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
    build(manifest, root / "ds", BuildOptions(fields=FLAGGED, shard_size=3 * 8192, seed=3, alignment=4096), workers=1,
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


# --- from test_verify_mutation_kills --------------------------------------------------------------


_REAL_SCAN_SHARD = verify_module._scan_shard


# --- the value checks, against references written from their docstrings ---------------------------


CHUNKS = [1, 3, 8, 16, 24, 40, 1 << 20]


def reference_groups(offsets: list[int], limit: int) -> list[tuple[int, int]]:
    """The longest run of samples from ``first`` whose values span at most ``limit`` bytes, or
    the one sample ``first`` when it alone is larger; then the same from the run's end."""
    count, first, groups = len(offsets) - 1, 0, []
    while first < count:
        end = first + 1
        while end < count and offsets[end + 1] - offsets[first] <= limit:
            end += 1
        groups.append((first, end))
        first = end
    return groups


def random_offsets(rng: np.random.Generator, count: int, record: int, most: int) -> np.ndarray:
    sizes = rng.integers(0, most + 1, count) * record
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.uint64)


@pytest.mark.parametrize("offsets", [[0], [0, 0], [0, 5], [0, 0, 0, 4], [0, 8, 16, 24, 32], [0, 40, 41, 42, 90],
                                     [0, 3, 3, 3, 9, 9, 20, 21], [0, 16, 16, 40, 41]])
@pytest.mark.parametrize("limit", [1, 2, 8, 16, 24, 40, 100])
def test_sample_groups_are_the_longest_runs_within_the_limit(offsets: list[int], limit: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    array = np.array(offsets, dtype=np.uint64)
    assert list(verify_module._sample_groups(array, limit)) == reference_groups(offsets, limit)
    monkeypatch.setattr(verify_module, "VALUE_CHUNK_BYTES", limit)  # the default bound
    assert list(verify_module._sample_groups(array)) == reference_groups(offsets, limit)


def test_sample_groups_default_to_value_chunk_bytes() -> None:
    """With the real bound, a few hundred bytes of values make one group, not one per sample."""
    offsets = np.array([0, 100, 100, 250, 400], dtype=np.uint64)
    assert list(verify_module._sample_groups(offsets)) == [(0, 4)]
    limit = verify_module.VALUE_CHUNK_BYTES
    offsets = np.array([0, limit, limit, limit + 1, 3 * limit], dtype=np.uint64)
    assert list(verify_module._sample_groups(offsets)) == [(0, 2), (2, 3), (3, 4)]  # the empty sample joins the first
    assert list(verify_module._sample_groups(offsets)) == reference_groups(offsets.tolist(), limit)


def reference_bad_text(blob: bytes, offsets: list[int]) -> list[tuple[int, str]]:
    found = []
    for sample in range(len(offsets) - 1):
        try:
            blob[offsets[sample]:offsets[sample + 1]].decode("utf-8")
        except UnicodeDecodeError as exc:
            found.append((sample, f"{exc.reason} at byte {exc.start} of its {len(exc.object)}"))
    return found


def _text_cases() -> list[tuple[bytes, list[int]]]:
    check = "✓".encode()  # e2 9c 93
    cases = [
        (check, [0, 2, 3]),                         # two samples, the second starts inside the character
        (b"ab" + check, [0, 3, 5]),                 # the same after ASCII
        (check + check, [0, 3, 4, 6]),              # a character cut in a later sample
        (b"", [0, 0, 0]),
        (b"abc", [0, 1, 1, 3]),
        (b"\xff" + b"ok", [0, 1, 3]),
        (b"ok" + check + b"\xc3", [0, 2, 5, 6]),    # a lead byte at the very end
    ]
    rng = np.random.default_rng(7)
    pieces = ["a", "é", "✓", "𝄞", "xy", ""]
    for _ in range(12):
        texts = ["".join(rng.choice(pieces, rng.integers(0, 4))) for _ in range(int(rng.integers(1, 9)))]
        blob = bytearray("".join(texts).encode())
        offsets = np.concatenate([[0], np.cumsum([len(t.encode()) for t in texts])]).tolist()
        if len(offsets) > 2 and rng.random() < 0.6:  # move an inner boundary by one byte
            k = int(rng.integers(1, len(offsets) - 1))
            offsets[k] = max(offsets[k - 1], min(offsets[k + 1], offsets[k] + int(rng.choice([-1, 1]))))
        if blob and rng.random() < 0.5:
            blob[int(rng.integers(0, len(blob)))] = int(rng.choice([0xFF, 0x80, 0xC3]))
        cases.append((bytes(blob), offsets))
    return cases


@pytest.mark.parametrize("chunk", CHUNKS)
def test_bad_text_names_every_sample_that_is_not_utf8_once(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_module, "VALUE_CHUNK_BYTES", chunk)
    for blob, offsets in _text_cases():
        got = list(verify_module._bad_text(np.frombuffer(blob, np.uint8), np.array(offsets, dtype=np.uint64)))
        assert got == reference_bad_text(blob, offsets), (blob, offsets)


def test_a_character_cut_between_two_samples_is_found_in_a_two_sample_group() -> None:
    check = "✓".encode()
    got = list(verify_module._bad_text(np.frombuffer(check, np.uint8), np.array([0, 2, 3], dtype=np.uint64)))
    assert got == [(0, "unexpected end of data at byte 0 of its 2"), (1, "invalid start byte at byte 0 of its 1")]


def reference_unsorted(ids: np.ndarray, offsets: list[int]) -> list[int]:
    found = []
    for sample in range(len(offsets) - 1):
        own = ids[offsets[sample] // 8:offsets[sample + 1] // 8]
        if np.any(own[1:] <= own[:-1]):
            found.append(sample)
    return found


@pytest.mark.parametrize("chunk", CHUNKS)
def test_unsorted_sets_match_the_reference(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_module, "VALUE_CHUNK_BYTES", chunk)
    rng = np.random.default_rng(11)
    cases = [([], [0, 0]), ([5], [0, 8]), ([3, 1], [0, 16]), ([9, 1, 2], [0, 8, 24]),  # a drop across samples is fine
             ([1, 2], [0, 0, 0, 16]), ([4, 4], [0, 0, 16]), ([1], [0, 8, 8, 8]),
             ([1, 5, 2, 3, 0, 7, 7], [0, 8, 16, 16, 24, 40, 56])]
    cases = [(np.array(ids, "<i8"), offsets) for ids, offsets in cases]
    for _ in range(20):
        offsets = random_offsets(rng, int(rng.integers(1, 10)), 8, 4)
        ids = np.sort(rng.integers(0, 50, int(offsets[-1]) // 8)).astype("<i8")  # sorted across samples
        for _ in range(int(rng.integers(0, 3))):  # a few spoiled pairs
            if len(ids) > 1:
                k = int(rng.integers(1, len(ids)))
                ids[k] = ids[k - 1] - int(rng.integers(0, 2))
        cases.append((ids, offsets.tolist()))
    for ids, offsets in cases:
        blob = np.frombuffer(ids.tobytes(), np.uint8)
        got = list(verify_module._unsorted_sets(blob, np.array(offsets, dtype=np.uint64)))
        assert got == reference_unsorted(ids, offsets), (ids.tolist(), offsets)


def reference_bad_bools(blob: np.ndarray, offsets: list[int] | None, record: int) -> list[int]:
    if offsets is None:
        return [s for s in range(len(blob) // record) if np.any(blob[s * record:(s + 1) * record] > 1)]
    return [s for s in range(len(offsets) - 1) if np.any(blob[offsets[s]:offsets[s + 1]] > 1)]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_bad_bools_match_the_reference(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_module, "VALUE_CHUNK_BYTES", chunk)
    rng = np.random.default_rng(5)
    fixed = [(np.array([2, 0, 0], np.uint8), 1), (np.array([0, 1, 2], np.uint8), 1),  # first, last sample
             (np.array([2, 3, 0, 1, 1, 0], np.uint8), 2),  # both bytes of one record: one sample
             (np.array([0, 0, 0, 0, 0, 255], np.uint8), 3), (np.zeros(0, np.uint8), 2)]
    variable = [(np.array([2], np.uint8), [0, 1]), (np.array([0, 0, 2], np.uint8), [0, 2, 2, 3]),
                (np.array([1, 2, 1, 1, 2], np.uint8), [0, 0, 3, 5]), (np.zeros(0, np.uint8), [0, 0, 0])]
    for _ in range(15):
        record = int(rng.integers(1, 4))
        blob = rng.choice(np.array([0, 1, 1, 0, 0, 0, 2, 0x80], np.uint8), record * int(rng.integers(0, 9)))
        fixed.append((blob, record))
        offsets = random_offsets(rng, int(rng.integers(1, 9)), 1, 3)
        variable.append((rng.choice(np.array([0, 1, 0, 0, 2, 0xFF], np.uint8), int(offsets[-1])), offsets.tolist()))
    for blob, record in fixed:
        assert list(verify_module._bad_bools(blob, None, record)) == reference_bad_bools(blob, None, record), blob
    for blob, offsets in variable:
        got = list(verify_module._bad_bools(blob, np.array(offsets, dtype=np.uint64), 1))
        assert got == reference_bad_bools(blob, offsets, 1), (blob, offsets)


# --- verify on a dataset with value fields and a JPEG image field ---------------------------------


CLASSES = [f"c{i:02d}" for i in range(20)]


#: class sets of 17 ids (more than a message lists), 16 (exactly as many), none, and a few
TAGS = [CLASSES[:17], CLASSES[:16], [], CLASSES[:2], CLASSES[3:6], CLASSES[:2]]


VALUE_FIELDS = ("aux=image", "tags=classes", "caption=text", "flag=bool", "pair=bool[2]", "flags=bool[N]")  # the image first


@pytest.fixture(scope="module")
def value_fields_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 JPEGs in 6 shards, with class sets, text, three kinds of bool field and a JPEG image field."""
    root = tmp_path_factory.mktemp("verify-kills-fields")
    (root / "src" / "img").mkdir(parents=True)
    rows = []
    for i, tags in enumerate(TAGS):
        for name, value in [(f"{i}.jpg", 20 * i), (f"{i}.aux.jpg", 7 * i)]:
            Image.fromarray(np.full((8 + i, 12, 3), value, np.uint8)).save(root / "src" / "img" / name, quality=90)
        rows.append({"path": f"img/{i}.jpg", "tags": tags, "caption": f"caption {i} ✓", "flag": bool(i % 2),
                     "pair": [bool(i % 2), bool(i % 3)], "flags": [True, False, True][:i % 4],
                     "aux": f"img/{i}.aux.jpg"})
    manifest = root / "src" / "rows.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    build(manifest, root / "ds", BuildOptions(fields=VALUE_FIELDS, shard_size=4096, seed=0, alignment=4096), workers=1, progress=False)
    return root / "ds"


@pytest.fixture
def value_fields_dataset(value_fields_base: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(value_fields_base, tmp_path / "ds"))


def _where(folder: Path, sample: int) -> dict[str, Any]:
    with open_index(folder) as index:
        return {"sample": sample, "shard": index.shard_of(sample), "key": index.key(sample),
                "path": index.manifest.index.path}


def _field_problem(folder: Path, field: str, sample: int, message: str) -> dict[str, Any]:
    return {"kind": "field", "message": f"field {field!r}: {message}", "field": field, "sample_range": None,
            **_where(folder, sample)}


def test_intact_fixture_verifies(value_fields_base: Path) -> None:
    report = verify(value_fields_base, workers=1, decode=True)
    assert report.ok, report.problems
    assert report.fields["tags"] == {"kind": "classes", "samples_checked": 6, "problems": 0}


def test_unsorted_class_sets_are_named_with_their_stored_ids(value_fields_dataset: Path) -> None:
    """The message lists a set's first 16 ids, and ' ...' when it holds more."""
    damaged: dict[int, list[int]] = {}

    def change(columns: dict[str, np.ndarray]) -> None:
        offsets = columns["f_tags__offsets"].astype(np.int64)
        ids = columns["f_tags"].view("<i8")
        for sample in range(len(offsets) - 1):
            own = ids[offsets[sample] // 8:offsets[sample + 1] // 8]
            if len(own) >= 2:
                own[:] = own[::-1].copy()
                damaged[sample] = own.tolist()

    rewrite_index(value_fields_dataset, change)
    assert sorted(len(ids) for ids in damaged.values()) == [2, 2, 3, 16, 17]
    with open_index(value_fields_dataset) as index:
        sizes = np.diff(index.index.field_columns["f_tags__offsets"].astype(np.int64)).tolist()
    assert sizes[-1] > 0 and 0 in sizes  # the last sample is among the damaged; an empty one is not
    report = verify(value_fields_dataset, workers=1)
    expected = [_field_problem(value_fields_dataset, "tags", sample, f"class ids {ids[:16]}{' ...' if len(ids) > 16 else ''} are "
                               f"not sorted ascending without repeats, as a writer must store them")
                for sample, ids in sorted(damaged.items())]
    assert [p.to_json() for p in report.problems] == expected
    assert report.fields["tags"]["problems"] == 5 and report.unlisted == 0


def test_bad_bool_bytes_in_every_kind_of_bool_field(value_fields_dataset: Path) -> None:
    """A scalar flag of the first sample, both bytes of one pair, a 2 in the last variable set."""
    with open_index(value_fields_dataset) as index:
        flags_offsets = index.index.field_columns["f_flags__offsets"].astype(np.int64)
    last_set = max(s for s in range(6) if flags_offsets[s + 1] > flags_offsets[s])

    def change(columns: dict[str, np.ndarray]) -> None:
        columns["f_flag"][0] = 2
        columns["f_pair"][6:8] = [2, 3]  # sample 3's record
        columns["f_flags"][int(flags_offsets[last_set + 1]) - 1] = 2

    rewrite_index(value_fields_dataset, change)
    report = verify(value_fields_dataset, workers=1)
    message = "a bool value is stored as a byte other than 0 or 1"
    assert [p.to_json() for p in report.problems] == [
        _field_problem(value_fields_dataset, "flag", 0, message), _field_problem(value_fields_dataset, "pair", 3, message),
        _field_problem(value_fields_dataset, "flags", last_set, message)]
    assert [report.fields[name]["problems"] for name in ("flag", "pair", "flags")] == [1, 1, 1]


@pytest.mark.parametrize("damaged", [3, 4, 6])
def test_value_problems_past_the_cap_are_one_summary(value_fields_dataset: Path, monkeypatch: pytest.MonkeyPatch,
                                                     damaged: int) -> None:
    def change(columns: dict[str, np.ndarray]) -> None:
        columns["f_flag"][:damaged] = 7

    rewrite_index(value_fields_dataset, change)
    monkeypatch.setattr(verify_module, "MAX_VALUE_PROBLEMS", 2)
    report = verify(value_fields_dataset, workers=1)
    message = "a bool value is stored as a byte other than 0 or 1"
    with open_index(value_fields_dataset) as index:
        where = index.manifest.index.path
    summary = {"kind": "field", "field": "flag", "sample": None, "shard": None, "key": None, "path": where,
               "sample_range": None, "message": f"field 'flag': {damaged - 2} more sample(s) with the same kind of "
                                                f"damage, not listed (the first 2 are)"}
    assert [p.to_json() for p in report.problems] == [_field_problem(value_fields_dataset, "flag", 0, message),
                                                      _field_problem(value_fields_dataset, "flag", 1, message), summary]
    assert report.unlisted == damaged - 2 and report.damaged_sample_count == damaged
    assert report.fields["flag"]["problems"] == damaged


def _payload_place(folder: Path, sample: int, field: str | None) -> tuple[Path, int, int]:
    with open_index(folder) as index:
        shard = index.shard_of(sample)
        if field is None:
            return (folder / index.manifest.shards[shard].path, int(index.index.offset[sample]),
                    int(index.index.size[sample]))
        spec = index.field_spec(field)
        columns = index.index.field_columns
        return (folder / spec.shards[shard].path, int(columns[spec.image_column("offset")][sample]),
                int(columns[spec.image_column("size")][sample]))


def _spoil_soi_keeping_the_checksum(folder: Path, sample: int, field: str | None) -> bytes:
    """Zero a JPEG's start-of-image marker and record the spoilt payload's checksum in the index, so
    only decoding can tell."""
    path, offset, size = _payload_place(folder, sample, field)
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(b"\0\0")
        handle.seek(offset)
        payload = handle.read(size)
    column = "checksum" if field is None else f"f_{field}__checksum"

    def change(columns: dict[str, np.ndarray]) -> None:
        columns[column][sample] = xxhash.xxh3_64_intdigest(payload)

    rewrite_index(folder, change)
    return payload


def _decode_message(decoder: Any, payload: bytes) -> str:
    with pytest.raises(DecodeError) as caught:
        decoder(payload, fmt.ImageFormat.JPEG)
    return caught.value.message


def test_decode_uses_the_image_decoder_for_main_payloads_and_as_stored_for_fields(value_fields_dataset: Path) -> None:
    """Main images decode as readers decode them (simplejpeg first), field images as stored
    (Pillow, values kept): the two decoders word a broken JPEG differently."""
    main = _spoil_soi_keeping_the_checksum(value_fields_dataset, 1, None)
    aux = _spoil_soi_keeping_the_checksum(value_fields_dataset, 4, "aux")
    expected_main, expected_aux = _decode_message(decode_image, main), _decode_message(decode_as_stored, aux)
    assert "simplejpeg" in expected_main and "simplejpeg" not in expected_aux
    report = verify(value_fields_dataset, workers=1, decode=True)
    found = [(p.sample, p.field, p.message) for p in report.problems if p.kind == "decode"]
    assert found == [(1, None, expected_main), (4, "aux", expected_aux)]
    assert all(p.kind in ("decode", "shard-checksum") for p in report.problems)


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 0xFF]))


def _slow_main_shard_0(task: Any, on_progress: Any = None, buffer: Any = None) -> Any:
    if task.shard == 0 and not task.field:
        time.sleep(0.5)  # every other shard, main and field, is done by the other worker meanwhile
    return _REAL_SCAN_SHARD(task, on_progress, buffer)


@pytest.mark.parametrize("workers, slow", [(1, False), (3, False), (2, True)])
def test_shard_problems_are_ordered_by_shard_then_field(value_fields_dataset: Path, monkeypatch: pytest.MonkeyPatch,
                                                        workers: int, slow: bool) -> None:
    """By shard, and within a shard the main shard's before its image fields', whatever order the
    workers finish in."""
    for sample, field in [(2, "aux"), (1, None), (0, "aux"), (0, None)]:
        path, offset, size = _payload_place(value_fields_dataset, sample, field)
        _flip(path, offset + size // 2)
    with open_index(value_fields_dataset) as index:
        shards = [index.shard_of(s) for s in range(3)]
    assert shards == [0, 1, 2]
    if slow:
        monkeypatch.setattr(verify_module, "_scan_shard", _slow_main_shard_0)
    report = verify(value_fields_dataset, workers=workers)
    assert [(p.kind, p.shard, p.field, p.sample) for p in report.problems] == [
        ("checksum", 0, None, 0), ("shard-checksum", 0, None, None),
        ("checksum", 0, "aux", 0), ("shard-checksum", 0, "aux", None),
        ("checksum", 1, None, 1), ("shard-checksum", 1, None, None),
        ("checksum", 2, "aux", 2), ("shard-checksum", 2, "aux", None)]


def _die_on_the_first_aux_shard(task: Any, on_progress: Any = None, buffer: Any = None) -> Any:
    if task.field == "aux" and task.shard == 0:
        os._exit(3)  # what an out-of-memory kill looks like to the pool
    return _REAL_SCAN_SHARD(task, on_progress, buffer)


def test_a_dying_worker_on_a_field_shard_names_the_field(value_fields_base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool breaks, so other shards may be reported dead too; each dead field shard's problem
    names the field and counts in that field's line of the report."""
    monkeypatch.setattr(verify_module, "_scan_shard", _die_on_the_first_aux_shard)
    report = verify(value_fields_base, workers=2)
    with open_index(value_fields_base) as index:
        aux_path = index.field_spec("aux").shards[0].path
        main_paths = {s.path for s in index.manifest.shards}
    [dead] = [p for p in report.problems if p.path == aux_path]
    assert (dead.kind, dead.shard, dead.field, dead.sample) == ("io", 0, "aux", None)
    assert dead.message.startswith("the process checking this shard died (")
    assert report.fields["aux"]["problems"] == sum(p.field == "aux" for p in report.problems)
    assert all(p.field is None for p in report.problems if p.path in main_paths)
    assert report.shards_checked == 6 - sum(p.path in main_paths for p in report.problems)


def test_workers_are_forked_so_an_unguarded_script_runs_once(value_fields_base: Path, tmp_path: Path) -> None:
    """No ``if __name__ == "__main__"`` guard: spawned workers would re-run the script."""
    script = tmp_path / "unguarded.py"
    script.write_text("import sys\nfrom packer.verify import verify\n"
                      f"report = verify({str(value_fields_base)!r}, workers=2)\n"
                      "print('RAN', report.ok, len(report.problems))\n", "utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ["RAN True 0", ""]
