"""Mutation kill tests for packer/verify.py: field shards and value fields.

Written after the declared fields (SPEC §14) landed: each pins down behaviour that a surviving
mutant of `scripts/mutate.py` changed. `tests/project/test_mutation_kills.py` holds the ones from before.
"""

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
from PIL import Image

import packer.verify as verify_module
from packer import format as fmt
from packer.writer import BuildOptions, build
from packer.dataset import open_index
from packer.decode import decode_as_stored, decode_image
from packer.errors import DecodeError
from packer.verify import verify
from helpers import rewrite_index

_REAL_SCAN_SHARD = verify_module._scan_shard

# --- the value checks, against references written from their docstrings ----------------------------

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


# --- verify on a dataset with value fields and a JPEG image field --------------------------------------

CLASSES = [f"c{i:02d}" for i in range(20)]
#: class sets of 17 ids (more than a message lists), 16 (exactly as many), none, and a few
TAGS = [CLASSES[:17], CLASSES[:16], [], CLASSES[:2], CLASSES[3:6], CLASSES[:2]]
FIELDS = ("aux=image", "tags=classes", "caption=text", "flag=bool", "pair=bool[2]", "flags=bool[N]")  # the image first


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
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
    build(manifest, root / "ds", BuildOptions(fields=FIELDS, shard_size=4096, seed=0), workers=1, progress=False)
    return root / "ds"


@pytest.fixture
def dataset(base: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(base, tmp_path / "ds"))


def _where(folder: Path, sample: int) -> dict[str, Any]:
    with open_index(folder) as index:
        return {"sample": sample, "shard": index.shard_of(sample), "key": index.key(sample),
                "path": index.manifest.index.path}


def _field_problem(folder: Path, field: str, sample: int, message: str) -> dict[str, Any]:
    return {"kind": "field", "message": f"field {field!r}: {message}", "field": field, "sample_range": None,
            **_where(folder, sample)}


def test_intact_fixture_verifies(base: Path) -> None:
    report = verify(base, workers=1, decode=True)
    assert report.ok, report.problems
    assert report.fields["tags"] == {"kind": "classes", "samples_checked": 6, "problems": 0}


def test_unsorted_class_sets_are_named_with_their_stored_ids(dataset: Path) -> None:
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

    rewrite_index(dataset, change)
    assert sorted(len(ids) for ids in damaged.values()) == [2, 2, 3, 16, 17]
    with open_index(dataset) as index:
        sizes = np.diff(index.index.field_columns["f_tags__offsets"].astype(np.int64)).tolist()
    assert sizes[-1] > 0 and 0 in sizes  # the last sample is among the damaged; an empty one is not
    report = verify(dataset, workers=1)
    expected = [_field_problem(dataset, "tags", sample, f"class ids {ids[:16]}{' ...' if len(ids) > 16 else ''} are "
                               f"not sorted ascending without repeats, as a writer must store them")
                for sample, ids in sorted(damaged.items())]
    assert [p.to_json() for p in report.problems] == expected
    assert report.fields["tags"]["problems"] == 5 and report.unlisted == 0


def test_bad_bool_bytes_in_every_kind_of_bool_field(dataset: Path) -> None:
    """A scalar flag of the first sample, both bytes of one pair, a 2 in the last variable set."""
    with open_index(dataset) as index:
        flags_offsets = index.index.field_columns["f_flags__offsets"].astype(np.int64)
    last_set = max(s for s in range(6) if flags_offsets[s + 1] > flags_offsets[s])

    def change(columns: dict[str, np.ndarray]) -> None:
        columns["f_flag"][0] = 2
        columns["f_pair"][6:8] = [2, 3]  # sample 3's record
        columns["f_flags"][int(flags_offsets[last_set + 1]) - 1] = 2

    rewrite_index(dataset, change)
    report = verify(dataset, workers=1)
    message = "a bool value is stored as a byte other than 0 or 1"
    assert [p.to_json() for p in report.problems] == [
        _field_problem(dataset, "flag", 0, message), _field_problem(dataset, "pair", 3, message),
        _field_problem(dataset, "flags", last_set, message)]
    assert [report.fields[name]["problems"] for name in ("flag", "pair", "flags")] == [1, 1, 1]


@pytest.mark.parametrize("damaged", [3, 4, 6])
def test_value_problems_past_the_cap_are_one_summary(dataset: Path, monkeypatch: pytest.MonkeyPatch,
                                                     damaged: int) -> None:
    def change(columns: dict[str, np.ndarray]) -> None:
        columns["f_flag"][:damaged] = 7

    rewrite_index(dataset, change)
    monkeypatch.setattr(verify_module, "MAX_VALUE_PROBLEMS", 2)
    report = verify(dataset, workers=1)
    message = "a bool value is stored as a byte other than 0 or 1"
    with open_index(dataset) as index:
        where = index.manifest.index.path
    summary = {"kind": "field", "field": "flag", "sample": None, "shard": None, "key": None, "path": where,
               "sample_range": None, "message": f"field 'flag': {damaged - 2} more sample(s) with the same kind of "
                                                f"damage, not listed (the first 2 are)"}
    assert [p.to_json() for p in report.problems] == [_field_problem(dataset, "flag", 0, message),
                                                      _field_problem(dataset, "flag", 1, message), summary]
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


def test_decode_uses_the_image_decoder_for_main_payloads_and_as_stored_for_fields(dataset: Path) -> None:
    """Main images decode as readers decode them (simplejpeg first), field images as stored
    (Pillow, values kept): the two decoders word a broken JPEG differently."""
    main = _spoil_soi_keeping_the_checksum(dataset, 1, None)
    aux = _spoil_soi_keeping_the_checksum(dataset, 4, "aux")
    expected_main, expected_aux = _decode_message(decode_image, main), _decode_message(decode_as_stored, aux)
    assert "simplejpeg" in expected_main and "simplejpeg" not in expected_aux
    report = verify(dataset, workers=1, decode=True)
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
def test_shard_problems_are_ordered_by_shard_then_field(dataset: Path, monkeypatch: pytest.MonkeyPatch,
                                                        workers: int, slow: bool) -> None:
    """By shard, and within a shard the main shard's before its image fields', whatever order the
    workers finish in."""
    for sample, field in [(2, "aux"), (1, None), (0, "aux"), (0, None)]:
        path, offset, size = _payload_place(dataset, sample, field)
        _flip(path, offset + size // 2)
    with open_index(dataset) as index:
        shards = [index.shard_of(s) for s in range(3)]
    assert shards == [0, 1, 2]
    if slow:
        monkeypatch.setattr(verify_module, "_scan_shard", _slow_main_shard_0)
    report = verify(dataset, workers=workers)
    assert [(p.kind, p.shard, p.field, p.sample) for p in report.problems] == [
        ("checksum", 0, None, 0), ("shard-checksum", 0, None, None),
        ("checksum", 0, "aux", 0), ("shard-checksum", 0, "aux", None),
        ("checksum", 1, None, 1), ("shard-checksum", 1, None, None),
        ("checksum", 2, "aux", 2), ("shard-checksum", 2, "aux", None)]


def _die_on_the_first_aux_shard(task: Any, on_progress: Any = None, buffer: Any = None) -> Any:
    if task.field == "aux" and task.shard == 0:
        os._exit(3)  # what an out-of-memory kill looks like to the pool
    return _REAL_SCAN_SHARD(task, on_progress, buffer)


def test_a_dying_worker_on_a_field_shard_names_the_field(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool breaks, so other shards may be reported dead too; each dead field shard's problem
    names the field and counts in that field's line of the report."""
    monkeypatch.setattr(verify_module, "_scan_shard", _die_on_the_first_aux_shard)
    report = verify(base, workers=2)
    with open_index(base) as index:
        aux_path = index.field_spec("aux").shards[0].path
        main_paths = {s.path for s in index.manifest.shards}
    [dead] = [p for p in report.problems if p.path == aux_path]
    assert (dead.kind, dead.shard, dead.field, dead.sample) == ("io", 0, "aux", None)
    assert dead.message.startswith("the process checking this shard died (")
    assert report.fields["aux"]["problems"] == sum(p.field == "aux" for p in report.problems)
    assert all(p.field is None for p in report.problems if p.path in main_paths)
    assert report.shards_checked == 6 - sum(p.path in main_paths for p in report.problems)


def test_workers_are_forked_so_an_unguarded_script_runs_once(base: Path, tmp_path: Path) -> None:
    """No ``if __name__ == "__main__"`` guard: spawned workers would re-run the script."""
    script = tmp_path / "unguarded.py"
    script.write_text("import sys\nfrom packer.verify import verify\n"
                      f"report = verify({str(base)!r}, workers=2)\n"
                      "print('RAN', report.ok, len(report.problems))\n", "utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ["RAN True 0", ""]
